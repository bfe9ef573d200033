"""The baselines phase on a local Ray: logistic regression solved to its optimum (full-batch
L-BFGS) at each L2 strength of its grid, beside the search (the cluster holds a reference's trial
next to the search's: 1-worker trials of half a CPU), the grid's edge walked where its best sat
(a grid of strengths too strong: the walk goes down), the best trained to its end kept as the
reference (summary, table, MLflow tags, ``references.csv``); a resumed sweep restores every
experiment of the phase and walks the same edges without training again."""

from __future__ import annotations

import math
import re
import textwrap

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tag, Tracker
from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SEARCH = """
base: debug
num_samples: 1
overrides:
  data.synthetic.num_samples: 3000
  embeddings.num_embeddings: [50, 200, 1000, 3000]
  embeddings.dim: 8
  model.bottom_mlp: [16]
  model.top_mlp: [16]
  train.steps: 20
  train.batch_size: 64
  train.checkpoint_every: 10
  train.log_every: 10
space:
  optim.lr: {choice: [0.05]}
"""
SPACE = (
    SEARCH
    + """baselines:
  lr:                            # the dense rule: solved; strengths too strong
    grid: {optim.weight_decay: [0.1, 1.0]}
    overrides: {train.steps: 60}
"""
)


def test_a_solved_reference_walks_its_edge_beside_the_search_and_a_resume_keeps_it(
    ray_2_cpus, tmp_path, capsys
):
    path = tmp_path / "refs.yaml"
    path.write_text(textwrap.dedent(SPACE))
    space = spaces.load(str(path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(name="refs", storage=str(tmp_path / "runs"), tracking_uri=uri,
                        num_samples=1, num_workers=1, cpus_per_worker=0.5)  # fmt: skip
    rows = run_sweep(space, opts, Tracker(uri), restore=False)
    out = capsys.readouterr().out
    assert "beside the search" in out  # 2 x (0.5 + 0.1) CPU fit the 2 CPUs
    refs = [r for r in rows if r["role"] == "baseline"]
    assert len(refs) == 1 and refs[0]["arch"] == "lr"
    described = refs[0]["reference"]
    assert "weight_decay extended down" in described, described  # the low edge, walked
    chosen = refs[0]["params"]["optim.weight_decay"]
    assert chosen < 0.1  # the walk found a weaker strength better than the grid's best
    assert f"reference lr: val_auc {refs[0]['best_val_auc']:.4f}" in out
    clocks = [int(m) * 60 + int(s) for m, s in re.findall(r"\[baselines (\d+):(\d+)\]", out)]
    assert len(clocks) >= 6 and clocks == sorted(clocks), out  # the walk's steps on the grid's

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("refs")
    runs = client.search_runs([exp.experiment_id])
    baselines = [r for r in runs if r.data.tags.get("recsys.kind") == "baseline"]
    strengths = sorted(float(r.data.params["optim.weight_decay"]) for r in baselines)
    assert strengths[-2:] == [0.1, 1.0] and len(strengths) >= 3  # the grid, then the walk
    for r in baselines:  # solved: the full-batch solver, to convergence or its cap
        assert r.data.params["train.solver"] == "lbfgs" and r.data.params["model.arch"] == "lr"
        assert r.data.tags["recsys.status"] in ("finished", "early_stopped", "stopped")
    best = next(r for r in baselines if r.data.tags["recsys.trial_id"] == refs[0]["trial"])
    assert best.data.tags[Tag.REFERENCE] == described
    (parent,) = [r for r in runs if r.data.tags.get("recsys.kind") == "sweep:refs"]
    assert parent.data.tags[f"{Tag.REFERENCE}.lr"].startswith(f"trial {refs[0]['trial']}, best")
    csv = pd.read_csv(
        client.download_artifacts(parent.info.run_id, "references.csv", str(tmp_path))
    )
    assert len(csv) == len(baselines) and csv["chosen"].sum() == 1

    # resumed: every experiment of the phase restored, the same walk, nothing trained again
    again = run_sweep(space, opts, Tracker(uri), restore=True)
    (ref,) = [r for r in again if r["role"] == "baseline"]
    assert (ref["trial"], ref["reference"]) == (refs[0]["trial"], described)
    after = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'baseline'")
    assert len(after) == len(baselines)
    for r in after:
        history = client.get_metric_history(r.info.run_id, "val_auc")
        assert len({m.step for m in history}) == len(history)  # no step reported twice


HALVING = (
    SEARCH
    + """baselines:
  fm:                            # 6 points; 3 epochs, 2 reports an epoch: a rung at 1 epoch
    grid: {optim.lr: [0.3, 0.1, 0.03, 0.01, 0.003, 0.001]}
    overrides: {train.epochs: 3, train.patience: 0}
"""
)


def test_a_references_grid_is_halved_in_rounds_that_train_its_points_on(
    ray_2_cpus, tmp_path, capsys
):
    """Under ``--scheduler asha`` the grid trains in rounds: all 6 points to one epoch, where
    they pause; the best 6 // 3 = 2 go on from their checkpoints to the end, in the same MLflow
    runs (one a point); the reference is the best of those. A resume trains nothing again."""
    path = tmp_path / "halving.yaml"
    path.write_text(textwrap.dedent(HALVING))
    space = spaces.load(str(path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(name="halving", storage=str(tmp_path / "runs"), tracking_uri=uri,
                        num_samples=1, num_workers=1, cpus_per_worker=0.5,
                        scheduler="asha")  # fmt: skip
    rows = run_sweep(space, opts, Tracker(uri), restore=False)
    out = capsys.readouterr().out
    assert "under successive halving (the best 1/3 go on at each rung)" in out
    (ref,) = [r for r in rows if r["role"] == "baseline"]
    assert "(4 stopped at a rung)" in out, out
    assert "baseline fm-3 started: arch=fm lr=0.01 pause_at=" in out  # (its round 0)
    assert "point=" not in out
    assert (tmp_path / "runs" / "halving" / "baselines-fm-rung-1").is_dir()

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("halving")
    runs = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'baseline'")
    grid = [r for r in runs if "-edge-" not in r.data.tags["recsys.trial_id"]]
    assert sorted(float(r.data.params["optim.lr"]) for r in grid) == [
        0.001, 0.003, 0.01, 0.03, 0.1, 0.3
    ]  # fmt: skip
    steps = {int(r.data.params["train.steps"]) for r in grid}
    (budget,) = steps
    every = max(1, budget // 3 // 2)  # two reports an epoch
    rung = math.ceil(budget / 3 / every) * every  # the first report at or past one epoch
    by_status: dict[str, list] = {}
    for r in grid:
        by_status.setdefault(r.data.tags["recsys.status"], []).append(r)
        assert "train.pause_at" not in r.data.params or r.data.params["train.pause_at"] == "0"
        history = [m.step for m in client.get_metric_history(r.info.run_id, "val_auc")]
        assert history == sorted(set(history)), history  # no step twice, in order
        rounds = client.get_metric_history(r.info.run_id, "trial_s")
        config = client.download_artifacts(r.info.run_id, "config.yaml", str(tmp_path))
        with open(config) as f:
            assert "pause_at: 0\n" in f.read()  # the run's, not a round's
        if r.data.tags["recsys.status"] == "stopped":  # paused at the rung, never went on
            assert history[-1] == rung and len(rounds) == 1
        else:  # trained on from the rung: its steps go on in the same run
            assert history[-1] == budget and len(rounds) == 2
            assert rung in history
    assert len(by_status.pop("stopped")) == 4 and sum(map(len, by_status.values())) == 2
    best = next(r for r in runs if r.data.tags["recsys.trial_id"] == ref["trial"])
    assert best.data.tags["recsys.status"] != "stopped"

    again = run_sweep(space, opts, Tracker(uri), restore=True)
    (ref2,) = [r for r in again if r["role"] == "baseline"]
    assert (ref2["trial"], ref2["reference"]) == (ref["trial"], ref["reference"])
    after = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'baseline'")
    assert len(after) == len(runs)
    for r in after:
        assert len(client.get_metric_history(r.info.run_id, "trial_s")) <= 2
