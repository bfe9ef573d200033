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
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.ray.killing import (
    MID_RUN,
    check_resumed,
    kill_space,
    kill_when,
    runs_of,
    start_sweep,
    sweep_cmd,
    trial_runs,
    wait_for_mid_run,
)
from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_killed_driver_resumes(tmp_path, tracking_uri):
    space = kill_space(tmp_path)
    client = MlflowClient(tracking_uri)
    runs = str(tmp_path / "runs")
    first = start_sweep(space, runs, tracking_uri, **MID_RUN)  # trial 2 held mid-run
    try:
        wait_for_mid_run(client, first)
        first_finished = trial_runs(client)[0]
        os.kill(first.pid, signal.SIGKILL)  # the driver only; its Ray processes are orphaned
        first.wait()
        stale = trial_runs(client)[1]
        assert stale.info.status == "RUNNING"
        resumed = subprocess.run(
            sweep_cmd(space, runs, tracking_uri, "--resume"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    check_resumed(client, first_finished, stale, resumed.stdout + resumed.stderr)


@pytest.mark.extended  # (a restored seed check: test_sweep_grow.py)
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

    runs = str(tmp_path / "runs")
    first = start_sweep(str(space), runs, uri, **{HOLD_ENV: "600", HOLD_SEED_ENV: "1"})
    kill_when(first, last_step_of_a_seed_run, "a seed run's report of its last step")
    (trial,) = runs_of(client, "trial")
    (held,) = runs_of(client, "confirm")
    assert trial.info.status == "FINISHED" and held.info.status == "RUNNING"
    assert held.data.params["train.seed"] == "1"
    history = client.get_metric_history(held.info.run_id, "val_auc")
    trial_history = client.get_metric_history(trial.info.run_id, "val_auc")

    again = sweep_cmd(str(space), runs, uri, "--resume")
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
