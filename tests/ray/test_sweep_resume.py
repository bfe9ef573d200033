"""Kill the sweep driver (SIGKILL) after trial 1 finished and while trial 2 is mid-run; resume.

Trial 1 is not re-run, trial 2 continues from its checkpoint, every trial ends, and MLflow has
exactly one run per trial with a continuous, duplicate-free step axis. A second case kills the
sweep exactly after a trial's last checkpoint and before Tune recorded the trial as done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, LOG_EVERY = 600, 50  # trial 2 is killed between its step-200 report and step 600


def sweep_cmd(space: str, tmp, *extra: str) -> list[str]:
    return [
        sys.executable,
        os.path.join(ROOT, "experiments", "sweep.py"),
        "--space", space,
        "--name", "kill",
        "--storage", str(tmp / "runs"),
        "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}",
        "--num-samples", "1",
        "--num-workers", "1", "--cpus-per-worker", "1.5",  # the driver is what gets killed
        *extra,
    ]  # fmt: skip


def start_sweep(space: str, tmp, **env: str) -> subprocess.Popen:
    """The sweep in a session of its own (so the test can kill it and its Ray), output dropped."""
    return subprocess.Popen(
        sweep_cmd(space, tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env},
    )


def trial_runs(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("kill")
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`recsys.kind` = 'trial'")
    return sorted(runs, key=lambda r: r.info.start_time)


def wait_for_mid_run(client: MlflowClient, proc: subprocess.Popen, timeout: float = 400) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        runs = trial_runs(client)
        if len(runs) == 2 and runs[0].info.status == "FINISHED":
            step = runs[1].data.metrics.get("step", 0)
            assert step < STEPS, "trial 2 finished before the kill; the test needs a slower trial"
            if step >= 200:
                return
        time.sleep(0.3)
    raise AssertionError("trial 2 never got mid-run")


def test_killed_driver_resumes(tmp_path):
    space = Path(write_space(tmp_path, steps=STEPS))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 100")
    text = text.replace("train.log_every: 5", f"train.log_every: {LOG_EVERY}")
    space.write_text(text.replace("{choice: [null, 500]}", "{choice: [500]}"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = start_sweep(str(space), tmp_path)
    try:
        wait_for_mid_run(client, first)
        first_finished = trial_runs(client)[0]
        os.kill(first.pid, signal.SIGKILL)  # the driver only; its Ray processes are orphaned
        first.wait()
        stale = trial_runs(client)[1]
        assert stale.info.status == "RUNNING"
        resumed = subprocess.run(
            sweep_cmd(str(space), tmp_path, "--resume"), capture_output=True, text=True, timeout=600
        )
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    runs = trial_runs(client)
    assert len(runs) == 2, "exactly one MLflow run per trial"
    assert runs[1].info.run_id == stale.info.run_id  # the stale RUNNING run was reused
    assert all(r.info.status == "FINISHED" for r in runs)
    # trial 1 was not re-run: its history is unchanged
    done = client.get_metric_history(first_finished.info.run_id, "loss")
    assert len(done) == STEPS // LOG_EVERY
    # trial 2 continued: every logged step exactly once, no gap, no restart
    steps = [m.step for m in client.get_metric_history(runs[1].info.run_id, "loss")]
    assert steps == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert "resumed from step" in resumed.stdout + resumed.stderr
    assert "best trials" in resumed.stdout


def test_killed_after_the_last_checkpoint_resumes(tmp_path):
    """The worker holds after its last report (``RECSYS_TEST_HOLD_AFTER_TRAINING_S``): the
    checkpoint of the last step is registered and logged, the trial is still running; the whole
    sweep (driver and its Ray) is killed there. The resumed trial has nothing left to train, so
    it reports its stored best and finishes, and the resume exits 0."""
    from recsys.train.worker import HOLD_ENV

    steps = 40
    space = Path(write_space(tmp_path, steps=steps))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 20")
    space.write_text(text.replace("{grid: [fp32, fp16]}", "{grid: [fp32]}"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = start_sweep(str(space), tmp_path, **{HOLD_ENV: "600"})
    try:
        deadline = time.time() + 400
        while not (runs := trial_runs(client)) or runs[0].data.metrics.get("step") != steps:
            assert first.poll() is None and time.time() < deadline, "no report of the last step"
            time.sleep(0.3)
        assert runs[0].info.status == "RUNNING"  # Tune has not recorded the trial as done
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    resumed = subprocess.run(
        sweep_cmd(str(space), tmp_path, "--resume"), capture_output=True, text=True, timeout=600
    )
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "nothing left to train" in out
    (run,) = trial_runs(client)
    assert run.info.status == "FINISHED"
    # recorded as finished at its last step (without the stored-best report: "stopped", step 20)
    assert run.data.tags["recsys.status"] == "finished"
    assert f"done: step {steps}, best val_auc" in resumed.stdout
    steps_logged = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps_logged == list(range(5, steps + 1, 5))
    assert "best trials" in resumed.stdout
