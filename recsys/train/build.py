"""Build one worker's training objects: the sharded model, its optimizer, the plan summary.

The model is created with its tables on ``meta``; ``recsys.distributed.sharding`` shards it from
outside (planner, constraints, fused FBGEMM optimizer, DMP), then the dense optimizer is combined
with DMP's fused embedding optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.distributed.env import WorkerEnv
from recsys.distributed.sharding import init_tables, plan_summary, shard
from recsys.models import ModelAndLoss, build_model
from recsys.models.accounting import BYTES_PER_ELEMENT
from recsys.models.embeddings import init_ranges, table_specs
from recsys.train.optim import combined_optimizer


@dataclass
class Built:
    """What ``build`` returns.

    Attributes:
        model: ``DistributedModelParallel`` over ``ModelAndLoss``: ``model(batch) -> (loss, out)``.
        optimizer: the combined optimizer (fused embedding + dense).
        plan: table -> sharding type, ranks, shards; embedding bytes per rank
            (``recsys.distributed.sharding.plan_summary``).
    """

    model: nn.Module
    optimizer: Any
    plan: dict[str, Any]


def check_dtype(cfg: ExperimentConfig, env: WorkerEnv) -> None:
    """What FBGEMM's CPU kernels lack, refused clearly on CPU workers: bf16 tables and the
    fused embedding Adam."""
    if cfg.embeddings.dtype == "bf16" and env.device.type == "cpu":
        raise ConfigError(
            "embeddings.dtype='bf16': FBGEMM's CPU kernels have no bf16 tables; "
            "use fp16 on CPU (bf16 needs GPU workers)"
        )
    if cfg.optim.embedding_optimizer == "adam" and env.device.type == "cpu":
        raise ConfigError(
            "optim.embedding_optimizer='adam': FBGEMM's CPU kernels have no fused Adam; use "
            "exact_rowwise_adagrad, exact_adagrad or exact_sgd on CPU (adam needs GPU workers)"
        )


def build(cfg: ExperimentConfig, env: WorkerEnv) -> Built:
    """The sharded ``ModelAndLoss`` of ``cfg`` on ``env``, seeded by ``cfg.train.seed``."""
    check_dtype(cfg, env)
    torch.manual_seed(cfg.train.seed)
    seed = cfg.train.seed
    net = build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks), "meta", init_seed=seed)
    model = ModelAndLoss(net, cfg.loss)
    specs = table_specs(cfg.tables)
    half = cfg.embeddings.dtype != "fp32"
    names = [s.name for s in specs]
    dmp, estimate = shard(model, env, cfg.sharding, cfg.optim, names, cfg.train.batch_size, half)
    init_tables(dmp, init_ranges(cfg.tables, seed))  # the same tables whatever the plan
    summary = plan_summary(
        dmp.plan,
        {s.name: (s.rows, s.dim) for s in specs},
        BYTES_PER_ELEMENT[cfg.embeddings.dtype],
        env.world_size,
    )
    summary["planner_estimate"] = {"hbm_per_rank": estimate.hbm, "ddr_per_rank": estimate.ddr}
    return Built(dmp, combined_optimizer(dmp, cfg.optim), summary)
