"""Per-batch transforms of click-log rows (a pyarrow ``Table`` of schema columns) into the
prepared form: the one implementation that preparation (on Ray Data), its single-process baseline
and serving all call, so training and serving see the same ids and values.

- ``check``: the rows whose values are bad (null or non-0/1 label, text or a list in a numeric
  column, a scalar where a list is declared...), per column, with the first bad value.
- ``split_of``: each row's split (0 train, 1 validation, 2 test) by the time cut points, or by a
  stable hash of its values.
- ``fit_batch``: statistics of the training rows (id counts per sparse column, dense sums).
- ``encode``: dense ``[n, I]`` float32 (filled, transformed), labels ``[n, L]`` int8, and per
  sparse feature the ids (``uint32``, vocabulary rows or hash buckets) with per-row lengths.

Ids: every value (string or integer) is first hashed to 64 bits (``hash_ids``: pandas' stable
SipHash of the value, computed once per distinct value in the batch); vocabularies are sorted hash
arrays (``Vocabulary``), so lookups are a vectorised ``searchsorted``. Missing values (null, ``""``)
are id 0, shared with rare and unseen values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data import vocab
from recsys.data.schema import DatasetSchema, SparseColumn

TRAIN, VAL, TEST = 0, 1, 2
SPLIT_NAMES = ("train", "val", "test")


class BadValue(ValueError):
    """A bad value in a batch: its file, column, the value and why (the row is located later)."""

    def __init__(self, path: str, column: str, value: Any, why: str) -> None:
        super().__init__(path, column, value, why)
        self.path, self.column, self.value, self.why = path, column, value, why

    def __str__(self) -> str:
        return f"{self.path}: column {self.column!r}: {self.why} (got {self.value!r})"


def _array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def is_text(tp: pa.DataType) -> bool:
    return bool(pa.types.is_string(tp) or pa.types.is_large_string(tp))


def is_list(tp: pa.DataType) -> bool:
    return bool(pa.types.is_list(tp) or pa.types.is_large_list(tp))


# ---------------------------------------------------------------------------------------------
# Reading columns as numbers and lists (with the bad rows as a mask)


def numeric(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values float64 [n] with NaN for missing, missing [n], bad [n])`` of a numeric, boolean
    or (CSV) text column; text that is not a number is bad."""
    arr = _array(arr)
    tp = arr.type
    if is_text(tp):
        blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(arr), ""), True)
        arr = pc.if_else(blank, pa.scalar(None, tp), arr)
        try:
            arr = pc.cast(arr, pa.float64())
            bad = np.zeros(len(arr), bool)
        except pa.ArrowInvalid:
            return _numeric_slow(arr)
    elif (
        pa.types.is_boolean(tp)
        or pa.types.is_integer(tp)
        or pa.types.is_floating(tp)
        or pa.types.is_decimal(tp)
    ):
        arr = pc.cast(arr, pa.float64())
        bad = np.zeros(len(arr), bool)
    else:
        return np.full(len(arr), np.nan), np.zeros(len(arr), bool), np.ones(len(arr), bool)
    values = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    missing = np.isnan(values)
    return values, missing, bad


