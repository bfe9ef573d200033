"""A sweep whose storage is an S3 bucket (SeaweedFS on loopback, the ``s3`` fixture): resumed
from the bucket alone, reading its prepared data from the bucket, waiting out the store down.

Killed with its Ray while trial 2 is mid-run, its head node's local folders deleted (its working
folder, Ray's session folders, the temp folder the workers stage checkpoints in: what a lost
head node loses), it resumes from the bucket alone: trial 1 stays finished, trial 2 continues
from its last checkpoint in the bucket, one MLflow run per trial, and the best trial exports
from its checkpoint in the bucket. MLflow is a tracking server (its own disk, not the head
node's) whose artifact root is the same store (``--artifacts-destination s3://...``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient

from recsys.runtime import storage
from recsys.train.reporting import read_report
from tests.ray.killing import (
    LOG_EVERY,
    MID_RUN,
    STEPS,
    check_resumed,
    kill_space,
    start_sweep,
    sweep_cmd,
    trial_runs,
    wait_for_mid_run,
)
from tests.servers import MlflowServer

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def head_node() -> tuple[str, dict[str, str]]:
    """A fresh local folder standing for the head node's disk: the sweep's working folder, and
    Ray's and the temp folder's environment pointing into it (short: Ray's sockets live there)."""
    head = tempfile.mkdtemp(prefix="rs3-", dir="/tmp")
    os.makedirs(os.path.join(head, "work"))
    return head, {"RAY_TMPDIR": head, "TMPDIR": head}


def lose(head: str) -> None:
    """SIGKILL every process left that runs from the head node's folder (those of the killed
    sweep's Ray that started sessions of their own), and wait until they are gone."""
    deadline = time.time() + 60
    while time.time() < deadline:
        left = [pid for pid in running_from(head) if pid != os.getpid()]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    raise AssertionError(f"processes still running from {head}: {running_from(head)}")


def running_from(head: str) -> list[int]:
    """The processes whose environment or command line names ``head`` (every process the sweep
    started inherits its RAY_TMPDIR and TMPDIR), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for part in ("environ", "cmdline"):
            with contextlib.suppress(OSError), open(f"/proc/{entry}/{part}", "rb") as f:
                if head.encode() in f.read():
                    found.append(int(entry))
                    break
    return found


def test_a_sweep_on_s3_resumes_from_the_bucket_alone(tmp_path, s3):
    space = kill_space(tmp_path)
    server = MlflowServer(f"sqlite:///{tmp_path / 'mlflow.db'}", storage.join(s3, "mlflow"))
    uri = server.start().uri
    try:
        run_kill_and_resume(space, uri, s3)
    finally:
        server.stop()


def run_kill_and_resume(space: str, uri: str, s3: str) -> None:
    sweeps = storage.join(s3, "sweeps")
    client = MlflowClient(uri)
    head, env = head_node()
    first = start_sweep(space, sweeps, uri, cwd=os.path.join(head, "work"), **env, **MID_RUN)
    try:
        wait_for_mid_run(client, first)
        first_finished = trial_runs(client)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its Ray
        first.wait()
    lose(head)
    stale = trial_runs(client)[1]
    assert stale.info.status == "RUNNING"
    assert storage.exists(storage.join(sweeps, "kill", "sweep.json"))
    assert os.listdir(os.path.join(head, "work")) == [], "nothing of the sweep's on local disk"
    shutil.rmtree(head)

    head, env = head_node()
    try:
        resumed = subprocess.run(
            sweep_cmd(space, sweeps, uri, "--resume", "--export", "int8"),
            capture_output=True, text=True, timeout=600, cwd=os.path.join(head, "work"),
            env={**os.environ, **env},
        )  # fmt: skip
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out[-3000:]
        check_resumed(client, first_finished, stale, out)
        for run in trial_runs(client):
            best = run.data.tags["checkpoint.best"]
            assert best.startswith(storage.join(sweeps, "kill", "train", "")), best
            assert storage.exists(storage.join(best, ".metadata"))
            assert read_report(best)["step"] > 0  # its report, uploaded with it
        assert os.path.isfile(os.path.join(head, "work", "exports", "kill", "model.pt"))
        assert "exported the best trial" in out
        for run in trial_runs(client):  # the artifacts went through the server into the store
            folder = storage.join(s3, "mlflow", run.info.experiment_id, run.info.run_id)
            assert storage.exists(storage.join(folder, "artifacts", "config.yaml"))
    finally:
        shutil.rmtree(head, ignore_errors=True)


@pytest.mark.extended  # (each rank reading the store: tests/unit/test_remote_data.py)
def test_a_sweep_reads_its_prepared_data_from_the_store(tmp_path, s3):
    """``--data s3://...``: a folder prepared into the bucket trains on 2 workers, each reading
    through the node's cache of its shards, and the best trial exports from it."""
    import json
    import sys

    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare
    from tests.conftest import SCHEMA, write_demo
    from tests.ray.killing import ROOT

    raw = [write_demo(str(tmp_path / f"raw{k}"), rows=3000, files=1, seed=k)[0] for k in range(3)]
    data = storage.join(s3, "prepared")
    prepare(DatasetSchema.load(SCHEMA), raw, data, workers=0, log=lambda s: None)
    head, env = head_node()
    try:
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--space",
             "clicklogs", "--smoke-test", "--data", data, "--storage", storage.join(s3, "sweeps"),
             "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--num-samples", "1",
             "--num-workers", "2", "--cpus-per-worker", "0.9", "--confirm", "0",
             "--export", "int8"],
            capture_output=True, text=True, timeout=900, cwd=os.path.join(head, "work"),
            env={**os.environ, **env},
        )  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        assert "exported the best trial" in out
        root = os.path.join(head, "recsys-data-cache")
        (folder,) = [os.path.join(root, n) for n in os.listdir(root) if not n.endswith(".lock")]
        with open(os.path.join(folder, "meta.json")) as f:
            assert json.load(f)["cache"] == {"source": data}
        cached = [n for n in os.listdir(os.path.join(folder, "train")) if n.endswith(".cached")]
        assert cached, "the workers read their shards from the cache"
        assert os.path.isdir(os.path.join(folder, "vocab")), "the export cached what serving needs"
    finally:
        lose(head)
        shutil.rmtree(head, ignore_errors=True)


@pytest.mark.extended  # (Ray's upload waiting out the store: tests/unit/test_storage.py)
def test_a_sweep_waits_out_the_store_down_for_30_s(tmp_path, s3, s3_server):
    """The store is taken down for 30 s once trial 1 has reported step 100: the workers'
    checkpoint uploads, Ray Train's controller state and Tune's experiment state are retried
    (one line per try), training goes on, and the sweep ends with both trials finished and
    every report in MLflow."""
    space = kill_space(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    log = tmp_path / "sweep.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            sweep_cmd(space, storage.join(s3, "sweeps"), uri),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.time() + 400
        while not any(r.data.metrics.get("step", 0) >= 100 for r in trial_runs(client)):
            assert proc.poll() is None and time.time() < deadline, "trial 1 never reached 100"
            time.sleep(0.3)
        s3_server.stop()
        time.sleep(30)
        s3_server.start()
        proc.wait(timeout=600)
    finally:
        s3_server.start()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # (only left when the test failed)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert "; retry in 2 s" in out and "NETWORK_CONNECTION" in out
    runs = trial_runs(client)
    assert len(runs) == 2 and all(r.data.tags["recsys.status"] == "finished" for r in runs), out
    for run in runs:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert steps == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
