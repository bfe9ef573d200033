"""From a trained checkpoint to a servable model, with TorchRec's inference workflow.

1. the model is built with its tables on ``meta`` and its dense part loaded from the checkpoint;
2. TorchRec's ``QuantEmbeddingBagCollection`` is built with its kernels' memory allocated once;
   each table in turn is read from the sharded checkpoint in FP32 (whatever it was trained in;
   DCP converts on load), quantized row-wise with TorchRec's own rule (``quantize_state_dict``:
   INT8 by default, INT4 or FP16 selectable) into its place there, and dropped, so the export
   never holds more than the quantized tables, one FP32 table and the dense part (a
   ``criteo_terabyte`` model's FP32 tables alone are about 125 GB);
3. the QR id split goes in front (``WithRawIds``) so the exported model takes raw ids; the
   quantized tables stay unsharded (sharding them for inference would copy each into new
   kernels: twice the quantized tables' memory);
4. it is traced with TorchRec's fx tracer and scripted (TorchScript), so it loads with
   ``torch.jit.load`` and no Python model code (``import torchrec`` registers the KJT type and
   FBGEMM's ops).

The exported model is checked against the FP32 model on a sample of the test split (its first
``SAMPLE_ROWS`` rows; the validation split's if there is no test split): while a table is in
memory in FP32, the sample's bags are pooled from it, and the FP32 model's scores come from the
dense part over those pooled values, so the comparison needs no whole FP32 model either. Sizes
are computed from shapes (FP32) and from the written file (exported).

QR tables (two ordinary tables each), tables that several features share (one TorchRec table
listing them all, quantized once) and mixed dims survive: all are plain TorchRec tables and the id
split and projections are scriptable. Weighted lists (``embeddings.weighted``) too: the quantized
collection takes the trained one's ``is_weighted`` (built from the config, never
from the input, since a collection whose flag is off ignores a KJT's weights), so the exported
model takes a weighted KJT (``qr_split_kjt`` carries the weights) and ``meta.json`` lists the
weighted features (``weighted``) beside ``shared``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from recsys.config import ExperimentConfig, SparseLayout
from recsys.data import RowSource
from recsys.data.dataset import write_serving
from recsys.data.input.loader import load_splits, to_batch
from recsys.data.prepared.remote import localised_for_export
from recsys.distributed.checkpoint import load_model_unsharded
from recsys.metrics.binary import binary_metrics, sigmoid
from recsys.models import ModelAndLoss, build_model
from recsys.models.dlrm import WithRawIds
from recsys.models.sequence import LEAF_MODULES
from recsys.runtime import storage
from recsys.serving.scorer import META_FILE, MODEL_FILE, PREPARED_DIR

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
    return WithRawIds(model, cfg.embeddings.layout().split()).eval()


def raw_layout(cfg: ExperimentConfig) -> SparseLayout:
    """The serving input: raw ids (mod table rows; a sequence's by position), not split; the
    model splits them."""
    emb = cfg.embeddings
    return SparseLayout(emb.names(), list(emb.num_embeddings), sequences=dict(emb.sequences))


SAMPLE_ROWS = 65_536  # test rows scored by the FP32 and the exported model to compare them
CHUNK_ROWS = 4096  # rows per forward while scoring


def checkpoint_key(collection: str, table: str) -> str:
    """The DCP key of a table's weight: the training state dict's ``model`` (a ``ModelAndLoss``
    whose ``model`` is the architecture), then the collection's path in the architecture."""
    return f"model.model.{collection}.embedding_bags.{table}.weight"


def collections(model: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    """The model's embedding collections by path."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]


def _swap(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def load_dense(cfg: ExperimentConfig, checkpoint_dir: str) -> nn.Module:
    """The trained architecture in eval mode, its tables left on ``meta`` and everything else
    (MLPs, interaction, projections, batch norm statistics) loaded from the checkpoint."""
    fp32 = dataclasses.replace(cfg.embeddings, dtype="fp32")
    arch = build_model(cfg.model, fp32, len(cfg.loss.tasks), embedding_device="meta")
    wrapper = ModelAndLoss(arch, cfg.loss)
    state = {"model": {k: v for k, v in wrapper.state_dict().items() if not v.is_meta}}
    dcp.load(state, checkpoint_id=checkpoint_dir, no_dist=True)
    wrapper.load_state_dict(state["model"], strict=False)
    return arch.eval()


class _Inputs(nn.Module):
    """Stands in for a collection while the sample runs through the model: keeps each KJT it is
    given and returns zeros of its output's shape, ``[B, sum of its features' dims]``."""

    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        super().__init__()
        configs = ebc.embedding_bag_configs()
        self.keys = [f for t in configs for f in t.feature_names]
        self.dims = [t.embedding_dim for t in configs for _ in t.feature_names]
        self.seen: list[KeyedJaggedTensor] = []

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        self.seen.append(kjt)
        return KeyedTensor(self.keys, self.dims, torch.zeros(kjt.stride(), sum(self.dims)))


class _Pooled(nn.Module):
    """Stands in for a collection with the sample's pooled values (``values``: ``[N, sum of
    dims]``), returning rows ``start ..`` of them for each batch."""

    def __init__(self, keys: list[str], dims: list[int], values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.dims, self.values, self.start = keys, dims, values, 0

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        rows = self.values[self.start : self.start + kjt.stride()]
        return KeyedTensor(self.keys, self.dims, rows)


def sample_inputs(
    model: nn.Module, cfg: ExperimentConfig, rows: RowSource
) -> dict[str, list[KeyedJaggedTensor]]:
    """What each collection is given for the sample ``rows``, chunk by chunk (the KJT after the
    QR split): the model runs with ``_Inputs`` in place of its collections (swapped back after)."""
    found = collections(model)
    inputs = {path: _Inputs(ebc) for path, ebc in found}
    for path, stand_in in inputs.items():
        _swap(model, path, stand_in)
    raw = WithRawIds(model, cfg.embeddings.layout().split())
    with torch.no_grad():
        for i in range(0, len(rows), CHUNK_ROWS):
            b = to_batch(rows.read(i, i + CHUNK_ROWS), raw_layout(cfg))
            raw(b.dense_features, b.sparse_features)
    for path, ebc in found:
        _swap(model, path, ebc)
    return {path: stand_in.seen for path, stand_in in inputs.items()}


def pool(weight: torch.Tensor, kjt: KeyedJaggedTensor, feature: str, mean: bool) -> torch.Tensor:
    """``[B, dim]``: ``feature``'s bags in ``kjt`` pooled from ``weight`` as TorchRec's
    collection pools them (sum, or mean; weighted by the KJT's weights where it has them)."""
    jt = kjt[feature]
    return torch.nn.functional.embedding_bag(
        jt.values().long(),
        weight,
        jt.offsets().long(),
        mode="mean" if mean else "sum",
        per_sample_weights=jt.weights_or_none(),
        include_last_offset=True,
    )


class _Weight(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)


def quantize_table(name: str, weight: torch.Tensor, data_type: Any) -> tuple[Any, Any]:
    """One FP32 table quantized by TorchRec's own rule (``quantize_state_dict``, what
    ``QuantEmbeddingBagCollection.from_float`` runs): ``(rows, per-row scale and bias)``."""
    from torchrec.quant.embedding_modules import quantize_state_dict

    holder = nn.Module()
    holder.embedding_bags = nn.ModuleDict({name: _Weight(weight)})
    out: dict[str, Any] = {}
    quantize_state_dict(holder, out, {name: data_type})
    return out[name]


@dataclass
class Tables:
    """What the pass over the tables made: the quantized collections by path, the sample's FP32
    stand-ins by path, and the FP32 and quantized table bytes."""

    quantized: dict[str, nn.Module]
    pooled: dict[str, _Pooled]
    fp32_bytes: int = 0
    quant_bytes: int = 0


TableReader = Callable[[str, Any], torch.Tensor]  # (collection path, table config) -> [rows, dim]


def convert_tables(
    model: nn.Module,
    dtype: str,
    read: TableReader,
    inputs: dict[str, list[KeyedJaggedTensor]] | None = None,
) -> Tables:
    """Quantize every table of every collection, one at a time: ``read`` gives it in FP32, the
    sample's bags (``inputs``, if given) are pooled from it, then it is let go, so at most one
    FP32 table that ``read`` made is alive at a time."""
    from torchrec.modules.embedding_configs import PoolingType, dtype_to_data_type
    from torchrec.quant.embedding_modules import (
        EmbeddingBagCollection as QuantEmbeddingBagCollection,
    )

    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    out = Tables({}, {})
    for path, ebc in collections(model):
        configs = copy.deepcopy(ebc.embedding_bag_configs())
        for table in configs:
            table.data_type = dtype_to_data_type(DTYPES[dtype])
        # rows unpadded on CPU (TorchRec's sharded CPU kernels use 1; 16 is for CUDA's)
        quant = QuantEmbeddingBagCollection(
            configs, ebc.is_weighted(), torch.device("cpu"), torch.float, None,
            register_tbes=True, cache_features_order=True, row_alignment=1,
        )  # fmt: skip
        rows_of = quantized_rows(quant)  # where each table's quantized rows go, allocated once
        pooled = {}
        for table in configs:
            weight = read(path, table).float()
            mean = table.pooling == PoolingType.MEAN
            for f in table.feature_names if inputs is not None else []:
                bags = inputs[path]  # type: ignore[index]
                pooled[f] = torch.cat([pool(weight, kjt, f, mean) for kjt in bags])
            rows, scale_bias = quantize_table(table.name, weight, table.data_type)
            dest_rows, dest_scale_bias = rows_of[table.name]
            dest_rows.copy_(rows)
            if scale_bias is not None:
                dest_scale_bias.copy_(scale_bias)
            out.fp32_bytes += weight.numel() * 4
            out.quant_bytes += sum(t.numel() * t.element_size() for t in (rows, scale_bias)
                                   if t is not None)  # fmt: skip
            del weight, rows, scale_bias
        out.quantized[path] = quant
        if inputs is not None:
            keys = [f for t in configs for f in t.feature_names]
            dims = [t.embedding_dim for t in configs for _ in t.feature_names]
            out.pooled[path] = _Pooled(keys, dims, torch.cat([pooled[f] for f in keys], dim=1))
    return out


def quantized_rows(quant: nn.Module) -> dict[str, Any]:
    """Allocate the quantized collection's tables (FBGEMM's inference TBEs, built without
    weights) and return each table's ``(rows, scale and bias)`` views into them, to be filled
    one table at a time, as ``assign_embedding_weights`` fills them from a list."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen as TBE,
    )

    out = {}
    for tbe in quant.modules():
        if isinstance(tbe, TBE):
            tbe.initialize_weights()
            views = tbe.split_embedding_weights()
            out.update({spec[0]: views[i] for i, spec in enumerate(tbe.embedding_specs)})
    return out


def checkpoint_reader(checkpoint_dir: str) -> TableReader:
    """Tables read from a sharded checkpoint, in FP32 whatever their shards and dtype."""

    def read(collection: str, table: Any) -> torch.Tensor:
        key = checkpoint_key(collection, table.name)
        state = {key: torch.empty(table.num_embeddings, table.embedding_dim)}
        dcp.load(state, checkpoint_id=checkpoint_dir, no_dist=True)
        return state[key]

    return read


def memory_reader(model: nn.Module) -> TableReader:
    """Tables of a model whose tables are in memory (tests, small models)."""

    def read(collection: str, table: Any) -> torch.Tensor:
        ebc: Any = model.get_submodule(collection)
        return ebc.embedding_bags[table.name].weight.detach()

    return read


def swap_in(model: nn.Module, modules: Mapping[str, nn.Module]) -> nn.Module:
    """``model`` with the modules at their paths replaced (in place)."""
    for path, module in modules.items():
        _swap(model, path, module)
    return model


def script(model: nn.Module, sample: tuple[torch.Tensor, Any]) -> torch.jit.ScriptModule:
    """Trace a quantized model (raw ids in) with TorchRec's fx tracer and script it. ``sample``
    (dense, raw KJT) runs once first, as a check that the model scores. The quantized tables are
    scripted where they are, unsharded: sharding them for inference (``shard_quant_model``)
    would copy every table into new kernels, twice the quantized model's memory at its peak;
    a serving host that wants them on several GPUs shards the loaded model itself."""
    from torchrec.fx import symbolic_trace

    with torch.no_grad():
        model(*sample)
    return torch.jit.script(symbolic_trace(model, leaf_modules=LEAF_MODULES))


def quantize_and_script(
    model: nn.Module, dtype: str, sample: tuple[torch.Tensor, Any]
) -> tuple[torch.jit.ScriptModule, int]:
    """A model with its FP32 tables in memory (raw ids in), quantized,
    traced and scripted (consumed); returns the scripted module and its table bytes."""
    tables = convert_tables(model, dtype, memory_reader(model))
    return script(swap_in(model, tables.quantized), sample), tables.quant_bytes


def _scores(
    model: Any, cfg: ExperimentConfig, rows: RowSource, stand_ins: list[_Pooled]
) -> np.ndarray:
    """The first task's logits of ``rows``, chunk by chunk (``stand_ins`` follow the chunks)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(rows), CHUNK_ROWS):
            for s in stand_ins:
                s.start = i
            b = to_batch(rows.read(i, i + CHUNK_ROWS), raw_layout(cfg))
            out.append(model(b.dense_features, b.sparse_features)[:, 0].float())
    return torch.cat(out).numpy()


def dense_bytes(model: nn.Module) -> int:
    """Bytes of everything but the tables (parameters and buffers, FP32 as trained)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)


def export(
    cfg: ExperimentConfig,
    checkpoint_dir: str,
    out_dir: str,
    dtype: str = "int8",
    sample_rows: int = SAMPLE_ROWS,
) -> ExportReport:
    """Export ``checkpoint_dir`` to ``out_dir/model.pt`` (+ ``meta.json``), table by table (the
    module docstring), and compare it with the FP32 model on the first ``sample_rows`` rows of the
    test split (the validation split if there is no test split). A checkpoint in an object store
    (a URI) is downloaded to a temporary local folder first; a prepared folder in one is read
    through a local cache of the rows the export reads (``recsys.data.prepared.remote``)."""
    cfg = localised_for_export(cfg, sample_rows)  # a prepared folder in an object store
    with storage.local_folder(checkpoint_dir) as local:
        return _export(cfg, local, out_dir, dtype, sample_rows)


def _export(
    cfg: ExperimentConfig, checkpoint_dir: str, out_dir: str, dtype: str, sample_rows: int
) -> ExportReport:
    os.makedirs(out_dir, exist_ok=True)
    model = load_dense(cfg, checkpoint_dir)
    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    cols = splits.test if len(splits.test) else splits.val
    rows = cols.slice(0, min(sample_rows, len(cols)))
    inputs = sample_inputs(model, cfg, rows)
    tables = convert_tables(model, dtype, checkpoint_reader(checkpoint_dir), inputs)
    del inputs
    fp32_bytes = tables.fp32_bytes + dense_bytes(model)
    qr = cfg.embeddings.layout().split()
    reference = swap_in(copy.deepcopy(model), tables.pooled)  # tables on meta: not copied
    a = _scores(WithRawIds(reference, qr), cfg, rows, list(tables.pooled.values()))
    del reference, tables.pooled
    first = to_batch(rows.read(0, 8), raw_layout(cfg))
    exported = WithRawIds(swap_in(model, tables.quantized), qr)
    del tables.quantized
    scripted = script(exported, (first.dense_features, first.sparse_features))
    path = os.path.join(out_dir, MODEL_FILE)
    torch.jit.save(scripted, path)
    del scripted, exported, model
    b = _scores(torch.jit.load(path), cfg, rows, [])
    labels = np.asarray(
        rows.read(0, len(rows)).labels[:, cfg.loss.tasks[0].label_column], np.float64
    )
    ma, mb = binary_metrics(labels, a), binary_metrics(labels, b)
    report = ExportReport(
        path=path,
        dtype=dtype,
        fp32_bytes=fp32_bytes,
        exported_bytes=os.path.getsize(path),
        fp32_table_bytes=tables.fp32_bytes,
        exported_table_bytes=tables.quant_bytes,
        fp32_auc=ma["auc"],
        exported_auc=mb["auc"],
        fp32_log_loss=ma["log_loss"],
        exported_log_loss=mb["log_loss"],
        max_prob_diff=float(np.abs(sigmoid(a) - sigmoid(b)).max()),
        rows=len(rows),
    )
    write_meta(cfg, out_dir, dtype, report)
    return report


def write_meta(cfg: ExperimentConfig, out_dir: str, dtype: str, report: ExportReport) -> None:
    """The serving side's files beside the model: the prepared folder's serving part and
    ``meta.json``."""
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