def _numeric_slow(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = np.full(len(arr), np.nan)
    bad = np.zeros(len(arr), bool)
    for i, v in enumerate(arr.to_pylist()):
        if v is None:
            continue
        try:
            out[i] = float(v)
        except ValueError:
            bad[i] = True
    return out, np.isnan(out) & ~bad, bad


def as_list(arr: pa.Array, spec: SparseColumn) -> tuple[pa.Array, np.ndarray]:
    """``(flat values, lengths int64 [n])`` of a list column (CSV: text split by the separator);
    a null list is empty."""
    arr = _array(arr)
    if is_text(arr.type):
        arr = pc.split_pattern(arr, spec.separator)
        empty = pc.fill_null(pc.equal(pc.list_value_length(arr), 1), False)
        first_blank = (
            pc.fill_null(pc.equal(pc.list_element(arr, 0), ""), False) if len(arr) else empty
        )
        arr = pc.if_else(pc.and_(empty, first_blank), pa.scalar([], arr.type), arr)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    return pc.list_flatten(arr), lengths.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Ids


def hash_ids(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(uint64 hashes [n], missing [n])`` of string or integer ids: pandas' stable SipHash of
    each distinct value (so the same value hashes the same in every batch, process and run)."""
    arr = _array(arr)
    if len(arr) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, bool)
    enc = arr if pa.types.is_dictionary(arr.type) else pc.dictionary_encode(arr)
    dictionary = enc.dictionary
    if is_text(dictionary.type) or pa.types.is_binary(dictionary.type):
        values = dictionary.to_numpy(zero_copy_only=False).astype(object)
        blank = values == ""
    else:
        values = dictionary.to_numpy(zero_copy_only=False).astype(np.int64)
        blank = np.zeros(len(values), bool)
    hashes = pd.util.hash_array(values, categorize=False).astype(np.uint64)
    indices = enc.indices
    missing = indices.is_null().to_numpy(zero_copy_only=False)
    idx = pc.fill_null(indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(hashes) == 0:
        return np.zeros(len(arr), np.uint64), np.ones(len(arr), bool)
    return hashes[idx], missing | blank[idx]


@dataclass
class Vocabulary:
    """One sparse column's vocabulary: ``hashes[i]`` (a value's 64-bit hash) has row ``i + 1``;
    row 0 is shared by missing, rare and unseen values."""

    hashes: np.ndarray  # uint64 [V], in row order (descending training count)

    def __post_init__(self) -> None:
        self._order = np.argsort(self.hashes, kind="stable")
        self._sorted = self.hashes[self._order]

    @property
    def rows(self) -> int:
        return len(self.hashes) + 1

    @classmethod
    def build(cls, values: np.ndarray, counts: np.ndarray, min_count: int) -> Vocabulary:
        return cls(vocab.build((values, counts), min_count).astype(np.uint64))

    def ids(self, hashes: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """Rows of ``hashes`` (uint32): their place + 1, or 0 (missing, rare, unseen)."""
        if len(self._sorted) == 0:
            return np.zeros(len(hashes), np.uint32)
        pos = np.minimum(np.searchsorted(self._sorted, hashes), len(self._sorted) - 1)
        found = (self._sorted[pos] == hashes) & ~missing
        return np.where(found, self._order[pos] + 1, 0).astype(np.uint32)


# ---------------------------------------------------------------------------------------------
# Checking rows


def column_problem(name: str, arr: pa.Array, schema: DatasetSchema) -> tuple[np.ndarray, str]:
    """``(bad rows [n], why)`` of one schema column in a batch."""
    arr = _array(arr)
    n = len(arr)
    if name in schema.labels:
        values, missing, bad = numeric(arr)
        bad = bad | is_list(arr.type) | (~missing & ~np.isin(values, (0.0, 1.0)))
        first = np.flatnonzero(bad | missing)
        if len(first) and missing[first[0]]:
            return bad | missing, "a label is null"
        return bad | missing, "a label must be 0 or 1 (true/false)"
    if name in schema.dense:
        if is_list(arr.type):
            return np.ones(n, bool), "a dense column holds lists, not numbers"
        bad = numeric(arr)[2]
        return bad, "a dense column needs a number (or null)"
    if name == schema.time:
        values, missing, bad = time_values(arr)
        return bad | missing, "the time column needs a timestamp or number in every row"
    spec = schema.sparse[name]
    csv_text = schema.format == "csv" and is_text(arr.type)  # CSV lists: ids joined by separator
    if spec.multi_hot and not (is_list(arr.type) or csv_text):
        return np.ones(n, bool), "declared multi_hot: true, but holds one value per row, not lists"
    if not spec.multi_hot and is_list(arr.type):
        return np.ones(n, bool), "holds lists; declare it with multi_hot: true"
    tp = arr.type.value_type if is_list(arr.type) else arr.type
    if pa.types.is_floating(tp) or pa.types.is_boolean(tp):
        return np.ones(n, bool), f"ids must be strings or integers, not {tp}"
    return np.zeros(n, bool), ""


def time_values(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The time column as float64 ``(values, missing, bad)``: timestamps and dates in their
    units, numbers as they are, text (CSV) as a number or an ISO-8601 timestamp."""
    arr = _array(arr)
    tp = arr.type
    if pa.types.is_timestamp(tp) or pa.types.is_date(tp) or pa.types.is_duration(tp):
        ints = pc.cast(arr, pa.int64()) if not pa.types.is_date32(tp) else pc.cast(arr, pa.int32())
        values = ints.to_numpy(zero_copy_only=False).astype(np.float64)
        return values, np.isnan(values), np.zeros(len(arr), bool)
    if is_text(tp):
        try:
            stamps = pc.cast(pc.cast(arr, pa.timestamp("s")), pa.int64())
            values = stamps.to_numpy(zero_copy_only=False).astype(np.float64)
            return values, np.isnan(values), np.zeros(len(arr), bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return numeric(arr)


def check(table: pa.Table, schema: DatasetSchema) -> dict[str, tuple[np.ndarray, str]]:
    """Per schema column, ``(bad rows, why)`` for the columns with a bad row in ``table``."""
    out = {}
    for name in schema.columns():
        bad, why = column_problem(name, table.column(name), schema)
        if bad.any():
            out[name] = (bad, why)
    return out


def first_bad(table: pa.Table, problems: dict[str, tuple[np.ndarray, str]], path_col: str) -> Any:
    """The first bad value of a batch as a ``BadValue`` (its file from ``path_col``)."""
    column, (bad, why) = next(iter(problems.items()))
    i = int(np.flatnonzero(bad)[0])
    path = str(table.column(path_col)[i].as_py()) if path_col in table.column_names else "<rows>"
    return BadValue(path, column, table.column(column)[i].as_py(), why)


# ---------------------------------------------------------------------------------------------
# Splitting


def split_of(table: pa.Table, schema: DatasetSchema, cuts: tuple[float, float] | None) -> Any:
    """Each row's split, int8 ``[n]``: by the time column's cut points ``(val_from, test_from)``,
    or (no time column) by a stable hash of the row's scalar values and the split seed."""
    n = table.num_rows
    if schema.time is not None and cuts is not None:
        t = time_values(table.column(schema.time))[0]
        return (t >= cuts[0]).astype(np.int8) + (t >= cuts[1]).astype(np.int8)
    h = np.full(n, np.uint64(schema.split.seed) * np.uint64(0x9E3779B97F4A7C15), np.uint64)
    scalar = [
        *schema.labels,
        *schema.dense,
        *(k for k, c in schema.sparse.items() if not c.multi_hot),
    ]
    with np.errstate(over="ignore"):
        for name in scalar:
            col = _array(table.column(name))
            if is_text(col.type) or pa.types.is_integer(col.type):
                ch, _ = hash_ids(col)
            else:
                ch = pd.util.hash_array(numeric(col)[0], categorize=False).astype(np.uint64)
            h = h * np.uint64(1099511628211) + ch
    u = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    val_from = 1 - schema.split.val_fraction - schema.split.test_fraction
    test_from = 1 - schema.split.test_fraction
    return (u >= val_from).astype(np.int8) + (u >= test_from).astype(np.int8)


# ---------------------------------------------------------------------------------------------
# Fitting (training rows only) and encoding


@dataclass
class BatchStats:
    """What one batch contributes to the fit: rows per split, id counts per sparse column and
    dense sums over its training rows."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)  # [n, sum, sum of squares, min, max]

    def merge(self, other: BatchStats) -> BatchStats:
        out = BatchStats(self.rows + other.rows)
        for k in {*self.counts, *other.counts}:
            empty = (np.zeros(0, np.uint64), np.zeros(0, np.int64))
            out.counts[k] = vocab.merge_counts(
                self.counts.get(k, empty), other.counts.get(k, empty)
            )
        for k in {*self.dense, *other.dense}:
            a, b = self.dense.get(k), other.dense.get(k)
            if a is None or b is None:
                out.dense[k] = a if b is None else b  # type: ignore[assignment]
            else:
                out.dense[k] = _merge_dense(a, b)
        return out


def _merge_dense(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.array([a[0] + b[0], a[1] + b[1], a[2] + b[2], min(a[3], b[3]), max(a[4], b[4])])


def filled_dense(table: pa.Table, schema: DatasetSchema, name: str) -> np.ndarray:
    values, missing, _ = numeric(table.column(name))
    return np.where(missing, schema.dense[name].fill, values)


def sparse_hashes(table: pa.Table, name: str, spec: SparseColumn) -> tuple[Any, Any, Any]:
    """``(hashes, missing, lengths or None)`` of a sparse column (lists flattened)."""
    col = table.column(name)
    if not spec.multi_hot:
        h, missing = hash_ids(col)
        return h, missing, None
    flat, lengths = as_list(col, spec)
    h, missing = hash_ids(flat)
    return h, missing, lengths


def fit_batch(table: pa.Table, schema: DatasetSchema, split: np.ndarray) -> BatchStats:
    """The training rows' statistics of a (checked) batch."""
    stats = BatchStats(np.bincount(split, minlength=3).astype(np.int64))
    train = split == TRAIN
    part = table.filter(pa.array(train))
    for name, spec in schema.sparse.items():
        if spec.hash_buckets is not None:
            continue
        h, missing, _ = sparse_hashes(part, name, spec)
        values, counts = np.unique(h[~missing], return_counts=True)
        stats.counts[name] = (values, counts.astype(np.int64))
    for name in schema.dense:
        x = filled_dense(part, schema, name)
        if len(x):
            stats.dense[name] = np.array([len(x), x.sum(), (x * x).sum(), x.min(), x.max()])
    return stats


@dataclass
class Fitted:
    """What preparation learned from the training rows, and everything encoding needs."""

    schema: DatasetSchema
    vocabs: dict[str, Vocabulary]
    dense_stats: dict[str, dict[str, float]]
    cuts: tuple[float, float] | None = None
    id_types: dict[str, str] = field(default_factory=dict)  # "int" | "string" per sparse column

    def table_sizes(self) -> list[int]:
        out = []
        for name, spec in self.schema.sparse.items():
            out.append(spec.hash_buckets if spec.hash_buckets else self.vocabs[name].rows)
        return out


@dataclass
class Encoded:
    """A batch in the prepared form: ``dense [n, I]`` float32, ``labels [n, L]`` int8 (or None),
    per sparse feature ``ids`` (uint32, flat) and ``lengths`` (int64 ``[n]``, None: one-hot),
    rows and ids cut by ``max_len`` per feature."""

    dense: np.ndarray
    labels: np.ndarray | None
    ids: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray | None]
    truncated: dict[str, tuple[int, int]]

    def __len__(self) -> int:
        return len(self.dense)

    def take(self, mask: np.ndarray) -> Encoded:
        """The rows where ``mask`` is set."""
        ids: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray | None] = {}
        for name, v in self.ids.items():
            lens = self.lengths[name]
            if lens is None:
                ids[name], lengths[name] = v[mask], None
            else:
                ids[name], lengths[name] = v[np.repeat(mask, lens)], lens[mask]
        labels = None if self.labels is None else self.labels[mask]
        return Encoded(self.dense[mask], labels, ids, lengths, self.truncated)


