"""Sharding applied from outside the model: planner, constraints, fused optimizer, DMP.

The embedding optimizer is fused into the backward pass through the sharder's fused params
(FBGEMM ``EmbOptimType``), so embedding gradients are never materialised; so is the tables' weight
decay (``optim.embedding_weight_decay``: FBGEMM's ``weight_decay`` and ``weight_decay_mode``).
Every model (DLRM and the references) and every number of workers (one included) is sharded here,
so the fused parameters reach every table that a fused kernel trains.

The planner is told the machine it plans for (``topology``): the device's memory (a GPU's real
HBM, not TorchRec's default 32 GiB; on CPU the host memory per worker), the host memory per
worker, the number of workers per node, and the trial's batch size (TorchRec assumes 512). Its
per-rank memory estimate of the chosen plan is kept (``PlanEstimate``) for the reports and for
the feasibility check before a trial launches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    ParameterConstraints,
    ShardingOption,
    Stats,
    TopologyFactory,
    TrainerConfig,
)
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
from recsys.runtime.cluster import host_memory_bytes

EMB_OPTIMIZERS = {
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
    "adam": EmbOptimType.ADAM,
}


DECAY_MODES = {"l2": WeightDecayMode.L2, "decoupled": WeightDecayMode.DECOUPLE}


def fused_params(optim: OptimConfig) -> dict[str, Any]:
    """FBGEMM fused-optimizer parameters of the embedding tables.

    With ``optim.embedding_weight_decay`` also ``weight_decay`` and ``weight_decay_mode``
    (``WeightDecayMode.L2`` / ``DECOUPLE``; ``OptimConfig`` has refused what the optimizer
    lacks). The gradient FBGEMM gets is that of the global batch's mean loss on any number of
    workers (TorchRec divides the workers' sum by their number: its ``gradient_division``, on by
    default), as DDP's for the dense part, so L2's ``wd * w`` weighs alike on one worker and
    several."""
    params: dict[str, Any] = {
        "optimizer": EMB_OPTIMIZERS[optim.embedding_optimizer],
        "learning_rate": optim.embedding_lr,
        "eps": optim.eps,
    }
    wd, mode = optim.embedding_weight_decay, optim.embedding_weight_decay_mode
    if wd > 0:
        params["weight_decay"] = wd
        params["weight_decay_mode"] = DECAY_MODES[mode]
    return params


def held_dense(cfg: ShardingConfig, table_names: list[str]) -> bool:
    """Whether every table is held dense (data-parallel, the ``dense`` kernel): no fused
    embedding optimizer trains any of them."""
    for name in table_names:
        t = cfg.tables.get(name, cfg.default)
        if t.sharding_types != ["data_parallel"] and t.compute_kernels != ["dense"]:
            return False
    return True


def check_fused_decay(optim: OptimConfig, device_type: str, half: bool) -> None:
    """Refuse an embedding weight decay that FBGEMM would silently drop. Its CPU backward of
    ``exact_rowwise_adagrad`` over fp32 tables takes a fast path, FBGEMM's ``SparseAdaGrad``
    kernel, called with ``weight_decay=0`` whatever it was given (``embedding_backward_split_cpu_
    template.cpp`` in FBGEMM 1.6 to 1.8, every supported stack); its generic CPU path (fp16
    tables) and its CUDA kernels apply it. ``half``: the tables are fp16/bf16."""
    wd = optim.embedding_weight_decay
    if wd > 0 and device_type == "cpu" and not half:
        raise ConfigError(
            f"optim.embedding_weight_decay={wd!r}: FBGEMM's CPU kernel for fp32 tables ignores "
            "weight decay; use embeddings.dtype='fp16' on CPU workers (its CPU kernel applies "
            "it), GPU workers, or 0"
        )


def sharders(optim: OptimConfig) -> list[ModuleSharder[nn.Module]]:
    """The sharders of the model's embedding collection, with ``fused_params``."""
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

    A table is data-parallel only where its ``sharding`` names ``data_parallel``. Left to itself,
    TorchRec's planner makes small tables data-parallel on GPUs (replicated, ``dense`` kernel),
    and those are trained by the dense optimizer at ``optim.lr`` instead of the fused embedding
    optimizer at ``optim.embedding_lr``: which tables that hits would change with the number of
    GPUs, and with it the model a trial trains. Every table the user did not pin stays in the
    fused optimizer. Half-precision tables (``half``) are never data-parallel: the dense
    optimizer's epsilon (1e-8) is zero in half precision (0/0 = NaN); the fused FBGEMM
    optimizers keep their state in float32."""
    for name in cfg.tables:
        if name not in table_names:
            raise ConfigError(
                f"sharding.tables: unknown table {name!r}{nearest(name, table_names)}"
            )
    return {name: _table_constraint(name, cfg, compute_device, half) for name in table_names}


def _table_constraint(
    name: str, cfg: ShardingConfig, compute_device: str, half: bool
) -> ParameterConstraints:
    """One table's constraints (``constraints``): its own or the default, checked, and without
    ``data_parallel`` unless named there or the ``dense`` kernel alone is (TorchRec's ``dense``
    kernel is its data-parallel one: the only type that can meet it)."""
    t = cfg.tables.get(name, cfg.default)
    key = f"sharding.tables.{name}" if name in cfg.tables else f"sharding.default (table {name})"
    if t.compute_kernels == ["dense"] and not t.sharding_types:  # TorchRec's dense: replicas only
        t = TableSharding(["data_parallel"], t.compute_kernels, t.min_partition)
    if half and "data_parallel" in t.sharding_types:
        raise ConfigError(f"{key}: data_parallel (the dense kernel) cannot hold "
                          "fp16/bf16 tables: set embeddings.dtype to fp32")  # fmt: skip
    if compute_device == "cpu":
        bad = [s for s in t.sharding_types if s in CUDA_ONLY_SHARDING]
        if bad:
            raise ConfigError(
                f"{key}: {bad[0]} needs CUDA; use table_wise, column_wise or data_parallel on CPU"
            )
    if not t.sharding_types:
        allowed: list[ShardingType] = [s for s in SHARDING_TYPES if s != "data_parallel"]
        if compute_device == "cpu":
            allowed = [s for s in allowed if s not in CUDA_ONLY_SHARDING]
        t = TableSharding(allowed, t.compute_kernels, t.min_partition)
    return _constraint(t)


class DataParallelSpecNote(logging.Filter):
    """Drops one TorchRec log line: its plan validation logs "Sharding spec not found for <table>"
    on the root logger for every data-parallel table, which is replicated and has no sharding
    spec by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Sharding spec not found for ")


