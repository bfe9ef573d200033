"""A log with only categorical columns (issue: "a log with only categorical columns prepares,
sweeps with baselines, exports and scores raw rows"): a Parquet log of a label and four id
columns (strings and integers, no numeric column) with a planted signal, a schema with
``dense: {}``, prepared without Ray; the sweep through the command line over every interaction
op with LR and FM baselines, each learning something; the best trial exported (INT8) and
registered, and the MLflow model, loaded in a fresh process, scores raw rows of the id columns
alone as ``TabularScorer`` does in this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import served_in_a_fresh_process

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = 3000
OPS = ["dot", "cat", "sum", "dcn"]
IDS = ["user", "item", "country", "device"]

SPACE = """
base: debug
num_samples: 1
overrides:
  embeddings.dim: 8
  model.top_mlp: [16]
  train.steps: 24
  train.batch_size: 128
  train.checkpoint_every: 24
  train.eval_every: 24
  train.log_every: 24
  optim.lr: 0.05
  optim.embedding_lr: 0.1
space:
  model.interaction: {grid: [dot, cat, sum, dcn]}
metric: val_auc
mode: max
baselines:                        # one trial each, at the search's budget (not the default rules)
  lr: {rule: fused, grid: {optim.embedding_lr: [0.1]},
       overrides: {train.epochs: 0, train.batch_size: 128}}
  fm: {rule: fused, grid: {optim.embedding_lr: [0.1]},
       overrides: {train.epochs: 0, train.batch_size: 128}}
"""


def write_log(path: str, rows: int = ROWS, seed: int = 0) -> pd.DataFrame:
    """Ids only: ``user`` (strings, 300), ``item`` (ints, 60), ``country`` (strings, 8),
    ``device`` (ints, 4); ``click`` from a logistic model of per-id effects (the few-valued
    columns carry most of it, so a few steps learn it)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "user": [f"u{k}" for k in rng.integers(0, 300, rows)],
        "item": rng.integers(1000, 1060, rows),
        "country": rng.choice(["de", "fr", "it", "es", "pl", "nl", "se", "pt"], rows),
        "device": rng.integers(0, 4, rows),
    })  # fmt: skip
    logit = -1.0 + sum(
        pd.Series(rng.normal(0, scale, len(vals)), index=vals)[frame[col]].to_numpy()
        for col, scale in (("user", 0.5), ("item", 1.0), ("country", 1.5), ("device", 1.0))
        for vals in [np.unique(frame[col])]
    )
    frame["click"] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int8)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return frame


@pytest.mark.extended  # (each step: test_prepare.py, test_sweep.py, test_export_own_data.py)
def test_log_of_ids_only_prepares_sweeps_exports_and_scores_raw_rows(tmp_path):
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare
    from recsys.serving.scorer import TabularScorer

    t0 = time.perf_counter()
    os.makedirs(tmp_path / "raw")
    log = write_log(str(tmp_path / "raw" / "log.parquet"))
    schema_file = tmp_path / "ids.yaml"
    schema = {
        "format": "parquet", "labels": ["click"], "dense": {},
        "split": {"by": "hash", "val_fraction": 0.15, "test_fraction": 0.15},
        "sparse": {c: {} for c in IDS},
    }  # fmt: skip
    schema_file.write_text(yaml.safe_dump(schema, sort_keys=False))
    prepared = str(tmp_path / "prepared")
    meta = prepare(DatasetSchema.load(str(schema_file)), [str(tmp_path / "raw")], prepared,
                   workers=0, log=lambda s: None)  # fmt: skip
    assert meta["schema"]["dense"] == {} and meta["feature_names"] == IDS
    val = meta["label_counts"]["val"]["click"]
    assert 300 < val["rows"] < 600 and 0 < val["positives"] < val["rows"]
    space = tmp_path / "ids_space.yaml"
    space.write_text(textwrap.dedent(SPACE))

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--space", str(space),
           "--data", prepared, "--name", "ids", "--storage", str(tmp_path / "runs"),
           "--tracking-uri", uri, "--num-workers", "1", "--cpus-per-worker", "1",
           "--export", "int8", "--register", "ids-dlrm"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "exported the best trial" in out, out[-3000:]

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ids").experiment_id])
    trials = [r for r in runs if r.data.tags.get("recsys.kind") == "trial"]
    baselines = [r for r in runs if r.data.tags.get("recsys.kind") == "baseline"]
    assert sorted(r.data.params["model.interaction"] for r in trials) == sorted(OPS)
    assert sorted(r.data.params["model.arch"] for r in baselines) == ["fm", "lr"]
    for run in trials + baselines:  # every model learned something from the ids alone
        assert run.info.status == "FINISHED" and run.data.tags["recsys.status"] == "finished"
        assert run.data.metrics["best_val_auc"] > 0.6, (run.data.params, run.data.metrics)

    export = tmp_path / "runs" / "ids" / "export"
    assert {"model.pt", "meta.json", "prepared"} <= set(os.listdir(export))
    with open(export / "meta.json") as f:
        assert json.load(f)["num_dense"] == 0

    rows = log[IDS].head(40).copy()  # raw rows: the id columns only, as the log holds them
    rows.loc[0, "user"], rows.loc[1, "item"] = "never-seen", 999_999  # unseen ids: row 0
    scorer = TabularScorer()
    artifacts = {"model": str(export / "model.pt"), "meta": str(export / "meta.json"),
                 "prepared": str(export / "prepared")}  # fmt: skip
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    here = scorer.predict(None, rows)
    assert list(here.columns) == ["click"] and here.shape == (40, 1)
    assert ((here.to_numpy() > 0) & (here.to_numpy() < 1)).all()
    assert here["click"].std() > 0  # the rows' ids move the score

    fresh = served_in_a_fresh_process(uri, "models:/ids-dlrm/1", rows, tmp_path)
    assert list(fresh.columns) == ["click"]
    np.testing.assert_allclose(fresh.to_numpy(), here.to_numpy(), atol=1e-6)
    print(f"ids-only log, end to end: {time.perf_counter() - t0:.0f} s")