def transform_dense(x: np.ndarray, kind: str, stats: dict[str, float]) -> np.ndarray:
    if kind == "log1p":
        return np.log1p(np.maximum(x, 0))
    if kind == "standardize":
        return (x - stats["mean"]) / stats["std"]
    return x


def truncate(lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keep mask over the flat values, new lengths)``: each list's first ``max_len`` ids."""
    if not max_len or len(lengths) == 0 or lengths.max() <= max_len:
        return np.ones(int(lengths.sum()), bool), lengths
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(int(lengths.sum())) - starts
    return position < max_len, np.minimum(lengths, max_len)


def encode(table: pa.Table, fitted: Fitted, with_labels: bool = True) -> Encoded:
    """A checked batch in the prepared form (``with_labels=False``: serving's rows)."""
    schema = fitted.schema
    dense = np.empty((table.num_rows, len(schema.dense)), np.float32)
    for j, (name, spec) in enumerate(schema.dense.items()):
        x = filled_dense(table, schema, name)
        dense[:, j] = transform_dense(x, spec.transform, fitted.dense_stats.get(name, {}))
    labels = None
    if with_labels:
        labels = np.stack([numeric(table.column(c))[0] for c in schema.labels], 1).astype(np.int8)
    ids: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray | None] = {}
    truncated: dict[str, tuple[int, int]] = {}
    for name, sparse in schema.sparse.items():
        h, missing, lens = sparse_hashes(table, name, sparse)
        if sparse.hash_buckets:
            rows = np.where(missing, 0, h % np.uint64(sparse.hash_buckets)).astype(np.uint32)
        else:
            rows = fitted.vocabs[name].ids(h, missing)
        if lens is not None:
            keep, new = truncate(lens, sparse.max_len)
            truncated[name] = (int((new < lens).sum()), int(len(keep) - keep.sum()))
            rows, lens = rows[keep], new
        ids[name], lengths[name] = rows, lens
    return Encoded(dense, labels, ids, lengths, truncated)
