"""Fitting on the training rows: what each batch contributes (``BatchStats``: rows per split,
id counts per table, the columns sharing a table counted together, dense sums), merged over the
batches, and what preparation learned from them (``Fitted``: the vocabularies, the dense
statistics, the split plan), which encoding and serving use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.schema import DatasetSchema
from recsys.prepare import vocab
from recsys.prepare.ids import Codes, Vocabulary, id_counts, sparse_codes
from recsys.prepare.splits import TRAIN, SplitPlan
from recsys.prepare.values import numeric


@dataclass
class BatchStats:
    """What one batch contributes to the fit: rows per split, id counts per sparse column and
    dense sums over its training rows."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)  # [n, sum, sum of squares, min, max]
    positives: np.ndarray = field(default_factory=lambda: np.zeros((3, 0), np.int64))  # [3, L]

    @staticmethod
    def merge_all(parts: list[BatchStats]) -> BatchStats:
        """The statistics of all ``parts`` at once (one sort per column, not one per part)."""
        out = BatchStats()
        for part in parts:
            out = BatchStats(out.rows + part.rows, positives=_add(out.positives, part.positives),
                             dense=out.dense)  # fmt: skip
            for k, v in part.dense.items():
                out.dense[k] = v if k not in out.dense else _merge_dense(out.dense[k], v)
        for k in {k for p in parts for k in p.counts}:
            got = [p.counts[k] for p in parts if k in p.counts]
            joined = (np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
            out.counts[k] = vocab.merge_counts(joined, (joined[0][:0], joined[1][:0]))
        return out

    def merge(self, other: BatchStats) -> BatchStats:
        return BatchStats.merge_all([self, other])


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.size == 0:
        return b
    return a if b.size == 0 else a + b


def _merge_dense(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.array([a[0] + b[0], a[1] + b[1], a[2] + b[2], min(a[3], b[3]), max(a[4], b[4])])


def filled_dense(table: pa.Table, schema: DatasetSchema, name: str) -> np.ndarray:
    values, missing, _ = numeric(table.column(name))
    return np.where(missing, schema.dense[name].fill, values)


def fit_batch(
    table: pa.Table, schema: DatasetSchema, split: np.ndarray, codes: Codes | None = None
) -> BatchStats:
    """The training rows' statistics of a (checked) batch, and every split's positives per
    label (``meta.json``: a split whose label has one class cannot score an AUC)."""
    labels = np.stack([numeric(table.column(c))[0] for c in schema.labels], 1)
    positives = np.stack([(labels[split == s] == 1).sum(0) for s in range(3)]).astype(np.int64)
    stats = BatchStats(np.bincount(split, minlength=3).astype(np.int64), positives=positives)
    train = split == TRAIN
    part = table.filter(pa.array(train))
    for name in schema.sparse:
        if not schema.has_vocabulary(name):
            continue
        got, lengths = codes[name] if codes else sparse_codes(table, name, schema.id_spec(name))
        rows = train if lengths is None else np.repeat(train, lengths)
        counts, table_name = id_counts(got, rows), schema.table_of(name)
        if table_name in stats.counts:  # a shared table: its columns' values counted together
            counts = vocab.merge_counts(stats.counts[table_name], counts)
        stats.counts[table_name] = counts
    for name in schema.dense:
        x = filled_dense(part, schema, name)
        if len(x):
            stats.dense[name] = np.array([len(x), x.sum(), (x * x).sum(), x.min(), x.max()])
    return stats


@dataclass
class Fitted:
    """What preparation learned from the training rows, and everything encoding needs.
    ``vocabs``: per feature with a vocabulary (the columns sharing a table: one object)."""

    schema: DatasetSchema
    vocabs: dict[str, Vocabulary]
    dense_stats: dict[str, dict[str, float]]
    plan: SplitPlan | None = None
    id_types: dict[str, str] = field(default_factory=dict)  # "int" | "string" per id column

    def table_sizes(self) -> list[int]:
        """Rows per feature, in schema order (a sharer's: its table's)."""
        return [self.layout(name)["size"] for name in self.schema.sparse]

    def layout(self, name: str) -> dict[str, Any]:
        """A feature's table (``meta.json`` ``features``): its owner (``table``), how ids
        become rows (``kind``), its ``size`` and which ``rows`` are which (ranges
        ``[first, last]``)."""
        spec = self.schema.id_spec(name)
        out: dict[str, Any] = {"table": self.schema.table_of(name)}
        if spec.derive is not None:
            assert spec.rows is not None
            labels = {"hour": "hour", "weekday": "weekday", "age": "buckets"}
            rows = {"missing": 0, labels[spec.derive]: [1, spec.rows - 1]}
            return {**out, "kind": spec.derive, "size": spec.rows, "rows": rows}
        if spec.identity:
            b = spec.hash_buckets or 0
            rows = {"missing": 0, "identity": [0, b - 1]}  # id i: row i mod b (0: also missing)
            return {**out, "kind": "identity", "size": b, "rows": rows}
        if spec.hash_buckets:
            rows = {"missing": 0, "hashed": [1, spec.hash_buckets]}
            return {**out, "kind": "hash", "size": spec.hash_buckets + 1, "rows": rows}
        v = self.vocabs[name]
        return {**out, "kind": "vocabulary", "size": v.rows, "rows": v.layout()}
