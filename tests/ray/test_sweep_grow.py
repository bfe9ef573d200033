"""A finished sweep grows: ``--more 2 --search optuna`` after a 2-trial random search.

The first 2 trials are not re-run; the 2 new ones run in the sweep's folder (``grow-1``) with an
Optuna searcher that was told the first 2 (read back from its saved state: their params and
scores), under the same MLflow parent run; the seed check runs again over all 4 trials, keeping
the seed runs it made before; a re-run of the name is refused again, naming 4 trials. The first
sweep also logs its trials' system metrics (``--system-metrics``).
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sweep(space: str, runs: str, uri: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--space", space,
        "--name", "g", "--storage", runs, "--tracking-uri", uri, "--num-workers", "1",
        "--max-concurrent", "2", "--cpus-per-worker", "0.9", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_a_finished_sweep_grows_warm_started(tmp_path):
    space = Path(write_space(tmp_path, steps=10))
    text = space.read_text().replace("{grid: [fp32, fp16]}", "{choice: [fp32, fp16]}")
    space.write_text(text + "confirm: {top: 1, seeds: 2}\n")
    runs, uri = str(tmp_path / "runs"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = sweep(str(space), runs, uri, "--num-samples", "2", "--system-metrics", "0.5")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("g").experiment_id
    before = {r.info.run_id: r.info.end_time for r in trials(client, exp)}
    assert len(before) == 2
    sampled = [r for r in trials(client, exp) if "system/node0/cpu_utilization_percentage" in
               r.data.metrics]  # fmt: skip
    assert sampled, "--system-metrics: no trial run has its host's CPU samples"

    grown = sweep(str(space), runs, uri, "--more", "2", "--search", "optuna")
    out = grown.stdout + grown.stderr
    assert grown.returncode == 0, out[-6000:]
    assert "growing sweep 'g' (1): 2 more trials" in out
    assert "the optuna search is warm-started with 2 earlier trials" in out
    assert "Warning" not in out.replace("WARNING", ""), out  # Optuna's notes on the space
    after = trials(client, exp)
    assert len(after) == 4  # one run per trial
    assert {r.info.run_id: r.info.end_time for r in after if r.info.run_id in before} == before
    parents = client.search_runs([exp], filter_string="tags.`recsys.kind` = 'sweep:g'")
    assert len(parents) == 1  # one parent holds old and new
    assert {r.data.tags["mlflow.parentRunId"] for r in after} == {parents[0].info.run_id}

    # the searcher saw the first 2: its study starts with their params and best scores
    (state,) = glob.glob(os.path.join(runs, "g", "grow-1", "searcher-state-*.pkl"))
    with open(state, "rb") as f:
        study = pickle.load(f)["_ot_study"]
    told = study.trials[:2]
    first_runs = {r.data.tags["recsys.trial_id"]: r for r in after if r.info.run_id in before}
    scores = sorted(r.data.metrics["best_val_auc"] for r in first_runs.values())
    assert sorted(t.values[0] for t in told) == pytest.approx(scores)
    lrs = sorted(float(r.data.params["optim.lr"]) for r in first_runs.values())
    assert sorted(t.params["params/optim.lr"] for t in told) == pytest.approx(lrs)
    assert len(study.trials) == 4  # and then sampled the 2 new ones

    # the seed check ranks all 4: it confirms the best of them
    confirm = client.download_artifacts(parents[0].info.run_id, "confirm.csv", str(tmp_path))
    confirmed = {line.split(",")[1] for line in Path(confirm).read_text().splitlines()[1:]}
    best = max(after, key=lambda r: r.data.metrics["best_val_auc"]).data.tags["recsys.trial_id"]
    assert confirmed == {best}
    saved = json.loads((Path(runs) / "g" / "sweep.json").read_text())
    assert saved["finished"].startswith("4 trials") and len(saved["growths"]) == 1
    again = sweep(str(space), runs, uri)
    assert again.returncode != 0 and "has finished (4 trials" in again.stderr


def trials(client: MlflowClient, exp: str) -> list:
    return client.search_runs([exp], filter_string="tags.`recsys.kind` = 'trial'")
