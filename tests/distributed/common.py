"""Configs and helpers shared by the multi-process tests (importable by spawned ranks)."""

from __future__ import annotations

from typing import Any

from recsys.config import ExperimentConfig


def tiny_config(**overrides: Any) -> ExperimentConfig:
    """A tiny DLRM on synthetic data whose tables are really sharded on 2 ranks: small tables
    table-wise, the large one column-wise in two halves, one QR-split table."""
    base = {
        "embeddings": {
            "num_embeddings": [40, 60, 80, 900, 4000],
            "dim": 16,
            "qr": {"threshold": 1000, "collisions": 8},
        },
        "model": {"num_dense": 13, "bottom_mlp": [16], "top_mlp": [16]},
        "data": {"synthetic": {"num_samples": 3000, "seed": 2}},
        "train": {
            "steps": 12,
            "batch_size": 32,
            "eval_every": 6,
            "checkpoint_every": 6,
            "log_every": 2,
            "seed": 5,
        },
        "optim": {"lr": 0.05, "embedding_lr": 0.05},
        "sharding": {
            "default": {"sharding_types": ["table_wise"]},
            "tables": {"t_cat_3": {"sharding_types": ["column_wise"], "min_partition": 8}},
            "pipeline": "off",
        },
    }
    cfg = ExperimentConfig.from_dict(base)
    return cfg.with_overrides(overrides) if overrides else cfg


def copy_full_into_sharded(local: dict, full: dict) -> None:
    """Copy full (unsharded) tensors into a sharded state dict's local shards, in place."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for name, dst in local.items():
            src = full[name]
            if isinstance(dst, ShardedTensor):
                for shard in dst.local_shards():
                    (r0, c0), (r, c) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(src[r0 : r0 + r, c0 : c0 + c])
            else:
                dst.copy_(src)


def own_data_config(folder):
    """A tiny DLRM on a prepared folder (multi-hot bags, two tasks): the largest table QR-split,
    ``t_tags`` column-wise, the others table-wise."""
    from recsys.data.dataset import resolve
    from recsys.data.meta import read_meta

    sizes = read_meta(folder)["table_sizes"]
    cfg = ExperimentConfig.from_dict(
        {
            "data": {"source": "prepared", "paths": [folder]},
            "embeddings": {
                "dim": 16,
                "qr": {"threshold": sorted(sizes)[-2], "collisions": 8},
            },
            "model": {"bottom_mlp": [16], "top_mlp": [16]},
            "train": {"steps": 12, "batch_size": 32, "seed": 5},
            "optim": {"embedding_optimizer": "exact_adagrad"},
            "sharding": {
                "default": {"sharding_types": ["table_wise"]},
                "tables": {"t_tags": {"sharding_types": ["column_wise"], "min_partition": 8}},
                "pipeline": "off",
            },
        }
    )
    return resolve(cfg)
