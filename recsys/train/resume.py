"""Restore a worker from its launcher's newest usable checkpoint.

Every rank verifies the checkpoint against its ``.metadata``; the ranks then agree (all must find
it usable) before any rank loads it, so a truncated or missing shard makes all of them skip to the
previous checkpoint together, never into a crash loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from recsys.distributed import checkpoint, collectives
from recsys.distributed.checkpoint import TrainState
from recsys.distributed.env import WorkerEnv
from recsys.train.reporting import Reporter


def restore(
    reporter: Reporter, model: nn.Module, optimizer: Any, env: WorkerEnv, log: Callable[[str], None]
) -> TrainState:
    """Load the newest usable checkpoint; an incomplete or corrupt one is skipped with a warning
    naming it (all ranks decide together). No checkpoint: a fresh state."""
    for handle in reporter.checkpoints():
        with reporter.open_checkpoint(handle) as folder:
            reason = ""
            try:
                checkpoint.verify(folder)
            except checkpoint.CheckpointError as e:
                reason = str(e)
            if collectives.all_agree(not reason, env.device):
                state = checkpoint.load(folder, model, optimizer, env.rank, env.device)
                log(f"[rank {env.rank}] resumed from step {state.step} ({folder})")
                return state
            why = reason or "unusable on another rank"
            log(f"[rank {env.rank}] warning: skipping checkpoint {folder}: {why}")
            reporter.skip_names_of(handle)
    return TrainState()
