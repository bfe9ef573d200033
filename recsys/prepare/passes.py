"""The passes over one piece of input, each a task (on Ray or in this process): the piece's rows
read in batches and checked (a bad value named by file, column and row, or under ``on_bad_row:
skip`` left out and counted: ``Skips``), the time column's range and histogram (the cut points
of ``split.by: time``), the fit (the training rows' statistics: ``fit_piece``), and the write
(encoded, the piece's own shard of each split: ``write_piece``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.errors import DataError
from recsys.data.schema import DatasetSchema
from recsys.prepare.checks import check
from recsys.prepare.encode import encode
from recsys.prepare.fit import BatchStats, Fitted, fit_batch
from recsys.prepare.ids import Codes, batch_codes
from recsys.prepare.shards import ShardWriter
from recsys.prepare.sources import BadLine, Piece, Rows, line_of, read_piece
from recsys.prepare.splits import SPLIT_NAMES, SplitPlan, split_of
from recsys.prepare.values import epoch_seconds

HIST_BINS = 1 << 16


def located(
    piece: Piece, schema: DatasetSchema, column: str, row: int, why: str, value: Any
) -> str:
    """A bad value's message: file, column, row (and line of a text file)."""
    line = f" (line {line_of(schema, row)})" if schema.format == "csv" else ""
    return f"{piece.path}: column {column!r}, row {row}{line}: {why} (got {value!r})"


@dataclass
class Skips:
    """What a piece dropped under ``on_bad_row: skip``: bad values per column, the rows they
    were in (row numbers within the file), and lines that did not split into the schema's
    columns (their row numbers)."""

    columns: dict[str, int] = field(default_factory=dict)
    rows: list[np.ndarray] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)

    def merge(self, other: Skips) -> Skips:
        cols = dict(self.columns)
        for k, v in other.columns.items():
            cols[k] = cols.get(k, 0) + v
        return Skips(cols, [], self.lines + other.lines)

    def dropped(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)


def checked(
    batch: Rows, piece: Piece, schema: DatasetSchema, skips: Skips, codes: Codes | None = None
) -> Rows:
    """The batch without its bad rows (``skip``, counted in ``skips``); ``error`` raises a
    ``DataError`` naming the first bad value. The batch itself when every row is good."""
    problems = check(batch.table, schema, codes)
    if not problems:
        return batch
    if schema.on_bad_row == "error":
        first = min(int(np.flatnonzero(mask)[0]) for mask, _ in problems.values())
        column, (_, why) = next((c, p) for c, p in problems.items() if p[0][first])
        value = batch.table.column(column)[first].as_py()
        raise DataError(located(piece, schema, column, int(batch.rows[first]), why, value))
    bad = np.zeros(batch.table.num_rows, bool)
    for name, (mask, _) in problems.items():
        skips.columns[name] = skips.columns.get(name, 0) + int((mask & ~bad).sum())
        bad |= mask
    skips.rows.append(batch.rows[bad])
    return Rows(batch.table.filter(pa.array(~bad)), batch.rows[~bad])


def piece_batches(
    piece: Piece, schema: DatasetSchema, columns: list[str], skips: Skips,
    dropped: np.ndarray | None = None,
) -> Iterator[Rows]:  # fmt: skip
    """A piece's rows, in batches (unchecked); a malformed text line is named by file and line
    (or skipped and counted). Given ``dropped`` (the rows an earlier pass found bad), those
    rows are left out."""
    lines: list[int] | None = skips.lines if schema.on_bad_row == "skip" else None
    try:
        for batch in read_piece(piece, schema, columns, lines):
            if dropped is not None and len(dropped):
                keep = ~np.isin(batch.rows, dropped)
                batch = Rows(batch.table.filter(pa.array(keep)), batch.rows[keep])
            yield batch
    except BadLine as e:
        raise DataError(f"{piece.path}:{line_of(schema, e.row)}: {e.why}") from None
    except (OSError, EOFError, pa.ArrowInvalid) as e:
        raise DataError(f"{piece.path}: not readable as {schema.format}: {e}") from None


def piece_rows(piece: Piece, schema: DatasetSchema, columns: list[str], skips: Skips
               ) -> Iterator[Rows]:  # fmt: skip
    """A piece's checked rows, in batches."""
    for batch in piece_batches(piece, schema, columns, skips):
        yield checked(batch, piece, schema, skips)


