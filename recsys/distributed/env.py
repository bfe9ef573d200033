"""Device and process-group facts of one worker, chosen in one place.

GPU workers use NCCL and ``cuda:LOCAL_RANK``; CPU workers use gloo and ``cpu``. TorchRec places
shards on ``cuda:rank % local_world_size``, so the device must be ``cuda:LOCAL_RANK`` (a mismatch
gives "Local shard tensor device does not match"). The process group itself is created by the
launcher (Ray's ``TorchConfig``, or the test harness), never here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def backend_for(use_gpu: bool) -> str:
    """The process-group backend of a worker: ``nccl`` with GPUs, ``gloo`` without."""
    return "nccl" if use_gpu else "gloo"


def device_for(use_gpu: bool, local_rank: int) -> torch.device:
    return torch.device(f"cuda:{local_rank}") if use_gpu else torch.device("cpu")


@dataclass(frozen=True)
class WorkerEnv:
    """Where this worker stands: ranks, sizes and its device."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def compute_device(self) -> str:
        """``cuda`` or ``cpu``: what TorchRec's planner ``Topology`` takes."""
        return self.device.type

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current(use_gpu: bool) -> WorkerEnv:
    """This worker's env from the initialised process group and the LOCAL_* variables set by
    the launcher (Ray Train sets LOCAL_RANK / LOCAL_WORLD_SIZE, as torchrun does)."""
    if not dist.is_initialized():
        raise RuntimeError("no process group: launch through Ray Train or the test harness")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    env = WorkerEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size()))),
        device=device_for(use_gpu, local_rank),
    )
    if use_gpu:
        torch.cuda.set_device(env.device)
    return env
