"""Restore a worker from its launcher's newest usable checkpoint.

Every rank verifies the checkpoint against its ``.metadata``; the ranks then agree (all must find
it usable) before any rank loads it, so a truncated or missing shard makes all of them skip to the
previous checkpoint together, never into a crash loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from recsys.distributed import checkpoint
from recsys.distributed.checkpoint import TrainState
from recsys.distributed.env import WorkerEnv
from recsys.train.reporting import Reporter


def all_ranks_agree(ok: bool, world_size: int) -> bool:
    flag = torch.tensor([1 if ok else 0])
    if world_size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore(
    reporter: Reporter, model: nn.Module, optimizer: Any, env: WorkerEnv, log: Callable[[str], None]
) -> TrainState:
    """Load the newest usable checkpoint; an incomplete or corrupt one is skipped with a warning
    naming it (all ranks decide together). No checkpoint: a fresh state."""
    for handle in reporter.checkpoints():
        with reporter.open_checkpoint(handle) as folder:
            reason = ""
            try:
                checkpoint.verify(folder, env.world_size)
            except checkpoint.CheckpointError as e:
                reason = str(e)
            if all_ranks_agree(not reason, env.world_size):
                state = checkpoint.load(folder, model, optimizer, env.rank, env.world_size)
                log(f"[rank {env.rank}] resumed from step {state.step} ({folder})")
                return state
            why = reason or "unusable on another rank"
            log(f"[rank {env.rank}] warning: skipping checkpoint {folder}: {why}")
            reporter.skip_names_of(handle)
    return TrainState()
