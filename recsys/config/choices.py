"""The choices a config field takes (its ``Literal`` kinds), the validation metrics a run is
scored by, and the KJT key of a QR feature's remainder."""

from __future__ import annotations

from typing import Literal, get_args

from recsys.configlib import (
    ConfigError,
    nearest,
)

Interaction = Literal["dot", "cat", "sum", "dcn"]
TaskSharing = Literal["shared", "mmoe", "ple"]
MLPNorm = Literal["none", "batch", "layer"]
QROperation = Literal["mult", "add", "concat"]
Pooling = Literal["sum", "mean"]
SequencePooling = Literal["sum", "attention", "transformer"]
EmbeddingDType = Literal["fp32", "fp16", "bf16"]
LossKind = Literal["bce", "wbce", "mse"]
Source = Literal["synthetic", "prepared", "torchrec"]
SplitMode = Literal["fraction", "files"]
BadRowPolicy = Literal["error", "skip"]
EmbeddingOptimizer = Literal["exact_rowwise_adagrad", "exact_adagrad", "exact_sgd", "adam"]
EmbeddingDecayMode = Literal["l2", "decoupled"]
DenseOptimizer = Literal["adagrad", "sgd", "adam"]
DenseTables = Literal["dense", "embedding"]
Solver = Literal["sgd", "lbfgs"]
ShardingType = Literal["table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"]
ComputeKernel = Literal["fused", "dense"]
PipelineMode = Literal["auto", "on", "off"]
Mode = Literal["max", "min"]
# validation metrics a run is scored by (gauc: where the data's schema names group_by)
MONITORED = ("auc", "log_loss", "ne", "accuracy", "gauc")
MEAN_TASK = "mean"  # val_<metric>/mean: the average over the tasks

QR_SUFFIX = "__qr_r"  # the KJT key of a QR feature's remainder ids: f"{feature}{QR_SUFFIX}"
INTERACTIONS: tuple[Interaction, ...] = get_args(Interaction)
SHARDING_TYPES: tuple[ShardingType, ...] = get_args(ShardingType)
CUDA_ONLY_SHARDING: tuple[ShardingType, ...] = ("row_wise", "table_row_wise")


def monitor_parts(monitor: str) -> tuple[str, str | None]:
    """``val_auc/like`` -> ``("auc", "like")``; ``val_ne`` -> ``("ne", None)``; else an error."""
    name, _, task = monitor.partition("/")
    metric = name.removeprefix("val_")
    if not name.startswith("val_") or metric not in MONITORED or (_ and not task):
        options = [f"val_{m}" for m in MONITORED]
        raise ConfigError(
            f"train.monitor={monitor!r}: one of {options}, optionally /<task> or /mean "
            f"(val_auc/like){nearest(name, options)}"
        )
    return metric, task or None
