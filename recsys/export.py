"""From a trained checkpoint to a servable model, with TorchRec's inference workflow.

1. the sharded checkpoint is loaded into an unsharded model on CPU, its tables in FP32 whatever
   they were trained in (TorchRec's unsharded collection would make every non-FP32 table fp16,
   overflowing bf16 values beyond 65504), with the QR id split in front (``WithRawIds``) so the
   exported model takes raw ids;
2. its ``EmbeddingBagCollection`` is swapped for TorchRec's quantized one
   (``quantize_inference_model``: INT8 by default, INT4 or FP16 selectable);
3. the quantized module is sharded for inference (``shard_quant_model``, table-wise on one CPU
   device here; ``world_size`` GPUs on a serving host);
4. it is traced with TorchRec's fx tracer and scripted (TorchScript), so it loads with
   ``torch.jit.load`` and no Python model code (``import torchrec`` registers the KJT type and
   FBGEMM's ops).

QR tables (two ordinary tables each), tables that several features share (one TorchRec table
listing them all, quantized once) and mixed dims survive: all are plain TorchRec tables and the id
split and projections are scriptable. Weighted lists (``embeddings.weighted``) too: the quantized
collection copies the trained one's ``is_weighted`` (``from_float``; built from the config, never
from the input, since a collection whose flag is off ignores a KJT's weights), so the exported
model takes a weighted KJT (``qr_split_kjt`` carries the weights) and ``meta.json`` lists the
weighted features (``weighted``) beside ``shared``. The exported model is checked against the FP32
model on the test split (AUC, log loss, largest probability difference) and both sizes are
recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from recsys.config import ExperimentConfig, SparseLayout
from recsys.data import RowSource, load_splits
from recsys.data.dataset import write_serving
from recsys.data.loader import to_batch
from recsys.distributed.checkpoint import load_model_unsharded
from recsys.models import ModelAndLoss, build_model
from recsys.models.dlrm import WithRawIds
from recsys.serving import META_FILE, MODEL_FILE, PREPARED_DIR
from recsys.train.metrics import binary_metrics, sigmoid

DTYPES = {"int8": torch.qint8, "int4": torch.quint4x2, "fp16": torch.half}


@dataclass(frozen=True)
class ExportReport:
    """What an export produced and how close it is to the FP32 model."""

    path: str
    dtype: str
    fp32_bytes: int
    exported_bytes: int
    fp32_table_bytes: int
    exported_table_bytes: int
    fp32_auc: float
    exported_auc: float
    fp32_log_loss: float
    exported_log_loss: float
    max_prob_diff: float
    rows: int

    @property
    def auc_delta(self) -> float:
        return self.exported_auc - self.fp32_auc

    @property
    def size_ratio(self) -> float:
        """Exported file over FP32 weights file (includes code and dense layers)."""
        return self.exported_bytes / self.fp32_bytes

    @property
    def table_ratio(self) -> float:
        """Quantized table storage (incl. per-row scale and bias) over FP32 tables."""
        return self.exported_table_bytes / self.fp32_table_bytes

    def as_metrics(self) -> dict[str, float]:
        return {
            "export_auc": self.exported_auc,
            "export_auc_delta": self.auc_delta,
            "export_log_loss": self.exported_log_loss,
            "export_max_prob_diff": self.max_prob_diff,
            "export_bytes": float(self.exported_bytes),
            "export_fp32_bytes": float(self.fp32_bytes),
            "export_size_ratio": self.size_ratio,
            "export_table_bytes": float(self.exported_table_bytes),
            "export_table_ratio": self.table_ratio,
        }


def load_fp32(cfg: ExperimentConfig, checkpoint_dir: str) -> nn.Module:
    """The trained model, unsharded, on CPU, in eval mode, its tables loaded into FP32 whatever
    their trained dtype (DCP converts on load), taking raw ids: ``model(dense, raw_kjt)``."""
    fp32 = dataclasses.replace(cfg.embeddings, dtype="fp32")
    wrapper = ModelAndLoss(build_model(cfg.model, fp32, len(cfg.loss.tasks)), cfg.loss)
    model = load_model_unsharded(checkpoint_dir, wrapper).model
    assert isinstance(model, nn.Module)
    return WithRawIds(model, cfg.embeddings.layout().qr).eval()


def raw_layout(cfg: ExperimentConfig) -> SparseLayout:
    """The serving input: raw ids (mod table rows), not split; the model splits them."""
    return SparseLayout(cfg.embeddings.names(), list(cfg.embeddings.num_embeddings))


def table_bytes(model: nn.Module) -> int:
    """Bytes of the embedding tables: FP32 weights, or quantized rows plus scale/bias."""
    from torchrec.inference.modules import get_table_to_weights_from_tbe

    quantized = get_table_to_weights_from_tbe(model)
    if quantized:
        return sum(
            t.numel() * t.element_size()
            for pair in quantized.values()
            for t in pair
            if t is not None
        )
    return sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if "embedding_bags" in n
    )


def quantize_and_script(
    model: nn.Module, dtype: str, sample: tuple[torch.Tensor, Any]
) -> tuple[torch.jit.ScriptModule, int]:
    """Quantize the tables, shard for inference on CPU, trace and script. ``model`` is consumed;
    ``sample`` (dense, KJT) runs once first: sharded inference modules set up their input
    distribution on the first real batch, which tracing cannot provide. Returns the scripted
    module and its table bytes."""
    from torchrec.distributed.global_settings import set_propogate_device
    from torchrec.fx import symbolic_trace
    from torchrec.inference.modules import (
        assign_weights_to_tbe,
        get_table_to_weights_from_tbe,
        quantize_inference_model,
        shard_quant_model,
    )

    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    quant = quantize_inference_model(model, quantization_dtype=DTYPES[dtype])
    weights = get_table_to_weights_from_tbe(quant)
    quant_bytes = table_bytes(quant)
    set_propogate_device(True)  # place the inference TBEs on the sharding device (CPU here)
    sharded, _ = shard_quant_model(quant, compute_device="cpu", sharding_device="cpu")
    assign_weights_to_tbe(sharded, weights)  # sharding builds fresh TBEs: carry the weights over
    with torch.no_grad():
        sharded(*sample)
    return torch.jit.script(symbolic_trace(sharded)), quant_bytes


def _predict(model: Any, cfg: ExperimentConfig, rows: RowSource, batch: int = 4096) -> np.ndarray:
    out = []
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            b = to_batch(rows.read(i, i + batch), raw_layout(cfg))
            out.append(model(b.dense_features, b.sparse_features)[:, 0].float())
    return torch.cat(out).numpy()


def _file_bytes(module: Any, path: str) -> int:
    if isinstance(module, torch.jit.ScriptModule):
        torch.jit.save(module, path)
    else:
        torch.save(module.state_dict(), path)
    return os.path.getsize(path)


def export(
    cfg: ExperimentConfig, checkpoint_dir: str, out_dir: str, dtype: str = "int8"
) -> ExportReport:
    """Export ``checkpoint_dir`` to ``out_dir/model.pt`` (+ ``meta.json``) and compare it with the
    FP32 model on the test split (the validation split if there is no test split)."""
    os.makedirs(out_dir, exist_ok=True)
    fp32 = load_fp32(cfg, checkpoint_dir)
    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    cols = splits.test if len(splits.test) else splits.val
    first = to_batch(cols.read(0, 8), raw_layout(cfg))
    sample = (first.dense_features, first.sparse_features)
    fp32_tables = table_bytes(fp32)
    scripted, quant_tables = quantize_and_script(copy.deepcopy(fp32), dtype, sample)
    path = os.path.join(out_dir, MODEL_FILE)
    exported_bytes = _file_bytes(scripted, path)
    fp32_bytes = _file_bytes(fp32, os.path.join(out_dir, "fp32_state.pt"))
    os.remove(os.path.join(out_dir, "fp32_state.pt"))
    labels = np.asarray(
        cols.read(0, len(cols)).labels[:, cfg.loss.tasks[0].label_column], np.float64
    )
    a, b = _predict(fp32, cfg, cols), _predict(torch.jit.load(path), cfg, cols)
    ma, mb = binary_metrics(labels, a), binary_metrics(labels, b)
    report = ExportReport(
        path=path,
        dtype=dtype,
        fp32_bytes=fp32_bytes,
        exported_bytes=exported_bytes,
        fp32_table_bytes=fp32_tables,
        exported_table_bytes=quant_tables,
        fp32_auc=ma["auc"],
        exported_auc=mb["auc"],
        fp32_log_loss=ma["log_loss"],
        exported_log_loss=mb["log_loss"],
        max_prob_diff=float(np.abs(sigmoid(a) - sigmoid(b)).max()),
        rows=len(cols),
    )
    write_serving(cfg, os.path.join(out_dir, PREPARED_DIR))
    meta = {
        "prepared": PREPARED_DIR,
        "tasks": cfg.loss.names(),
        "num_dense": cfg.model.num_dense,
        "feature_names": cfg.embeddings.names(),
        "table_rows": cfg.embeddings.num_embeddings,
        "shared": cfg.embeddings.shared,
        "weighted": cfg.embeddings.weighted,
        "dtype": dtype,
        "report": asdict(report),
    }
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(meta, f, indent=2)
    return report
