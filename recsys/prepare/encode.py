"""Per-batch transforms of click-log rows (a pyarrow ``Table`` of schema columns) into the
prepared form: the one implementation that preparation (its tasks, on Ray or in one process) and
serving both call, so training and serving see the same ids and values. By concern:

- ``recsys.prepare.values``: a column's values read as numbers, lists and timestamps, with the
  rows whose values are bad;
- ``recsys.prepare.checks``: ``check``: the rows whose values are bad (null or non-0/1 label,
  text or a list in a numeric column, a scalar where a list is declared...), per column, with the
  first bad value;
- ``recsys.prepare.splits``: ``split_of``: each row's split (0 train, 1 validation, 2 test) by
  the time cut points, a stable hash of its values, its place in the input or its file
  (``SplitPlan``);
- ``recsys.prepare.ids``: ids hashed once per distinct value (``IdCodes``), and a table's
  vocabulary (``Vocabulary``);
- ``recsys.prepare.fit``: ``fit_batch``: statistics of the training rows (id counts per table:
  the columns sharing a table counted together; dense sums), and what they fit (``Fitted``);
- here, ``encode``: dense ``[n, I]`` float32 (filled, transformed), labels ``[n, L]`` int8, and
  per sparse feature the ids (``uint32``: vocabulary rows, hash buckets or derived time rows)
  with per-row lengths.

Ids: every value (string or integer) is first hashed to 64 bits (``hash_ids``: pandas' stable
SipHash of the value, computed once per distinct value in the batch); vocabularies are sorted hash
arrays (``Vocabulary``), so lookups are a vectorised ``searchsorted``. Rows (``SparseColumn``):
0 missing (null, ``""``), ``1..N`` unseen values (``1 + hash % N``), then the vocabulary; hashed
columns ``1 + hash % B``. Time features (``derive``) come from their timestamp columns as epoch
seconds (``epoch_seconds``), converted to local time with the time zone database (``zoneinfo``).
The time column that splits by time is read by the same ``epoch_seconds``, with the same rules: a
column that can split can derive time features, and the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from recsys.data.dense import log1p_counts
from recsys.data.schema_columns import UNIT_SECONDS, SparseColumn, zone
from recsys.prepare.fit import Fitted, filled_dense
from recsys.prepare.ids import Codes, hash_ids, sparse_codes
from recsys.prepare.values import epoch_seconds, list_numbers, list_weights, numeric


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
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # float32, as ``ids``
    groups: np.ndarray | None = None  # int64 [n]: the group_by column's hash (0: no value)

    def __len__(self) -> int:
        return len(self.dense)

    def take(self, mask: np.ndarray) -> Encoded:
        """The rows where ``mask`` is set."""
        ids: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray | None] = {}
        weights: dict[str, np.ndarray] = {}
        for name, v in self.ids.items():
            lens = self.lengths[name]
            if lens is None:
                ids[name], lengths[name] = v[mask], None
            else:
                flat = np.repeat(mask, lens)
                ids[name], lengths[name] = v[flat], lens[mask]
                if name in self.weights:
                    weights[name] = self.weights[name][flat]
        labels = None if self.labels is None else self.labels[mask]
        groups = None if self.groups is None else self.groups[mask]
        return Encoded(self.dense[mask], labels, ids, lengths, self.truncated, weights, groups)


def transform_dense(x: np.ndarray, kind: str, stats: dict[str, float]) -> np.ndarray:
    if kind == "log1p":
        return log1p_counts(x)
    if kind == "standardize":
        return (x - stats["mean"]) / stats["std"]
    return x


def truncate(
    lengths: np.ndarray, max_len: int, last: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(keep mask over the flat values, new lengths)``: each list's first ``max_len`` ids
    (``last``: its last ``max_len``, a sequence's most recent)."""
    if not max_len or len(lengths) == 0 or lengths.max() <= max_len:
        return np.ones(int(lengths.sum()), bool), lengths
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(int(lengths.sum())) - starts
    if last:
        position = np.repeat(lengths, lengths) - 1 - position  # counted from the end
    return position < max_len, np.minimum(lengths, max_len)


