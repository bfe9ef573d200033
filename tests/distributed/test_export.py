"""Export a trained tiny model (one QR table, mixed dims, batch norm and dropout) to INT8
TorchScript, check it against FP32 and against the trained model evaluated in process, log and
register it in MLflow, and score Criteo rows with it in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.distributed.common import EXPORT_ROWS, INT8_MAX_PROB_DIFF, export_config, export_rank
from tests.distributed.harness import run_ranks
from tests.helpers import served_in_a_fresh_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
INT8_MAX_AUC_DELTA = 0.005
# row-wise INT4 tables (4 bits and a per-row scale and bias): measured on this test's model
# |p_int4 - p_fp32| <= 0.006 and an AUC 0.0008 away; the bounds leave room for other seeds
INT4_MAX_PROB_DIFF, INT4_MAX_AUC_DELTA = 0.05, 0.02


def test_export_int8_matches_fp32_and_serves(tmp_path):
    from mlflow.tracking import MlflowClient

    from recsys.data.input.loader import to_batch
    from recsys.data.input.synthetic import SyntheticRows
    from recsys.serving.export import export, raw_layout
    from recsys.serving.mlflow_model import serving_example
    from recsys.tracking.tracker import Tracker

    in_process = run_ranks(export_rank, str(tmp_path / "ckpt"), world_size=2)
    c = export_config()
    assert c.embeddings.qr.applies_to(c.embeddings.num_embeddings[4], c.embeddings.names()[4])
    assert (c.model.norm, c.model.dropout) == ("batch", 0.2)
    ckpt = str(tmp_path / "ckpt" / "step_00000030")
    report = export(c, ckpt, str(tmp_path / "out"), "int8")
    assert report.max_prob_diff < INT8_MAX_PROB_DIFF, report
    assert abs(report.auc_delta) < INT8_MAX_AUC_DELTA, report
    assert report.table_ratio < 0.5, report  # INT8 rows + per-row scale/bias vs FP32
    _check_against_the_eval_model(c, ckpt, report.path, in_process)

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    run_id = client.create_run(Tracker(uri).experiment("e")).info.run_id
    out = str(tmp_path / "out")
    example = serving_example(f"{out}/prepared")  # the first generated rows, raw
    rows = SyntheticRows(c.data.synthetic, 13, c.embeddings.num_embeddings).read(0, len(example))
    batch = to_batch(rows, raw_layout(c))  # the same rows as training read them
    probs = _served_as_exported(uri, run_id, out, report.path, "tiny-dlrm", example, batch,
                                tmp_path)  # fmt: skip
    assert len(probs) == 5
    _check_export_by_alias(uri, run_id, c, ckpt, tmp_path)
    _check_int4(c, ckpt, tmp_path, uri, run_id, report, example, batch)


def _check_int4(cfg, ckpt, tmp_path, uri, run_id, int8, example, batch) -> None:
    """``--dtype int4``: the same checkpoint's tables in 4 bits a value, close to FP32, smaller
    than INT8's, and served in a fresh process as the exported model scores in this one."""
    from recsys.serving.export import export

    out = str(tmp_path / "out4")
    report = export(cfg, ckpt, out, "int4")
    assert report.dtype == "int4"
    assert report.max_prob_diff < INT4_MAX_PROB_DIFF, report
    assert abs(report.auc_delta) < INT4_MAX_AUC_DELTA, report
    assert report.exported_table_bytes < int8.exported_table_bytes, (report, int8)
    # an 8-value row: 4 bytes of 4-bit values and 4 of its scale and bias, a quarter of FP32's
    # 32 bytes; a 16-value row less (12 of 64)
    assert report.table_ratio <= 0.25, report
    _served_as_exported(uri, run_id, out, report.path, "tiny-dlrm-int4", example, batch, tmp_path)


def _served_as_exported(uri, run_id, out, path, name, example, batch, tmp_path) -> Any:
    """The export in ``out`` registered as ``name`` (version 1) and served in a fresh process
    on the raw ``example`` rows: its probabilities (returned) equal the exported TorchScript
    model's at ``path`` on ``batch``, the same rows as training read them."""
    import torch

    from recsys.serving.mlflow_model import log_served_model
    from recsys.tracking.tracker import Tracker

    log_served_model(Tracker(uri), run_id, out, example, registered_name=name)
    probs = served_in_a_fresh_process(uri, f"models:/{name}/1", example, tmp_path)["click"]
    with torch.no_grad():
        logits = torch.jit.load(path)(batch.dense_features, batch.sparse_features)
    np.testing.assert_allclose(probs, torch.sigmoid(logits[:, 0]).numpy(), rtol=1e-5)
    return probs


