"""Export a trained tiny model (one QR table, mixed dims) to INT8 TorchScript, check it against
FP32, log and register it in MLflow, and score Criteo rows with it in a fresh process."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.common import INT8_MAX_PROB_DIFF, export_config, export_rank
from tests.distributed.harness import run_ranks
from tests.helpers import served_in_a_fresh_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
INT8_MAX_AUC_DELTA = 0.005


def test_export_int8_matches_fp32_and_serves(tmp_path):
    import torch
    from mlflow.tracking import MlflowClient

    from recsys.data.loader import to_batch
    from recsys.data.synthetic import SyntheticRows
    from recsys.export import export, raw_layout
    from recsys.tune.publish import log_served_model, serving_example
    from recsys.tune.tracking import Tracker

    run_ranks(export_rank, str(tmp_path / "ckpt"), world_size=2)
    c = export_config()
    assert c.embeddings.qr.applies_to(c.embeddings.num_embeddings[4])
    report = export(c, str(tmp_path / "ckpt" / "step_00000030"), str(tmp_path / "out"), "int8")
    assert report.max_prob_diff < INT8_MAX_PROB_DIFF, report
    assert abs(report.auc_delta) < INT8_MAX_AUC_DELTA, report
    assert report.table_ratio < 0.5, report  # INT8 rows + per-row scale/bias vs FP32

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    run_id = client.create_run(Tracker(uri).experiment("e")).info.run_id
    out = str(tmp_path / "out")
    example = serving_example(f"{out}/prepared")  # the first generated rows, raw
    log_served_model(Tracker(uri), run_id, out, example, registered_name="tiny-dlrm")
    probs = served_in_a_fresh_process(uri, "models:/tiny-dlrm/1", example, tmp_path)["click"]
    rows = SyntheticRows(c.data.synthetic, 13, c.embeddings.num_embeddings).read(0, len(probs))
    batch = to_batch(rows, raw_layout(c))  # the same rows as training read them
    with torch.no_grad():
        logits = torch.jit.load(report.path)(batch.dense_features, batch.sparse_features)
    assert len(probs) == 5
    np.testing.assert_allclose(probs, torch.sigmoid(logits[:, 0]).numpy(), rtol=1e-5)
