"""Inspect sharded tables (as Twitter's recommender ``log_sharded_tensor_content``): what each rank
holds, and a table's full content gathered on rank 0.

    for line in describe(model): print(line)         # every rank, e.g. from a debugger
    full = gather_table(model, "t_cat_3")              # collective; on rank 0 (CPU), else None

The gather runs on the process group's device (the current GPU under NCCL, which serves CUDA
tensors only), and the result is moved to CPU for printing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

from recsys.distributed.collectives import collective_device


def _sharded(model: nn.Module) -> dict[str, ShardedTensor]:
    return {k: v for k, v in model.state_dict().items() if isinstance(v, ShardedTensor)}


def describe(model: nn.Module) -> list[dict[str, Any]]:
    """This rank's view: per sharded tensor, its global shape and the shards held here."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    out = []
    for name, st in _sharded(model).items():
        shards = [
            {
                "offsets": list(s.metadata.shard_offsets),
                "sizes": list(s.metadata.shard_sizes),
                "norm": float(s.tensor.float().norm()),
            }
            for s in st.local_shards()
        ]
        out.append({"rank": rank, "name": name, "shape": list(st.size()), "local_shards": shards})
    return out


def gather_table(model: nn.Module, table: str) -> torch.Tensor | None:
    """The full weight of ``table`` (e.g. ``t_cat_3``) on rank 0, on CPU; all ranks must call it."""
    matches = [k for k in _sharded(model) if k.endswith(f".{table}.weight")]
    if len(matches) != 1:
        names = sorted(k.rsplit(".", 2)[-2] for k in _sharded(model))
        raise KeyError(f"no sharded table {table!r}; tables: {names}")
    st = _sharded(model)[matches[0]]
    rank = dist.get_rank()
    device = collective_device()
    out = torch.empty(list(st.size()), dtype=st.dtype, device=device) if rank == 0 else None
    st.gather(dst=0, out=out)
    return out.cpu() if out is not None else None
