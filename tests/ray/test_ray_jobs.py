"""The sweep as a Ray Job: ``ray job submit --address http://HEAD:DASHBOARD -- python
experiments/sweep.py ...`` against a real head (``ray start --head``, its dashboard and job
agent). The job's driver finds its cluster by the ``RAY_ADDRESS`` Ray's job supervisor sets and
says so; the job's logs are the sweep's console; ``ray job stop`` ends the sweep, and a second job
with ``--resume`` continues it to the end with one MLflow run per trial.

The first job ships the repository as its ``working_dir`` (``--runtime-env-json``); the second
runs the project as installed on the node (the venv's python, no runtime environment).
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from recsys.train.worker import HOLD_ENV, HOLD_STEP_ENV
from tests.ray.spaces import write_space
from tests.servers import AGENT_PORTS, agent_ports, free_port, stop_group

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.clusters]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = sys.executable  # the project's venv, as installed on the (only) node
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# variables that would point `ray job` (and its SDK) at another Ray than --address names: this
# suite's RAY_ADDRESS=local, the API server of a local Ray an earlier test started
OTHER_RAY = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RECSYS_LOCAL_RAY_API_SERVER")
# The head requires a token of its own, as a shared cluster does (Ray 2.60's `ray start --head`
# turns token authentication on by itself when ~/.ray/auth_token exists, which any earlier local
# Ray here wrote, and `ray job` then sends that token only with RAY_AUTH_MODE=token): the head and
# every `ray job` command get RAY_AUTH_MODE=token and this RAY_AUTH_TOKEN, the SDK's client it as
# its header; the job's driver inherits them from the head.
TOKEN = secrets.token_hex(32)
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
NAME, STEPS = "jobs", 60
EXCLUDES = [".venv", ".git", "mlflow.db", "runs", "data", "shared", "mlruns", "mlartifacts",
            ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__"]  # fmt: skip
JOB_TIMEOUT = 600


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment for a Ray command of the test's cluster."""
    env = {k: v for k, v in os.environ.items() if k not in (*OTHER_RAY, "RAY_AUTH_TOKEN_PATH")}
    return {**env, **AUTH, **extra}


