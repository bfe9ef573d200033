"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

A checkpoint directory holds one ``__<rank>_0.distcp`` shard file per rank and ``.metadata``
(model incl. sharded tables, fused and dense optimizer state), plus one small
``worker_<rank>.pt`` per rank with what differs between ranks: step, data position and RNG
state. Everything loads with DCP or ``torch.load(weights_only=True)``: no arbitrary pickles.

With Ray Train every rank saves into its own local folder and reports it; Ray merges the folders
into one checkpoint directory on the run's storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn


@dataclass
class TrainState:
    """The loop's own state: steps done and rows this worker has consumed."""

    step: int = 0
    data_position: int = 0


def _worker_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"worker_{rank}.pt")


def save(
    folder: str,
    model: nn.Module,
    optimizer: Any,
    state: TrainState,
    rank: int,
    world_size: int,
) -> None:
    """Write this rank's part of a checkpoint into ``folder`` (collective: all ranks call it)."""
    os.makedirs(folder, exist_ok=True)
    dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=folder)
    torch.save(
        {
            "step": state.step,
            "data_position": state.data_position,
            "world_size": world_size,
            "torch_rng": torch.get_rng_state(),
        },
        _worker_file(folder, rank),
    )


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt or from another world size."""


def load(folder: str, model: nn.Module, optimizer: Any, rank: int, world_size: int) -> TrainState:
    """Restore model, optimizer and this rank's state in place (collective)."""
    worker = _worker_file(folder, rank)
    if not os.path.isfile(worker):
        raise CheckpointError(f"{folder}: {os.path.basename(worker)} is missing")
    extra = torch.load(worker, weights_only=True)
    if extra["world_size"] != world_size:
        raise CheckpointError(
            f"{folder}: saved by {extra['world_size']} workers, resuming with {world_size}; "
            "resume with the same number of workers"
        )
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(extra["torch_rng"])
    return TrainState(step=int(extra["step"]), data_position=int(extra["data_position"]))


def load_model_unsharded(folder: str, model: nn.Module) -> nn.Module:
    """Load a sharded checkpoint's model weights into an unsharded model (any process, no
    process group): DCP reassembles each table from its shards."""
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    model.load_state_dict(state["model"])
    return model
