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
from recsys.distributed import preflight
from recsys.distributed.env import WorkerEnv
from recsys.distributed.sharding import init_tables, plan_summary, shard
from recsys.models import ModelAndLoss, build_model
from recsys.models.accounting import BYTES_PER_ELEMENT
from recsys.models.embeddings import table_inits, table_specs
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


def build(cfg: ExperimentConfig, env: WorkerEnv) -> Built:
    """The sharded ``ModelAndLoss`` of ``cfg`` on ``env``, seeded by ``cfg.train.seed``: as
    ``cfg`` trains on this device (``preflight.for_device``), after the refusals the driver
    made first (``preflight.check_kernels``; the constraints when the planner runs)."""
    cfg = preflight.for_device(cfg, env.device.type)
    preflight.check_kernels(cfg, env.device.type)
    torch.manual_seed(cfg.train.seed)
    seed = cfg.train.seed
    net = build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks), "meta", init_seed=seed)
    model = ModelAndLoss(net, cfg.loss)
    specs = table_specs(cfg.tables)
    half = cfg.embeddings.dtype != "fp32"
    names = [s.name for s in specs]
    dmp, estimate = shard(model, env, cfg.sharding, cfg.optim, names, cfg.train.batch_size, half)
    init_tables(dmp, table_inits(cfg.tables, seed))  # the same tables whatever the plan
    summary = plan_summary(
        dmp.plan,
        {s.name: (s.rows, s.dim) for s in specs},
        BYTES_PER_ELEMENT[cfg.embeddings.dtype],
        env.world_size,
    )
    summary["planner_estimate"] = {"hbm_per_rank": estimate.hbm, "ddr_per_rank": estimate.ddr}
    return Built(dmp, combined_optimizer(dmp, cfg.optim), summary)
