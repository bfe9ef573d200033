"""Row-wise optimizer state across a change of sharding plan.

FBGEMM's row-wise optimizers (``exact_rowwise_adagrad``) keep one value per table row: the sum
over steps of the row's mean squared gradient. A table cut into ``k`` column shards has one such
value per row and shard (the mean over that shard's columns), and TorchRec lays the state out as
one 1-D tensor of ``k x rows`` values, shard by shard in column order
(``batched_embedding_kernel.py``, ``get_optimizer_rowwise_shard_metadata_and_global_metadata``).
A checkpoint saved with ``k`` column shards of a table therefore has another size than the state
of a plan with ``k'`` shards (another number of workers, or another sharding type), and DCP
refuses to load it. Tables themselves and the point-wise states (Adam's moments,
``exact_adagrad``'s) have the table's shape on every plan and reshard exactly.

The rule (``mixing``): a row's state on a new column shard is the mean of the saved shards' states
of that row, weighted by how many of the new shard's columns each saved shard holds. Where the new
shard is a union of saved shards (fewer shards: table-wise from column-wise, 4 shards to 2) this is
exact: the mean of squared gradients over the union's columns is the width-weighted mean of the
means over its parts. Where a saved shard is split (more shards), each part starts from the whole
saved shard's mean, an approximation: the per-column gradients were never kept. The resume notice
names every table so mapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor


class LayoutError(RuntimeError):
    """A checkpoint's state cannot be mapped to the loading plan (named in the message)."""


@dataclass(frozen=True)
class Remap:
    """One row-wise state to map: its flat DCP key, its table's rows and the column-shard widths
    (in column order) of the saved plan and of the loading one."""

    key: str
    table: str
    rows: int
    saved_widths: tuple[int, ...]
    widths: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.table} ({_shards(self.saved_widths)} -> {_shards(self.widths)})"


def _shards(widths: tuple[int, ...]) -> str:
    n = len(widths)
    return "1 shard of all columns" if n == 1 else f"{n} column shards"


def flatten(tree: Any, prefix: str = "") -> dict[str, tuple[dict[str, Any], str]]:
    """Every leaf of a nested state dict by its DCP key (keys joined by dots), as
    ``(the dict holding it, its key there)`` so it can be taken out and put back."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = (tree, k)
    return out


def column_widths(chunks: list[tuple[list[int], list[int]]], dim: int) -> tuple[int, ...]:
    """The column-shard widths, in column order, of a table cut into ``chunks``
    (``(offsets, sizes)`` of 2-D pieces): row-wise pieces all start at column 0 (one shard)."""
    starts = sorted({int(offsets[1]) for offsets, _ in chunks})
    return tuple(b - a for a, b in zip(starts, [*starts[1:], dim], strict=True))


def plan_remaps(metadata: Any, flat: dict[str, tuple[dict[str, Any], str]]) -> list[Remap]:
    """The row-wise states of the loading state dict (``flatten``ed) whose size differs from the
    checkpoint's (``metadata``: DCP's ``Metadata``). Raises ``LayoutError`` where a state
    cannot be mapped, naming the table and both layouts."""
    saved = metadata.state_dict_metadata
    value = {key: holder[k] for key, (holder, k) in flat.items()}
    tables = {
        key.removeprefix("model."): st
        for key, st in value.items()
        if key.startswith("model.") and isinstance(st, ShardedTensor) and st.dim() == 2
    }
    out = []
    for key, st in value.items():
        if not (key.startswith("optim.") and isinstance(st, ShardedTensor) and st.dim() == 1):
            continue
        before = saved.get(key)
        if before is None or tuple(before.size) == tuple(st.size()):
            continue
        owners = [p for p in tables if f".{p}." in key]
        if len(owners) != 1:
            raise LayoutError(f"{key}: saved with {tuple(before.size)} values, now "
                              f"{tuple(st.size())}, and no single table owns it")  # fmt: skip
        out.append(_remap(key, st, before, owners[0], tables[owners[0]], saved))
    return out


def _remap(
    key: str, st: ShardedTensor, before: Any, param: str, table_st: ShardedTensor, saved: Any
) -> Remap:
    """The ``Remap`` of state ``key`` (now ``st``, saved as ``before``) of table ``param``."""
    table = param.rsplit(".", 2)[-2] if param.endswith(".weight") else param
    rows, dim = table_st.size()
    saved_chunks = [(c.offsets, c.sizes) for c in saved[f"model.{param}"].chunks]
    chunks = [(m.shard_offsets, m.shard_sizes) for m in table_st.metadata().shards_metadata]
    remap = Remap(key, table, rows, column_widths(saved_chunks, dim), column_widths(chunks, dim))
    n_saved, n = before.size[0], st.size(0)
    if n_saved != rows * len(remap.saved_widths) or n != rows * len(remap.widths):
        raise LayoutError(
            f"table {table}: its row-wise optimizer state ({key}) was saved with {n_saved} "
            f"values for {_shards(remap.saved_widths)} of {rows} rows, and this plan "
            f"({_shards(remap.widths)}) needs {n}: a layout this project cannot map (keep the "
            "saving run's sharding for this table)"
        )
    return remap


def mixing(saved_widths: tuple[int, ...], widths: tuple[int, ...]) -> torch.Tensor:
    """``[len(widths), len(saved_widths)]``: row ``j`` weighs each saved shard by the share of
    new shard ``j``'s columns it holds (rows sum to 1)."""
    saved_edges = torch.tensor([0, *saved_widths]).cumsum(0).tolist()
    edges = torch.tensor([0, *widths]).cumsum(0).tolist()
    out = torch.zeros(len(widths), len(saved_widths), dtype=torch.float64)
    for j in range(len(widths)):
        for i in range(len(saved_widths)):
            lo = max(edges[j], saved_edges[i])
            hi = min(edges[j + 1], saved_edges[i + 1])
            out[j, i] = max(hi - lo, 0) / widths[j]
    return out


def mapped(remap: Remap, saved: torch.Tensor) -> torch.Tensor:
    """``[len(widths) * rows]``: the saved state ``[len(saved_widths) * rows]`` in the new
    layout, by ``mixing``."""
    per_shard = saved.reshape(len(remap.saved_widths), remap.rows).to(torch.float64)
    new = mixing(remap.saved_widths, remap.widths) @ per_shard
    return new.reshape(-1).to(saved.dtype)


def fill(target: ShardedTensor, full: torch.Tensor) -> None:
    """Copy the whole new-layout state ``full`` into ``target``'s local shards."""
    with torch.no_grad():
        for shard in target.local_shards():
            (start,), (n,) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[start : start + n])