EXPORT_NOISE = [
    "Warning",  # any library warning (UserWarning, FutureWarning, ...)
    "warn(",
    "Downloading artifacts",  # MLflow's progress bars
    "%|",
    "cloudpickle",
    "Traceback",
    "\x1b[",
]


def _check_the_console_is_short(out: str, stdout: str) -> None:
    """``recsys-export``'s console: what it exported and registered, and the checks' figures;
    no library warnings and no progress bars (as the sweep's console: tests/ray/test_sweep.py)."""
    lines = [line for line in out.splitlines() if line.strip()]
    assert [n for n in EXPORT_NOISE if n.lower() in out.lower()] == [], out
    assert len(lines) <= 9, out
    result = stdout.strip().splitlines()
    assert result[-1].startswith("  tables ") and any("test AUC" in x for x in result), out


def _check_export_by_alias(uri, run_id, cfg, ckpt, tmp_path) -> None:
    """``recsys-export --model models:/NAME@ALIAS``: the registered version's trial (its run's
    config and best checkpoint, as a sweep's trial run has them) exported again, in FP16."""
    import yaml
    from mlflow.tracking import MlflowClient

    from recsys.cli.export import main
    from recsys.tracking.tracker import Tag, Tracker

    client = MlflowClient(uri)
    Tracker(uri).log_text(run_id, yaml.safe_dump(cfg.to_dict()), "config.yaml")
    with pytest.raises(SystemExit, match="'models:/tiny-dlrm@champion': not in sqlite:.*alias"):
        main(["--model", "models:/tiny-dlrm@champion", "--tracking-uri", uri])  # no alias yet
    client.set_registered_model_alias("tiny-dlrm", "champion", "1")
    with pytest.raises(SystemExit, match=r"--model 'models:/tiny-dlrm@champion': its run .* no "):
        main(["--model", "models:/tiny-dlrm@champion", "--tracking-uri", uri])  # no checkpoint
    client.set_tag(run_id, Tag.BEST_CHECKPOINT, ckpt)
    again = tmp_path / "again"
    cmd = [sys.executable, "-m", "recsys.cli.export", "--model", "models:/tiny-dlrm@champion",
           "--dtype", "fp16", "--tracking-uri", uri, "--out", str(again), "--register",
           "tiny-dlrm"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    _check_the_console_is_short(out, done.stdout)
    assert (again / "model.pt").exists()
    assert client.get_run(run_id).data.metrics["export_auc"] > 0
    versions = client.search_model_versions("name = 'tiny-dlrm'")
    assert sorted(int(v.version) for v in versions) == [1, 2]  # the re-export registered too


@pytest.mark.parametrize("arch", ["lr", "fm"])
def test_reference_models_export_table_by_table(tmp_path, arch):
    """The references' tables (LR's weights, FM's factors, one QR table) go through the same
    table-by-table export: the FP32 check and the INT8 model score as the trained model did."""
    from recsys.serving.export import export

    in_process = run_ranks(export_rank, str(tmp_path / "ckpt"), False, arch, world_size=2)
    c, ckpt = export_config(arch), str(tmp_path / "ckpt" / "step_00000030")
    report = export(c, ckpt, str(tmp_path / "out"), "int8")
    assert report.max_prob_diff < INT8_MAX_PROB_DIFF, report
    assert report.fp32_table_bytes == 4 * sum(rows * dim for rows, dim in _table_shapes(c)), report
    _check_against_the_eval_model(c, ckpt, report.path, in_process)


def _table_shapes(cfg):
    from recsys.config import model_tables
    from recsys.models.embeddings import table_specs

    tables = model_tables(cfg.model, cfg.embeddings, len(cfg.loss.tasks))
    return [(s.rows, s.dim) for s in table_specs(tables)]


def _check_against_the_eval_model(cfg, ckpt, exported, in_process):
    """Both ranks' trained model in eval mode scored the first test rows alike (one set of batch
    norm statistics, no dropout); the checkpoint loaded for export (FP32) scores them as they
    did, and the INT8 TorchScript model within ``INT8_MAX_PROB_DIFF``."""
    import torch

    from recsys.data.input.loader import load_splits, to_batch
    from recsys.serving.export import load_fp32, raw_layout

    test = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).test
    raw = to_batch(test.read(0, EXPORT_ROWS), raw_layout(cfg))
    with torch.no_grad():
        fp32 = load_fp32(cfg, ckpt)(raw.dense_features, raw.sparse_features)
        int8 = torch.jit.load(exported)(raw.dense_features, raw.sparse_features)
    torch.testing.assert_close(in_process[0], in_process[1], atol=0, rtol=0)
    torch.testing.assert_close(fp32, in_process[0], atol=1e-5, rtol=0)
    assert (torch.sigmoid(int8) - torch.sigmoid(fp32)).abs().max() < INT8_MAX_PROB_DIFF
