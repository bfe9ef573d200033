"""Every collective this project runs itself, with its tensors on the worker's device.

Ray creates the process group with one backend: NCCL on GPU workers, gloo on CPU ones. NCCL
serves CUDA tensors only (a collective on a CPU tensor raises), gloo serves both, so a CPU tensor
in a collective works in every CPU test and breaks every GPU run. Hence the rule, enforced by
``tests/unit/test_gpu_path.py``: no module but this one calls a ``torch.distributed``
collective, and each helper here takes the ``device`` its tensors live on (``WorkerEnv.device``).
Object collectives (``all_gather_objects``) are NCCL-safe once ``torch.cuda.set_device`` has run
(``recsys.distributed.env.current`` does it).

Why not a ``cpu:gloo,cuda:nccl`` group: Ray's ``TorchConfig`` creates one backend, TorchRec,
DMP and DCP run on the default group already, and what is reduced here is tiny (a flag, a loss,
metric sums and histograms), so device tensors cost nothing and need no second group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _world() -> int:
    return dist.get_world_size() if _initialised() else 1


def collective_device() -> torch.device:
    """The device a collective's tensors must be on for the default group: the current CUDA
    device under NCCL (a one-rank NCCL group's too), else CPU."""
    if _initialised() and "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_agree(ok: bool, device: torch.device) -> bool:
    """True on every rank iff ``ok`` is true on every rank."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    if _world() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def sum_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks, in place (``t`` on the worker's device); returns it."""
    if _world() > 1:
        dist.all_reduce(t)
    return t


def average_(tensors: list[torch.Tensor]) -> None:
    """Replace each tensor (floating point, on the worker's device) by its mean over ranks, in
    place: one all-reduce of them all, flattened. A no-op on one rank."""
    if _world() == 1 or not tensors:
        return
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        flat /= _world()
        start = 0
        for t in tensors:
            t.copy_(flat[start : start + t.numel()].view_as(t))
            start += t.numel()


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean over ranks of a scalar tensor on the worker's device."""
    t = value.detach().float().reshape(1).clone()
    return float(sum_(t).item()) / _world()


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (picklable objects)."""
    out: list[Any] = [None] * _world()
    if _world() == 1:
        return [obj]
    dist.all_gather_object(out, obj)
    return out


def exchange(rows: list[torch.Tensor], dest: torch.Tensor, device: torch.device
             ) -> list[torch.Tensor]:  # fmt: skip
    """Send each row to the rank ``dest`` names: ``rows`` are tensors of ``n`` rows each (any
    trailing shape and dtype), ``dest`` ``[n]`` int64 in ``[0, world)``; returns, per tensor,
    the rows every rank sent here, in rank order (a rank's rows in their order). Tensors move
    to ``device`` for the collective (the worker's: CUDA under NCCL) and come back on the CPU;
    one all-to-all of the counts, one per tensor. On one rank: the rows as they are."""
    world = _world()
    if world == 1:
        return [r.cpu() for r in rows]
    order = torch.argsort(dest.cpu(), stable=True)
    counts = torch.bincount(dest.cpu(), minlength=world).to(device)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    send, recv = counts.cpu().tolist(), got.cpu().tolist()
    out = []
    for r in rows:
        src = r.cpu()[order].contiguous().to(device)
        dst = torch.empty((sum(recv), *r.shape[1:]), dtype=r.dtype, device=device)
        dist.all_to_all_single(dst, src, output_split_sizes=recv, input_split_sizes=send)
        out.append(dst.cpu())
    return out


def barrier() -> None:
    if _world() > 1:
        dist.barrier()
