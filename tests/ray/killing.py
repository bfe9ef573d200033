"""What the kill-and-resume tests share: the sweep they kill, its MLflow runs, the waits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from recsys.train.worker import HOLD_ENV, HOLD_SEED_ENV, HOLD_STEP_ENV
from tests.ray.spaces import write_space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, LOG_EVERY = 600, 50  # trial 2 is killed after its step-200 checkpoint
HELD_AT = 200
# trial 2 (seed 2) waits after its checkpoint of step HELD_AT until it is killed, so the kill
# finds it mid-run on a machine of any speed (recsys.train.worker.hold)
MID_RUN = {HOLD_ENV: "600", HOLD_SEED_ENV: "2", HOLD_STEP_ENV: str(HELD_AT)}


def kill_space(folder: Path) -> str:
    """Two trials of STEPS steps (``train.seed`` 1, then 2), a checkpoint every 100 and a report
    every LOG_EVERY."""
    space = Path(write_space(folder, steps=STEPS))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 100")
    text = text.replace("train.log_every: 5", f"train.log_every: {LOG_EVERY}")
    text = text.replace("{grid: [fp32, fp16]}", "{choice: [fp32]}")
    text = text.replace("space:\n", "space:\n  train.seed: {grid: [1, 2]}\n")
    space.write_text(text.replace("{choice: [null, 500]}", "{choice: [500]}"))
    return str(space)


def sweep_cmd(space: str, storage: str, uri: str, *extra: str) -> list[str]:
    """The sweep named "kill" of one trial on one worker (the driver is what gets killed)."""
    return [
        sys.executable,
        os.path.join(ROOT, "experiments", "sweep.py"),
        "--space", space,
        "--name", "kill",
        "--storage", storage,
        "--tracking-uri", uri,
        "--num-samples", "1",
        "--num-workers", "1", "--cpus-per-worker", "1.5",  # the driver is what gets killed
        *extra,
    ]  # fmt: skip


def start_sweep(
    space: str, storage: str, uri: str, cwd: str | None = None, **env: str
) -> subprocess.Popen:
    """The sweep in a session of its own (so the test can kill it and its Ray), output dropped."""
    return subprocess.Popen(
        sweep_cmd(space, storage, uri),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env},
        cwd=cwd,
    )


def trial_runs(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("kill")
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`recsys.kind` = 'trial'")
    return sorted(runs, key=lambda r: r.info.start_time)


def wait_for_mid_run(client: MlflowClient, proc: subprocess.Popen, timeout: float = 400) -> None:
    """Until trial 1 has finished and trial 2 has logged its report of step ``HELD_AT`` (the
    sweep started with ``MID_RUN``'s hold: trial 2 waits there)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        runs = trial_runs(client)
        if len(runs) == 2 and runs[0].info.status == "FINISHED":
            step = runs[1].data.metrics.get("step", 0)
            assert step <= HELD_AT, f"trial 2 went on past its hold at step {HELD_AT}: {step}"
            if step == HELD_AT:
                return
        time.sleep(0.3)
    raise AssertionError("trial 2 never got mid-run")


def runs_of(client: MlflowClient, kind: str) -> list:
    exp = client.get_experiment_by_name("kill")
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`recsys.kind` = '{kind}'")


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str) -> None:
    """Wait until ``ready()``, then SIGKILL the sweep's whole session (driver and its Ray)."""
    try:
        deadline = time.time() + 400
        while not ready():
            assert proc.poll() is None and time.time() < deadline, f"never got to: {what}"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def check_resumed(client: MlflowClient, first_finished: Any, stale: Any, out: str) -> None:
    """After the resume: one MLflow run per trial (the stale RUNNING one reused), both finished;
    trial 1 was not re-run (its history unchanged); trial 2 continued from its checkpoint (every
    logged step exactly once, no gap, no restart)."""
    runs = trial_runs(client)
    assert len(runs) == 2, "exactly one MLflow run per trial"
    assert runs[1].info.run_id == stale.info.run_id
    assert all(r.info.status == "FINISHED" for r in runs)
    done = client.get_metric_history(first_finished.info.run_id, "loss")
    assert len(done) == STEPS // LOG_EVERY
    steps = [m.step for m in client.get_metric_history(runs[1].info.run_id, "loss")]
    assert steps == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert "resumed from step" in out
    assert "best trials" in out