def quiet_plan_notes() -> None:
    root = logging.getLogger()
    if not any(isinstance(f, DataParallelSpecNote) for f in root.filters):
        root.addFilter(DataParallelSpecNote())


@dataclass(frozen=True)
class Machine:
    """What one worker may use, as the planner sees it.

    Attributes:
        device: ``cuda`` or ``cpu``. hbm: bytes of the worker's GPU (None on CPU).
        ddr: host memory per worker (the node's memory over every worker that may run on it:
            ``WorkerEnv.host_share``); on CPU it is also the device's memory.
    """

    device: str
    hbm: int | None
    ddr: int

    @classmethod
    def of(cls, env: WorkerEnv) -> Machine:
        """This worker's: the GPU's real memory, the host's memory over the workers that may share
        the node (this run's, and other trials' where a sweep runs several at once)."""
        hbm = None
        if env.device.type == "cuda":
            hbm = int(torch.cuda.get_device_properties(env.device).total_memory)
        return cls(env.compute_device, hbm, host_memory_bytes() // env.host_share)


def topology(world_size: int, local_world_size: int, machine: Machine) -> Topology:
    """TorchRec's ``Topology`` through ``TopologyFactory`` (as TorchRec 1.8 asks), with the real
    memory of the machine instead of TorchRec's defaults (32 GiB HBM, 128 GiB host)."""
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=local_world_size),
        hardware_config=HardwareConfig(hbm_cap_bytes=machine.hbm, ddr_cap_bytes=machine.ddr),
        kernel_config=KernelConfig(compute_device=machine.device),
    )


