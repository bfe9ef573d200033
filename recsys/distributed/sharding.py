"""Sharding applied from outside the model: planner, constraints, fused optimizer, DMP.

The embedding optimizer is fused into the backward pass through the sharder's fused params
(FBGEMM ``EmbOptimType``), so embedding gradients are never materialised.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from recsys.config import (
    CUDA_ONLY_SHARDING,
    SHARDING_TYPES,
    OptimConfig,
    ShardingConfig,
    ShardingType,
    TableSharding,
)
from recsys.configlib import ConfigError, nearest
from recsys.distributed.env import WorkerEnv

EMB_OPTIMIZERS = {
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
    "adam": EmbOptimType.ADAM,
}


def fused_params(optim: OptimConfig) -> dict[str, Any]:
    """FBGEMM fused-optimizer parameters of the embedding tables."""
    return {
        "optimizer": EMB_OPTIMIZERS[optim.embedding_optimizer],
        "learning_rate": optim.embedding_lr,
        "eps": optim.eps,
    }


def sharders(optim: OptimConfig) -> list[ModuleSharder[nn.Module]]:
    return [EmbeddingBagCollectionSharder(fused_params=fused_params(optim))]  # type: ignore[list-item]


def _constraint(t: TableSharding) -> ParameterConstraints:
    kwargs: dict[str, Any] = {}
    if t.sharding_types:
        kwargs["sharding_types"] = list(t.sharding_types)
    if t.compute_kernels:
        kwargs["compute_kernels"] = list(t.compute_kernels)
    if t.min_partition is not None:
        kwargs["min_partition"] = t.min_partition
    return ParameterConstraints(**kwargs)


def constraints(
    cfg: ShardingConfig, table_names: list[str], compute_device: str, half: bool = False
) -> dict[str, ParameterConstraints]:
    """Per-table planner constraints; unknown table names and CUDA-only types on CPU are errors.

    Half-precision tables (``half``) are never data-parallel: those would be updated by the dense
    optimizer, whose epsilon (1e-8) is zero in half precision (0/0 = NaN); the fused FBGEMM
    optimizers keep their state in float32."""
    for name in cfg.tables:
        if name not in table_names:
            raise ConfigError(
                f"sharding.tables: unknown table {name!r}{nearest(name, table_names)}"
            )
    out = {}
    for name in table_names:
        t = cfg.tables.get(name, cfg.default)
        if half and "data_parallel" in t.sharding_types:
            raise ConfigError(f"sharding of {name}: data_parallel cannot hold fp16/bf16 tables")
        if half and not t.sharding_types:
            allowed: list[ShardingType] = [s for s in SHARDING_TYPES if s != "data_parallel"]
            if compute_device == "cpu":
                allowed = [s for s in allowed if s not in CUDA_ONLY_SHARDING]
            t = TableSharding(allowed, t.compute_kernels, t.min_partition)
        if compute_device == "cpu":
            bad = [s for s in t.sharding_types if s in CUDA_ONLY_SHARDING]
            if bad:
                raise ConfigError(
                    f"sharding of {name}: {bad[0]} needs CUDA; use table_wise, "
                    "column_wise or data_parallel on CPU"
                )
        if t.sharding_types or t.compute_kernels or t.min_partition is not None:
            out[name] = _constraint(t)
    return out


def plan(
    model: nn.Module,
    env: WorkerEnv,
    cfg: ShardingConfig,
    optim: OptimConfig,
    table_names: list[str],
    half: bool = False,
) -> ShardingPlan:
    """The planner's plan, agreed by all ranks (``collective_plan``)."""
    topology = Topology(
        world_size=env.world_size,
        local_world_size=env.local_world_size,
        compute_device=env.compute_device,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        constraints=constraints(cfg, table_names, env.compute_device, half),
    )
    return planner.collective_plan(model, sharders(optim), dist.GroupMember.WORLD)


def shard(
    model: nn.Module,
    env: WorkerEnv,
    cfg: ShardingConfig,
    optim: OptimConfig,
    table_names: list[str],
    half: bool = False,
) -> DistributedModelParallel:
    """Shard the model's embedding tables (created on ``meta``) and place the rest on the device;
    dense parts are data-parallel (DDP). ``half``: the tables are fp16/bf16."""
    sharding_plan = plan(model, env, cfg, optim, table_names, half)
    return DistributedModelParallel(
        module=model, device=env.device, plan=sharding_plan, sharders=sharders(optim)
    )


def plan_summary(
    sharding_plan: ShardingPlan,
    table_shapes: dict[str, tuple[int, int]],
    bytes_per_element: int,
    world_size: int,
) -> dict[str, Any]:
    """Table -> sharding type, kernel, ranks and shard shapes; embedding bytes per rank
    (a data-parallel table counts in full on every rank)."""
    tables: dict[str, Any] = {}
    per_rank: dict[int, int] = dict.fromkeys(range(world_size), 0)
    for module_path, module_plan in sharding_plan.plan.items():
        for table, ps in module_plan.items():  # type: ignore[attr-defined]
            shards = []
            spec = ps.sharding_spec
            for shard_md in getattr(spec, "shards", []) or []:
                rank = shard_md.placement.rank()
                size = list(shard_md.shard_sizes)
                per_rank[rank] = per_rank.get(rank, 0) + size[0] * size[1] * bytes_per_element
                shards.append(
                    {"rank": rank, "offsets": list(shard_md.shard_offsets), "sizes": size}
                )
            if ps.sharding_type == "data_parallel":
                rows, dim = table_shapes[table]
                for r in per_rank:
                    per_rank[r] += rows * dim * bytes_per_element
            tables[table] = {
                "module": module_path,
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks or []),
                "shards": shards,
            }
    return {"tables": tables, "embedding_bytes_per_rank": per_rank}
