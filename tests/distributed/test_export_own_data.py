"""A model trained on a user's own data, exported, scores raw rows (the schema's columns, lists
for multi-hot) as the trained model scores the same rows prepared: the serving batch is the
training batch, INT8 scores are within the export's tolerance of FP32 on every task, and the
MLflow model gives the same scores in a fresh process. For DLRM, FinalMLP (two tasks through
its bilinear heads) and DLRM with PLE experts (two levels, a tower per task), each trained on
2 gloo ranks with a QR table and a column-wise one."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from recsys.serving.mlflow_model import serving_example
from tests.distributed.common import own_data_cfg as cfg
from tests.distributed.common import own_data_rank as _train
from tests.distributed.common import raw_test_rows
from tests.distributed.harness import run_ranks
from tests.helpers import served_in_a_fresh_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
INT8_MAX_PROB_DIFF = 0.02


MODELS = {
    "dlrm": {},
    "finalmlp": {"model.arch": "finalmlp", "model.finalmlp.stream1": [16, 8],
                 "model.finalmlp.stream2": [16], "model.finalmlp.heads": 2},
    "ple": {"model.tasks": "ple", "model.experts.count": 2, "model.experts.levels": 2,
            "model.experts.mlp": [8], "model.experts.tower": [8]},
}  # fmt: skip


@pytest.mark.parametrize("name", list(MODELS))
def test_exported_model_scores_raw_rows_as_the_trained_model(demo_prepared, tmp_path, name):
    check_served(demo_prepared, tmp_path, name, MODELS[name])


def test_a_model_with_a_sequence_exported_scores_raw_rows(sequence_prepared, tmp_path):
    """The demo's history as a sequence (ordered by its times, the 8 most recent kept) pooled by
    target attention: raw rows, their histories unordered and uncut, are served as trained."""
    check_served(sequence_prepared, tmp_path, "sequence", {"model.sequence.pooling": "attention"})


def check_served(folder, tmp_path, name, model):
    """``own_data_cfg(folder, model)`` trained on 2 ranks, exported to INT8, served."""
    from recsys.data.input.loader import load_splits, to_batch
    from recsys.prepare.like import load_fitted
    from recsys.serving.export import export, load_fp32, raw_layout
    from recsys.serving.mlflow_model import log_served_model
    from recsys.serving.scorer import TabularScorer, tabular_batch
    from recsys.tracking.tracker import Tracker

    c = cfg(folder, model)
    run_ranks(_train, folder, str(tmp_path / "ckpt"), model)
    ckpt = str(tmp_path / "ckpt" / "step_00000030")
    out = str(tmp_path / "out")
    export(c, ckpt, out, "int8")
    raw = raw_test_rows(folder)
    test = load_splits(c.data, c.model.num_dense, c.embeddings.num_embeddings).test
    assert len(raw) == len(test) > 100
    fitted = load_fitted(os.path.join(out, "prepared"))
    served = tabular_batch(raw, fitted, c.embeddings.num_embeddings)
    trained = to_batch(test.read(0, len(test)), raw_layout(c))
    s, t = served.sparse_features, trained.sparse_features
    assert s.keys() == t.keys() and torch.equal(s.lengths(), t.lengths())
    assert torch.equal(s.values(), t.values())
    torch.testing.assert_close(served.dense_features, trained.dense_features, atol=1e-6, rtol=0)

    with torch.no_grad():
        fp32 = torch.sigmoid(load_fp32(c, ckpt)(trained.dense_features, t)).numpy()
    scorer = TabularScorer()
    artifacts = {"model": f"{out}/model.pt", "meta": f"{out}/meta.json"}
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    probs = scorer.predict(None, raw.drop(columns=["click", "like"]))
    assert list(probs.columns) == ["click", "like"]
    assert np.abs(probs.to_numpy() - fp32).max() < INT8_MAX_PROB_DIFF

    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = Tracker(uri)
    run_id = tracker.client.create_run(tracker.experiment("e")).info.run_id
    example = serving_example(os.path.join(out, "prepared"))
    log_served_model(tracker, run_id, out, example, registered_name=f"own-{name}")
    rows = raw.drop(columns=["click", "like"]).head(50)
    rows.loc[3, "age"] = None  # a missing value in a column the example has none in
    fresh = served_in_a_fresh_process(uri, f"models:/own-{name}/1", rows, tmp_path)
    np.testing.assert_allclose(fresh.to_numpy(), scorer.predict(None, rows).to_numpy(), atol=1e-6)