def time_order(lengths: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The flat values' order that sorts each list by ``times`` (float ``[nnz]``), ties in the
    list's order, the lists staying where they are."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    return np.lexsort((np.arange(len(times)), times, row))


def encode(
    table: pa.Table, fitted: Fitted, with_labels: bool = True, codes: Codes | None = None
) -> Encoded:
    """A checked batch in the prepared form (``with_labels=False``: serving's rows)."""
    schema = fitted.schema
    dense = np.empty((table.num_rows, len(schema.dense)), np.float32)
    for j, (name, spec) in enumerate(schema.dense.items()):
        x = filled_dense(table, schema, name)
        dense[:, j] = transform_dense(x, spec.transform, fitted.dense_stats.get(name, {}))
    labels, groups = None, None
    if with_labels:
        labels = np.stack([numeric(table.column(c))[0] for c in schema.labels], 1).astype(np.int8)
        if schema.group_by is not None:
            groups = group_hashes(table.column(schema.group_by))
    ids: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray | None] = {}
    truncated: dict[str, tuple[int, int]] = {}
    weights: dict[str, np.ndarray] = {}
    seconds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in schema.sparse:
        sparse = schema.id_spec(name)
        if sparse.derive is not None:
            ids[name], lengths[name] = derived_ids(table, sparse, seconds), None
            continue
        got, lens = codes[name] if codes else sparse_codes(table, name, sparse)
        if sparse.hash_buckets:  # identity: id i is row i mod B; hashed: 1 + hash mod B
            first = np.uint64(0 if sparse.identity else 1)
            per_value = (first + got.hashes % np.uint64(sparse.hash_buckets)).astype(np.uint32)
        else:
            per_value = fitted.vocabs[name].ids(got.hashes)
        rows = got.per_row(per_value)
        if sparse.sequence is not None:
            rows, lens = _sequence(table, sparse, rows, lens)
        if lens is not None:
            seq = sparse.sequence
            keep, new = truncate(lens, seq.max_len if seq else sparse.max_len, seq is not None)
            truncated[name] = (int((new < lens).sum()), int(len(keep) - keep.sum()))
            if sparse.weights is not None:  # as many as the ids (checked), cut alike
                weights[name] = list_weights(table.column(sparse.weights), sparse)[0][keep]
            rows, lens = rows[keep], new
        ids[name], lengths[name] = rows, lens
    return Encoded(dense, labels, ids, lengths, truncated, weights, groups)


def group_hashes(column: Any) -> np.ndarray:
    """``[n]`` int64: each row's group, the 64-bit hash of its raw value (as ids are hashed:
    ``5`` and ``"5"`` apart), 0 where it has none (a hash of 0 becomes 1)."""
    hashes, missing = hash_ids(column)
    out = hashes.view(np.int64).copy()
    out[out == 0] = 1
    out[missing] = 0
    return out


def _sequence(
    table: pa.Table, spec: SparseColumn, rows: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's ids in time order (``Sequence.order_by``; as written without one)."""
    assert spec.sequence is not None
    if spec.sequence.order_by is None:
        return rows, lens
    times = list_numbers(table.column(spec.sequence.order_by), spec)[0]
    return rows[time_order(lens, times)], lens


def derived_ids(
    table: pa.Table, spec: SparseColumn, seconds: dict[str, tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """A time feature's rows (uint32 ``[n]``, ``SparseColumn``): 0 where a timestamp is
    missing; ``seconds``: the batch's timestamp columns converted so far (filled here)."""
    for column in (spec.source, spec.since):
        if column is not None and column not in seconds:
            values, missing, bad = epoch_seconds(table.column(column))
            seconds[column] = (values, missing | bad)
    assert spec.source is not None
    t, missing = seconds[spec.source]
    out = np.zeros(len(t), np.uint32)
    if spec.derive == "age":
        assert spec.since is not None and spec.unit is not None
        since, gone = seconds[spec.since]
        ok = ~missing & ~gone
        age = (t[ok] - since[ok]) / UNIT_SECONDS[spec.unit]
        edges = np.asarray(spec.buckets, np.float64)
        out[ok] = np.searchsorted(edges, age, side="right") + 1
        return out
    ok = ~missing
    whole = np.floor(t[ok]).astype(np.int64)
    local = pd.to_datetime(whole, unit="s", utc=True).tz_convert(zone(spec.time_zone))
    values = local.hour if spec.derive == "hour" else local.day_of_week
    out[ok] = 1 + np.asarray(values, np.int64)
    return out
