"""Each row's split (``TRAIN``, ``VAL``, ``TEST``), from a ``SplitPlan`` fixed before any row is
fitted: the time cut points, the input's row numbers, its files, or a stable hash of the row's
values (``DatasetSchema.split_by``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from recsys.data.schema import DatasetSchema
from recsys.prepare.ids import hash_ids
from recsys.prepare.values import epoch_seconds, is_text, numeric, plain

TRAIN, VAL, TEST = 0, 1, 2
SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class SplitPlan:
    """What assigns rows to splits, fixed before any row is fitted (``DatasetSchema.split_by``).

    Attributes:
        by: ``time``, ``hash``, ``order`` or ``files``.
        cuts: ``time``: ``(val_from, test_from)`` timestamps.
        bounds: ``order``: ``(val_from, test_from)`` input row numbers over all files.
        files: ``files``: each input file's split (``TRAIN``, ``VAL``, ``TEST``).
    """

    by: str
    cuts: tuple[float, float] | None = None
    bounds: tuple[int, int] | None = None
    files: dict[str, int] = field(default_factory=dict)


def split_of(
    table: pa.Table,
    schema: DatasetSchema,
    plan: SplitPlan,
    rows: np.ndarray | None = None,
    path: str = "",
) -> np.ndarray:
    """Each row's split, int8 ``[n]`` (``SplitPlan``): ``rows`` are the batch's input row
    numbers over all files (``order``), ``path`` its file (``files``)."""
    n = table.num_rows
    if plan.by == "time":
        assert schema.time is not None and plan.cuts is not None
        t = epoch_seconds(table.column(schema.time))[0]
        return (t >= plan.cuts[0]).astype(np.int8) + (t >= plan.cuts[1]).astype(np.int8)
    if plan.by == "order":
        assert rows is not None and plan.bounds is not None
        return (rows >= plan.bounds[0]).astype(np.int8) + (rows >= plan.bounds[1]).astype(np.int8)
    if plan.by == "files":
        return np.full(n, plan.files[path], np.int8)
    u = row_hash(table, schema)
    val_from = 1 - schema.split.val_fraction - schema.split.test_fraction
    test_from = 1 - schema.split.test_fraction
    return (u >= val_from).astype(np.int8) + (u >= test_from).astype(np.int8)


def row_hash(table: pa.Table, schema: DatasetSchema) -> np.ndarray:
    """A uniform number in ``[0, 1)`` per row from the split seed and the row's scalar values
    (labels, dense, one-hot ids), as values: a dictionary-encoded column hashes as its values."""
    h = np.full(table.num_rows, np.uint64(schema.split.seed) * np.uint64(0x9E3779B97F4A7C15))
    scalar = [
        *schema.labels,
        *schema.dense,
        *(k for k, c in schema.sparse.items() if not c.multi_hot and c.derive is None),
    ]
    with np.errstate(over="ignore"):
        for name in scalar:
            col = plain(table.column(name))
            if is_text(col.type) or pa.types.is_integer(col.type) or pa.types.is_null(col.type):
                ch, _ = hash_ids(col)
            else:
                ch = pd.util.hash_array(numeric(col)[0], categorize=False).astype(np.uint64)
            h = h * np.uint64(1099511628211) + ch
    return np.asarray((h >> np.uint64(11)).astype(np.float64) / float(1 << 53))