@dataclass
class PlanEstimate(Stats):
    """A planner ``Stats`` hook that keeps the chosen plan's estimated bytes per rank (HBM and
    host), instead of logging TorchRec's table of them."""

    hbm: dict[int, int] = field(default_factory=dict)
    ddr: dict[int, int] = field(default_factory=dict)

    def log(self, *args: Any, best_plan: list[ShardingOption] | None = None, **kw: Any) -> None:
        self.hbm, self.ddr = {}, {}
        for option in best_plan or []:
            for shard_ in option.shards:
                if shard_.rank is None or shard_.storage is None:
                    continue
                self.hbm[shard_.rank] = self.hbm.get(shard_.rank, 0) + int(shard_.storage.hbm)
                self.ddr[shard_.rank] = self.ddr.get(shard_.rank, 0) + int(shard_.storage.ddr)


def planner(
    cfg: ShardingConfig,
    table_names: list[str],
    machine: Machine,
    world_size: int,
    local_world_size: int,
    batch_size: int,
    half: bool = False,
) -> tuple[EmbeddingShardingPlanner, PlanEstimate]:
    """The planner for ``world_size`` workers of ``machine`` at ``batch_size`` per worker."""
    quiet_plan_notes()
    estimate = PlanEstimate()
    return (
        EmbeddingShardingPlanner(
            topology=topology(world_size, local_world_size, machine),
            batch_size=batch_size,
            constraints=constraints(cfg, table_names, machine.device, half),
            stats=[estimate],
        ),
        estimate,
    )


def plan(
    model: nn.Module,
    env: WorkerEnv,
    cfg: ShardingConfig,
    optim: OptimConfig,
    table_names: list[str],
    batch_size: int,
    half: bool = False,
) -> tuple[ShardingPlan, PlanEstimate]:
    """The planner's plan, agreed by all ranks (``collective_plan``; rank 0 plans), and rank 0's
    estimate of it (empty on the other ranks)."""
    p, estimate = planner(
        cfg, table_names, Machine.of(env), env.world_size, env.local_world_size, batch_size, half
    )
    return p.collective_plan(model, sharders(optim), dist.GroupMember.WORLD), estimate


def shard(
    model: nn.Module,
    env: WorkerEnv,
    cfg: ShardingConfig,
    optim: OptimConfig,
    table_names: list[str],
    batch_size: int,
    half: bool = False,
) -> tuple[DistributedModelParallel, PlanEstimate]:
    """Shard the model's embedding tables (created on ``meta``) and place the rest on the device;
    dense parts are data-parallel (DDP). ``half``: the tables are fp16/bf16."""
    if not held_dense(cfg, table_names):
        check_fused_decay(optim, env.device.type, half)
    sharding_plan, estimate = plan(model, env, cfg, optim, table_names, batch_size, half)
    dmp = DistributedModelParallel(
        module=model, device=env.device, plan=sharding_plan, sharders=sharders(optim)
    )
    return dmp, estimate


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


def init_tables(model: nn.Module, inits: dict[str, Any]) -> None:
    """Refill every embedding table's local part from its place in the table
    (``recsys.models.embeddings.TableInit.fill``): TorchRec runs a table's ``init_fn`` on each
    local shard without its offsets, so row- and column-wise shards would all start like the
    table's first rows and columns, and the initial model would depend on the plan. After this,
    the tables are the unsharded model's whatever the plan and the number of ranks.

    ``inits``: per table name, its ``TableInit`` (``recsys.models.embeddings.table_inits``)."""
    for key, value in model.state_dict().items():
        table = key.rsplit(".", 2)[-2] if key.endswith(".weight") else ""
        if ".embedding_bags." not in key or table not in inits:
            continue
        init = inits[table]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                r0, c0 = shard.metadata.shard_offsets
                init.fill(shard.tensor, r0, c0, value.size(1))
        else:  # data-parallel: the whole table, on every rank
            init.fill(value, 0, 0, value.shape[1])
