"""Kill the sweep driver (SIGKILL) after trial 1 finished and while trial 2 is mid-run; resume.

Trial 1 is not re-run, trial 2 continues from its checkpoint, every trial ends, and MLflow has
exactly one run per trial with a continuous, duplicate-free step axis. A second case kills the
sweep exactly after a trial's last checkpoint and before Tune recorded the trial as done, then
kills its resume during the seed check.
"""

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


def start_sweep(space: str, tmp, *extra: str, stdout: Any = None, **env: str) -> subprocess.Popen:
    """The sweep in a session of its own (so the test can kill it and its Ray), its output to
    ``stdout`` (default: dropped)."""
    return subprocess.Popen(
        sweep_cmd(space, tmp, *extra),
        stdout=stdout or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if stdout else subprocess.DEVNULL,
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


def test_killed_after_the_last_checkpoint_and_during_the_seed_check_resumes(tmp_path):
    """Two kills of the whole sweep (driver and its Ray), each followed by a resume.

    1. The worker holds after its last report (``RECSYS_TEST_HOLD_AFTER_TRAINING_S``): the
       checkpoint of the last step is registered and logged, the trial is still running. The
       resumed trial has nothing left to train, so it reports its stored best and finishes.
    2. That resume goes on to the seed check (the best trial, 2 new seeds) and is killed when the
       first seed run has finished. The second resume restores the finished search without
       re-running it and the seed check's own Tune state: exactly 1 x 2 seed runs in the end,
       seeds 1 and 2, the first not re-run, both nested under the trial they confirm, and the
       interval on that trial's run equals numpy's and scipy's on their logged scores."""
    from recsys.train.worker import HOLD_ENV

    steps = 40
    space = Path(write_space(tmp_path, steps=steps))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 20")
    text = text.replace("{grid: [fp32, fp16]}", "{grid: [fp32]}")
    space.write_text(text + "confirm: {top: 1, seeds: 2}\n")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")

    def last_step_logged() -> bool:
        runs = runs_of(client, "trial")
        return bool(runs) and runs[0].data.metrics.get("step") == steps

    first = start_sweep(str(space), tmp_path, **{HOLD_ENV: "600"})
    kill_when(first, last_step_logged, "a report of the last step")
    (trial,) = runs_of(client, "trial")
    assert trial.info.status == "RUNNING"  # Tune had not recorded the trial as done

    log = tmp_path / "resume1.log"
    with open(log, "w") as out:
        second = start_sweep(str(space), tmp_path, "--resume", stdout=out)
        seed_done = lambda: any(r.info.status == "FINISHED" for r in runs_of(client, "confirm"))  # noqa: E731
        kill_when(second, seed_done, "a finished seed run")
    assert "nothing left to train" in log.read_text()
    (trial,) = runs_of(client, "trial")
    assert trial.info.status == "FINISHED" and trial.data.tags["recsys.status"] == "finished"
    (done,) = [r for r in runs_of(client, "confirm") if r.info.status == "FINISHED"]
    history = client.get_metric_history(done.info.run_id, "val_auc")

    resumed = subprocess.run(
        sweep_cmd(str(space), tmp_path, "--resume"), capture_output=True, text=True, timeout=600
    )
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "seed check (val_auc" in out and "trial 00000 started" not in out
    assert [r.info.run_id for r in runs_of(client, "trial")] == [trial.info.run_id]
    seeds = runs_of(client, "confirm")
    assert len(seeds) == 2 and all(r.info.status == "FINISHED" for r in seeds)
    assert sorted(r.data.params["train.seed"] for r in seeds) == ["1", "2"]
    assert {r.data.tags["mlflow.parentRunId"] for r in seeds} == {trial.info.run_id}
    assert client.get_metric_history(done.info.run_id, "val_auc") == history  # not re-run
    assert [m.step for m in history] == [20, 40]
    check_interval(client, trial, seeds)


def check_interval(client: MlflowClient, trial, seeds: list) -> None:
    import numpy as np
    from scipy import stats

    values = np.array([r.data.metrics["best_val_auc"] for r in seeds])
    mean, std = values.mean(), values.std(ddof=1)
    half = stats.t.ppf(0.975, len(values) - 1) * std / np.sqrt(len(values))
    got = client.get_run(trial.info.run_id).data.metrics
    assert got["confirmed_mean_val_auc"] == pytest.approx(mean, abs=1e-12)
    assert got["confirmed_std_val_auc"] == pytest.approx(std, abs=1e-12)
    assert got["confirmed_low_val_auc"] == pytest.approx(mean - half, abs=1e-12)
    assert got["confirmed_high_val_auc"] == pytest.approx(mean + half, abs=1e-12)