@pytest.fixture(scope="module")
def head() -> Iterator[str]:
    """``ray start --head --block`` of 3 CPUs with its dashboard on 127.0.0.1, every port chosen
    here; its dashboard's URL (the Ray Jobs address). Its temp folder is its own (``ray start``
    writes ``ray_current_cluster`` there, which must not point this machine's later commands at
    the test's cluster; a short path: Ray's sockets live in it). Its workers run at nice 0, as a
    local Ray of the project's does (``recsys.runtime.cluster.local_system_config``): at Ray's
    default 15 a trial crawls next to anything else on 2 cores. It starts in the checkout with the
    venv first on PATH, as a user starts it: a job without a working_dir runs there."""
    temp = tempfile.mkdtemp(prefix="rj", dir="/tmp")
    dashboard = free_port()
    ports = [f"{AGENT_PORTS[name]}={port}" for name, port in agent_ports().items()]
    cmd = [RAY, "start", "--head", "--block", "--port", str(free_port()),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
           "--include-dashboard", "true", "--ray-client-server-port", str(free_port()),
           "--num-cpus", "3", "--object-store-memory", str(256 * 2**20), "--temp-dir", temp,
           "--disable-usage-stats", *ports]  # fmt: skip
    bin_dir = os.path.dirname(PYTHON)
    env = clean_env(RAY_USAGE_STATS_ENABLED="0", RAY_worker_niceness="0")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")  # the venv, as if activated
    log = Path(temp + ".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    url = f"http://127.0.0.1:{dashboard}"
    try:
        wait_for_jobs_api(url, proc, log)
        yield url
    finally:
        stop_group(proc, timeout=15)
        shutil.rmtree(temp, ignore_errors=True)
        log.unlink(missing_ok=True)


def client(url: str) -> Any:
    """The Ray Jobs SDK's client of ``url`` (with no variable overriding the address)."""
    from ray.job_submission import JobSubmissionClient

    saved = {k: os.environ.pop(k) for k in OTHER_RAY if k in os.environ}
    try:
        return JobSubmissionClient(url, headers={"Authorization": f"Bearer {TOKEN}"})
    finally:
        os.environ.update(saved)


def wait_for_jobs_api(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    error: Exception | None = None
    while time.time() < deadline and proc.poll() is None:
        try:
            client(url).list_jobs()
            return
        except Exception as e:  # not up yet: connection refused, 5xx
            error = e
            time.sleep(1)
    raise RuntimeError(f"the head's job API never answered ({error}): {log.read_text()[-3000:]}")


def ray_job(url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``ray job <args> --address url``, as a user runs it."""
    cmd = [RAY, "job", args[0], "--address", url, *args[1:]]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT
    )
    assert done.returncode == 0, f"{shlex.join(cmd)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def sweep_cmd(space: str, tmp: Path, *extra: str) -> list[str]:
    """The sweep's command line (a job's entrypoint, run from the job's working directory): 2
    trials of 1 worker, no seed check."""
    return [
        PYTHON, "experiments/sweep.py", "--space", space, "--name", NAME,
        "--storage", str(tmp / "storage"), "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}",
        "--num-workers", "1", "--cpus-per-worker", "1", "--num-samples", "2", "--confirm", "0",
        *extra,
    ]  # fmt: skip


def jobs_space(folder: Path) -> str:
    """The tests' tiny space without its grid (so ``--num-samples`` trials) and no baselines."""
    path = Path(write_space(folder, steps=STEPS))
    text = path.read_text()
    assert "baselines" not in text
    lines = [line for line in text.splitlines() if "grid:" not in line]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def wait_until(ready: Callable[[], bool], url: str, job: str, what: str) -> None:
    """Poll ``ready()`` while the job runs; fail with its logs if it ends first or times out."""
    deadline = time.time() + JOB_TIMEOUT
    jobs = client(url)
    while not ready():
        status = str(jobs.get_job_status(job))
        if status.endswith(("SUCCEEDED", "FAILED", "STOPPED")) or time.time() > deadline:
            logs = jobs.get_job_logs(job)
            raise AssertionError(f"job {job} {status} before {what}:\n{logs[-5000:]}")
        time.sleep(0.5)


def wait_for_end(url: str, job: str) -> str:
    """The job's final status, once it has one."""
    jobs = client(url)
    deadline = time.time() + JOB_TIMEOUT
    while time.time() < deadline:
        status = str(jobs.get_job_status(job)).rsplit(".", 1)[-1]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status
        time.sleep(1)
    raise AssertionError(f"job {job} still running: {jobs.get_job_logs(job)[-5000:]}")


def trial_runs(uri: str) -> list:
    mlflow = MlflowClient(uri)
    exp = mlflow.get_experiment_by_name(NAME)
    if exp is None:
        return []
    return mlflow.search_runs([exp.experiment_id], filter_string="tags.`recsys.kind` = 'trial'")


def stoppable(tmp: Path, uri: str) -> Callable[[], bool]:
    """Ready to stop: a trial reported step 20 and Tune saved its state (what a resume reads).
    A trial of STEPS steps trains in about a second here, so the first job's trials hold after
    their step-20 checkpoint (``RECSYS_TEST_HOLD_AT_STEP``): the stop falls inside one."""

    def ready() -> bool:
        if not glob.glob(str(tmp / "storage" / NAME / "experiment_state*.json")):
            return False
        if not (tmp / "mlflow.db").exists():
            return False
        return any(r.data.metrics.get("step", 0) >= 20 for r in trial_runs(uri))

    return ready


def test_a_sweep_runs_as_a_job_is_stopped_and_resumes_as_another(head, tmp_path):
    space = jobs_space(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    jobs = client(head)

    # 1. the repository shipped as the job's working_dir; stopped mid-sweep: each trial holds
    # after its step-20 checkpoint (the job's env), so the stop falls inside one
    first = f"jobs-{uuid.uuid4().hex[:8]}"
    hold = {HOLD_ENV: "600", HOLD_STEP_ENV: "20"}
    runtime_env = json.dumps({"working_dir": ROOT, "excludes": EXCLUDES, "env_vars": hold})
    ray_job(head, "submit", "--no-wait", "--submission-id", first, "--runtime-env-json",
            runtime_env, "--", *sweep_cmd(space, tmp_path))  # fmt: skip
    wait_until(stoppable(tmp_path, uri), head, first, "a trial reached step 20")
    assert str(jobs.get_job_status(first)).endswith("RUNNING")
    ray_job(head, "stop", first)
    status = wait_for_end(head, first)
    logs = jobs.get_job_logs(first)
    assert status == "STOPPED", logs[-5000:]
    shipped = jobs.get_job_info(first).runtime_env.get("working_dir", "")
    assert shipped.startswith("gcs://"), shipped  # the checkout, uploaded to the head
    assert "joined the Ray cluster at" in logs and "(from RAY_ADDRESS)" in logs, logs[-5000:]
    assert f"starting sweep '{NAME}'" in logs, logs[-5000:]
    assert "trial 00000 started:" in logs, logs[-5000:]  # the sweep's progress lines
    stopped = trial_runs(uri)
    assert len(stopped) < 2 or any(r.info.status != "FINISHED" for r in stopped), "not stopped"

    # 2. the project as installed on the node (no runtime env): --resume, to the end
    second = f"jobs-{uuid.uuid4().hex[:8]}"
    ray_job(head, "submit", "--no-wait", "--submission-id", second, "--",
            *sweep_cmd(space, tmp_path, "--resume"))  # fmt: skip
    status = wait_for_end(head, second)
    logs = jobs.get_job_logs(second)
    assert status == "SUCCEEDED", logs[-5000:]
    assert "(from RAY_ADDRESS)" in logs, logs[-5000:]
    assert not jobs.get_job_info(second).runtime_env, "no runtime env: the node's own install"
    assert f"resuming sweep '{NAME}'" in logs, logs[-5000:]
    assert "best trials" in logs, logs[-5000:]
    runs = trial_runs(uri)
    ids = [r.data.tags.get("recsys.trial_id") for r in runs]
    assert len(runs) == 2 and len(set(ids)) == 2, f"one MLflow run per trial: {ids}"
    assert all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    assert all(r.data.metrics.get("step") == STEPS for r in runs)