def checked_codes(batch: Rows, piece: Piece, schema: DatasetSchema, skips: Skips
                  ) -> tuple[Rows, Codes]:  # fmt: skip
    """The checked batch and its sparse columns' codes (computed once: the check of hex ids
    reads them too)."""
    codes = batch_codes(batch.table, schema)
    good = checked(batch, piece, schema, skips, codes)
    return good, codes if good is batch else batch_codes(good.table, schema)


def time_range(piece: Piece, schema: DatasetSchema) -> tuple[float, float]:
    assert schema.time is not None
    lo, hi = np.inf, -np.inf
    for batch in piece_rows(piece, schema, [schema.time], Skips()):
        t = epoch_seconds(batch.table.column(schema.time))[0]
        if len(t):
            lo, hi = min(lo, float(np.nanmin(t))), max(hi, float(np.nanmax(t)))
    return lo, hi


def time_hist(piece: Piece, schema: DatasetSchema, lo: float, hi: float) -> np.ndarray:
    assert schema.time is not None
    hist = np.zeros(HIST_BINS, np.int64)
    for batch in piece_rows(piece, schema, [schema.time], Skips()):
        t = epoch_seconds(batch.table.column(schema.time))[0]
        hist += np.histogram(t, bins=HIST_BINS, range=(lo, hi if hi > lo else lo + 1))[0]
    return hist


@dataclass
class PieceFit:
    """What the fit pass learned from pieces (merged with ``merge``)."""

    stats: BatchStats
    skips: Skips

    @staticmethod
    def merge(a: PieceFit, b: PieceFit) -> PieceFit:
        return PieceFit(a.stats.merge(b.stats), a.skips.merge(b.skips))


def fit_piece(piece: Piece, schema: DatasetSchema, plan: SplitPlan
              ) -> tuple[PieceFit, np.ndarray]:  # fmt: skip
    """The training rows' statistics of a piece, and the rows it dropped (``skip``: the write
    pass leaves them out without checking again)."""
    parts, skips = [], Skips()
    for raw in piece_batches(piece, schema, schema.columns(), skips):
        batch, codes = checked_codes(raw, piece, schema, skips)
        split = split_of(batch.table, schema, plan, batch.rows + piece.offset, piece.path)
        parts.append(fit_batch(batch.table, schema, split, codes))
    return PieceFit(BatchStats.merge_all(parts), skips), skips.dropped()


def needs_fit(schema: DatasetSchema) -> bool:
    """Whether anything is fitted before encoding (a vocabulary, ``standardize``); if not, one
    pass checks, encodes and writes."""
    vocab = any(schema.has_vocabulary(name) for name in schema.sparse)
    return vocab or any(c.transform == "standardize" for c in schema.dense.values())


def write_piece(
    piece: Piece, fitted: Fitted, folder: str, dropped: np.ndarray | None
) -> dict[str, Any]:
    """Encode a piece (without the ``dropped`` rows the fit pass found bad) and write its shard
    of each split; returns the shards and truncations. ``dropped`` None: no fit pass ran
    (``needs_fit``), so this one checks the rows and returns their statistics too."""
    schema = fitted.schema
    assert fitted.plan is not None
    writers: dict[int, ShardWriter] = {}
    truncated: dict[str, list[int]] = {}
    skips, parts = Skips(), []
    for raw in piece_batches(piece, schema, schema.columns(), skips, dropped):
        batch, codes = (raw, None) if dropped is not None else checked_codes(raw, piece, schema,
                                                                            skips)  # fmt: skip
        split = split_of(batch.table, schema, fitted.plan, batch.rows + piece.offset, piece.path)
        if dropped is None:
            parts.append(fit_batch(batch.table, schema, split, codes))
        enc = encode(batch.table, fitted, codes=codes)
        for k, (rows, ids) in enc.truncated.items():
            t = truncated.setdefault(k, [0, 0])
            t[0], t[1] = t[0] + rows, t[1] + ids
        for s in np.unique(split):
            if int(s) not in writers:
                path = os.path.join(folder, SPLIT_NAMES[s], piece.name)
                writers[int(s)] = ShardWriter(path, schema)
            writers[int(s)].append(enc.take(split == s))
    shards = {SPLIT_NAMES[s]: w.close(piece.name) for s, w in writers.items()}
    fit = PieceFit(BatchStats.merge_all(parts), skips) if dropped is None else None
    return {"shards": shards, "truncated": truncated, "fit": fit}
