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
    # workers of any trial that may share this worker's node and its host memory (a sweep runs
    # up to --max-concurrent trials at once); 0: this run's own local_world_size
    node_workers: int = 0

    @property
    def host_share(self) -> int:
        """How many workers the node's host memory is divided among."""
        return max(self.local_world_size, self.node_workers)

    @property
    def compute_device(self) -> str:
        """``cuda`` or ``cpu``: what TorchRec's planner ``Topology`` takes."""
        return self.device.type

    @property
    def is_main(self) -> bool:
        return self.rank == 0


CUBLAS_DETERMINISTIC = ":4096:8"  # the workspace setting cuBLAS needs to be deterministic


def deterministic_kernels(device: torch.device) -> None:
    """On a GPU worker, make torch choose deterministic kernels (``train.deterministic``):
    cuBLAS's workspace setting (read when the process makes its cuBLAS handle, so this runs
    before any training), torch's deterministic algorithms (warning, not failing, where an op has
    none) and cuDNN's deterministic mode. Not the mode's filling of every new tensor's memory
    (``fill_uninitialized_memory``, on with it by default): a debugging aid that writes each
    allocation once more (FBGEMM's outputs, TorchRec's all-to-all buffers) every step, where no
    kernel reads memory it did not write. A CPU worker is left as it is."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def current(use_gpu: bool, node_workers: int = 0) -> WorkerEnv:
    """This worker's env from the initialised process group and the LOCAL_* variables set by
    the launcher (Ray Train sets LOCAL_RANK / LOCAL_WORLD_SIZE, as torchrun does);
    ``node_workers`` as ``WorkerEnv`` has it."""
    if not dist.is_initialized():
        raise RuntimeError("no process group: launch through Ray Train or the test harness")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    env = WorkerEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size()))),
        device=device_for(use_gpu, local_rank),
        node_workers=node_workers,
    )
    if use_gpu:
        torch.cuda.set_device(env.device)
    return env


class PlacementError(RuntimeError):
    """A trial's workers are spread over nodes in a way TorchRec cannot shard for."""


def check_placement(placement: list[tuple[str, int, int]]) -> None:
    """``placement[rank] = (host, LOCAL_RANK, LOCAL_WORLD_SIZE)`` of every rank (a host: the
    node IP, by which Ray Train counts local ranks).

    TorchRec's planner takes one ``local_world_size`` and places shards on
    ``cuda:{rank % local_world_size}``, with rank ``r`` on host ``r // local_world_size``: every
    node must hold the same number of consecutive ranks. A best-effort placement that splits a
    trial 1 + 3 over two nodes breaks that; this names it before anything is sharded."""
    by_node: dict[str, list[int]] = {}
    for rank, (node, _, _) in enumerate(placement):
        by_node.setdefault(node, []).append(rank)
    sizes = {lws for _, _, lws in placement}
    size = next(iter(sizes))
    even = len(sizes) == 1 and all(len(r) == size for r in by_node.values())
    ordered = all(
        local == rank % size and ranks == list(range(ranks[0], ranks[0] + size))
        for ranks in by_node.values()
        for rank in ranks
        for _, local, _ in [placement[rank]]
    )
    if even and ordered:
        return
    where = "; ".join(f"host {n}: ranks {r}" for n, r in by_node.items())
    raise PlacementError(
        f"this trial's {len(placement)} workers are spread unevenly over {len(by_node)} nodes "
        f"({where}; LOCAL_WORLD_SIZE {sorted(sizes)}): TorchRec needs the same number of "
        "consecutive ranks on every node. Use a --num-workers that fits one node (its workers "
        "are then placed together), or a multiple of the GPUs per node with whole nodes free "
        "(e.g. --max-concurrent 1 for such trials)."
    )
