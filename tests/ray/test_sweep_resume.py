"""Kill the sweep driver (SIGKILL) after trial 1 finished and while trial 2 is mid-run; resume
(with a SQLite store and with a tracking server over PostgreSQL).

Trial 1 is not re-run, trial 2 continues from its checkpoint, every trial ends, and MLflow has
exactly one run per trial with a continuous, duplicate-free step axis. A second case kills the
sweep during its seed check, exactly after a seed run's last checkpoint and before Tune recorded
that trial as done.
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

import pytest
from mlflow.tracking import MlflowClient

from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, LOG_EVERY = 600, 50  # trial 2 is killed between its step-200 report and step 600


def sweep_cmd(space: str, tmp, uri: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        os.path.join(ROOT, "experiments", "sweep.py"),
        "--space", space,
        "--name", "kill",
        "--storage", str(tmp / "runs"),
        "--tracking-uri", uri,
        "--num-samples", "1",
        "--num-workers", "1", "--cpus-per-worker", "1.5",  # the driver is what gets killed
        *extra,
    ]  # fmt: skip


def start_sweep(space: str, tmp, uri: str, **env: str) -> subprocess.Popen:
    """The sweep in a session of its own (so the test can kill it and its Ray), output dropped."""
    return subprocess.Popen(
        sweep_cmd(space, tmp, uri),
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


def test_killed_driver_resumes(tmp_path, tracking_uri):
    space = Path(write_space(tmp_path, steps=STEPS))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 100")
    text = text.replace("train.log_every: 5", f"train.log_every: {LOG_EVERY}")
    space.write_text(text.replace("{choice: [null, 500]}", "{choice: [500]}"))
    client = MlflowClient(tracking_uri)
    first = start_sweep(str(space), tmp_path, tracking_uri)
    try:
        wait_for_mid_run(client, first)
        first_finished = trial_runs(client)[0]
        os.kill(first.pid, signal.SIGKILL)  # the driver only; its Ray processes are orphaned
        first.wait()
        stale = trial_runs(client)[1]
        assert stale.info.status == "RUNNING"
        resumed = subprocess.run(
            sweep_cmd(str(space), tmp_path, tracking_uri, "--resume"),
            capture_output=True,
            text=True,
            timeout=600,
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


def test_killed_after_the_last_checkpoint_of_a_seed_run_resumes(tmp_path):
    """The search (one trial) is done; the seed check's first run (seed 1 of 2) holds after its
    last report (``RECSYS_TEST_HOLD_AFTER_TRAINING_S``, for seed 1 only): its checkpoint of the
    last step is registered and logged, Tune still has the trial running. The whole sweep (driver
    and its Ray) is killed there.

    The resume restores the finished search without re-running it, and the seed check's own Tune
    state: the held run has nothing left to train, so it reports its stored best and finishes;
    the second seed runs. In the end exactly 1 x 2 seed runs, seeds 1 and 2, both nested under the
    trial they confirm, and the interval on that trial's run equals numpy's and scipy's on their
    logged scores."""
    from recsys.train.worker import HOLD_ENV, HOLD_SEED_ENV

    steps = 40
    space = Path(write_space(tmp_path, steps=steps))
    text = space.read_text().replace("train.checkpoint_every: 10", "train.checkpoint_every: 20")
    text = text.replace("{grid: [fp32, fp16]}", "{grid: [fp32]}")
    space.write_text(text + "confirm: {top: 1, seeds: 2}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)

    def last_step_of_a_seed_run() -> bool:
        return any(r.data.metrics.get("step") == steps for r in runs_of(client, "confirm"))

    first = start_sweep(str(space), tmp_path, uri, **{HOLD_ENV: "600", HOLD_SEED_ENV: "1"})
    kill_when(first, last_step_of_a_seed_run, "a seed run's report of its last step")
    (trial,) = runs_of(client, "trial")
    (held,) = runs_of(client, "confirm")
    assert trial.info.status == "FINISHED" and held.info.status == "RUNNING"
    assert held.data.params["train.seed"] == "1"
    history = client.get_metric_history(held.info.run_id, "val_auc")
    trial_history = client.get_metric_history(trial.info.run_id, "val_auc")

    again = sweep_cmd(str(space), tmp_path, uri, "--resume")
    resumed = subprocess.run(again, capture_output=True, text=True, timeout=600)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "nothing left to train" in out and "seed check (val_auc" in out
    assert "trial 00000 started" not in out  # the search is not re-run
    assert [r.info.run_id for r in runs_of(client, "trial")] == [trial.info.run_id]
    assert client.get_metric_history(trial.info.run_id, "val_auc") == trial_history
    seeds = runs_of(client, "confirm")
    assert len(seeds) == 2 and all(r.info.status == "FINISHED" for r in seeds)
    assert all(r.data.tags["recsys.status"] == "finished" for r in seeds)
    assert sorted(r.data.params["train.seed"] for r in seeds) == ["1", "2"]
    assert {r.data.tags["mlflow.parentRunId"] for r in seeds} == {trial.info.run_id}
    assert client.get_metric_history(held.info.run_id, "val_auc") == history  # not re-trained
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
