"""The baselines phase searches each reference by its grid (here 2 learning rates of an LR, trained
by epochs with patience), keeps the best by validation as the reference (summary, table, leads,
MLflow tags, ``references.csv``), and a resumed sweep restores the phase from
``<sweep>/baselines`` without training a reference again."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tag, Tracker
from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPACE = """
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
baselines:
  lr:
    rule: fused                  # FBGEMM's fused optimizer, though the tables are small
    grid: {optim.embedding_lr: [0.003, 0.03]}
    overrides: {train.epochs: 2, train.batch_size: 128, train.patience: 1}
"""


@pytest.mark.extended  # (the choice: test_space_baselines.py; a resumed baseline phase: below)
def test_the_reference_is_the_best_of_its_grid_and_a_resume_keeps_it(ray_2_cpus, tmp_path, capsys):
    path = tmp_path / "refs.yaml"
    path.write_text(textwrap.dedent(SPACE))
    space = spaces.load(str(path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(name="refs", storage=str(tmp_path / "runs"), tracking_uri=uri,
                        num_samples=1, num_workers=1, cpus_per_worker=1.0)  # fmt: skip
    rows = run_sweep(space, opts, Tracker(uri), restore=False)
    out = capsys.readouterr().out
    refs = [r for r in rows if r["role"] == "baseline"]
    assert len(refs) == 1 and refs[0]["arch"] == "lr"  # the table: the best of the 2 trials
    assert refs[0]["reference"].startswith("best of 2: embedding_lr=")
    assert f"(trial {refs[0]['trial']}, best of 2: embedding_lr=" in out

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("refs")
    runs = client.search_runs([exp.experiment_id])
    baselines = [r for r in runs if r.data.tags.get("recsys.kind") == "baseline"]
    assert len(baselines) == 2
    by_lr = {float(r.data.params["optim.embedding_lr"]): r for r in baselines}
    assert set(by_lr) == {0.003, 0.03}
    for r in baselines:  # the rules applied: a budget in epochs made steps, fp16 tables
        assert (
            r.data.params["train.epochs"] == "2.0" and r.data.params["embeddings.dtype"] == "fp16"
        )
        assert int(r.data.params["train.steps"]) == 2 * -(-2400 // 128)  # 2 epochs of 2400 rows
    best = max(baselines, key=lambda r: r.data.metrics["best_val_auc"])
    assert best.data.tags["recsys.trial_id"] == refs[0]["trial"]
    assert best.data.tags[Tag.REFERENCE] == refs[0]["reference"]
    assert sorted(r.data.tags[Tag.REFERENCE] for r in baselines)[-1] == "candidate"
    (parent,) = [r for r in runs if r.data.tags.get("recsys.kind") == "sweep:refs"]
    assert parent.data.tags[f"{Tag.REFERENCE}.lr"].startswith(
        f"trial {refs[0]['trial']}, best of 2"
    )
    lead = parent.data.metrics["lead_over_lr"]
    trial = next(r for r in rows if r["role"] == "trial")
    assert lead == pytest.approx(trial["best_val_auc"] - best.data.metrics["best_val_auc"])
    csv = pd.read_csv(
        client.download_artifacts(parent.info.run_id, "references.csv", str(tmp_path))
    )
    assert len(csv) == 2 and csv["chosen"].sum() == 1

    # resumed: the phase is restored from runs/refs/baselines; nothing is trained again
    again = run_sweep(space, opts, Tracker(uri), restore=True)
    assert [r["trial"] for r in again if r["role"] == "baseline"] == [refs[0]["trial"]]
    after = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'baseline'")
    assert len(after) == 2
    for r in after:
        history = client.get_metric_history(r.info.run_id, "val_auc")
        assert len({m.step for m in history}) == len(history)  # no step reported twice
