"""Prepare click logs (Parquet or delimited text, any schema; Criteo is one) for training.

    recsys-preprocess --schema schemas/clicklogs.yaml logs/ --out data/logs_prepared
    recsys-preprocess --schema criteo_kaggle train.txt --out data/criteo_kaggle
    recsys-preprocess --schema criteo_terabyte day_{0..23}.gz --out /shared/criteo_1tb \\
        --address auto                                  # a Ray cluster; --out on shared storage

The inputs are cut into pieces (``recsys.prepare.sources``: row groups, byte ranges at line
starts, whole gzip files) that depend on the files only, and every pass is one Ray task per piece
(a local Ray of ``--workers`` processes, or a cluster with ``--address``; ``--workers 0``: the same
tasks one after the other in this process, no Ray). Each task reads its piece itself:

1. (``split.by: time``) the time column's range and a 65,536-bin histogram: the cut points;
   (``order``) the pieces' row counts: the row numbers where validation and test start;
2. **fit**: check every value (bad ones stop the run naming file, column and row or line, or are
   skipped and counted) and count, on the **training rows only**, the ids per table (the columns
   sharing a table counted together; vocabularies: values seen ``min_count`` times, at most
   ``max_size``, by descending count) and the dense sums (``standardize``); per-piece counts are
   merged by a tree of merge tasks;
3. **write**: encode (ids through the vocabularies or hash buckets, time features from their
   timestamps, dense transforms, lists cut to ``max_len``) and write the piece's own **shard** of
   each split: ``<split>/part-<k>.*.npy`` (``recsys.data.prepared.folder`` says which files). The
   driver writes only the vocabularies (``vocab/sparse_<j>.npy``, one per table: ``j`` is its
   owner's place among the sparse features), ``meta.json`` (the schema, what was fitted, and the
   index of the shards) and a few example rows; it never holds the data.

What ``meta.json`` says of the features (``SparseColumn`` has the row layout):

- ``feature_names``, ``table_sizes``: per sparse feature in schema order, its table's rows (a
  column sharing another's table has that table's size);
- ``shared``: ``{sharer: owner}`` for the columns using another column's table (``table``);
- ``vocab``: per feature with a vocabulary, its file (a sharer: its owner's);
- ``id_types``: per id column, ``int`` or ``string`` (what serving casts raw ids to); the
  columns of one table must agree (a ``DataError`` names both otherwise; an all-null column
  takes its table's type);
- ``features``: per feature, which rows are which, ranges ``[first, last]``::

      "item_id": {"table": "item_id", "kind": "vocabulary", "size": 5010,
                  "rows": {"missing": 0, "unseen": [1, 8], "vocabulary": [9, 5009]}},
      "history": {"table": "item_id", "kind": "vocabulary", "size": 5010, "rows": {...}},
      "country": {"table": "country", "kind": "hash", "size": 65,
                  "rows": {"missing": 0, "hashed": [1, 64]}},
      "event_hour": {"table": "event_hour", "kind": "hour", "size": 25,
                     "rows": {"missing": 0, "hour": [1, 24]}}

  ``kind``: ``vocabulary`` (``"vocabulary": null`` when no value was kept), ``hash``,
  ``identity`` (``"identity": [0, B - 1]``: id ``i`` is row ``i mod B``, missing row 0 too),
  ``hour`` (hour ``h`` is row ``1 + h``), ``weekday`` (Monday is row 1), ``age``
  (``"buckets": [1, len(buckets) + 1]``).

The same input and schema give the same shards, byte for byte, whatever the worker count. The
output is built in ``OUT.partial`` and renamed to ``OUT`` only when complete, so a failed or
killed run never leaves a folder that reads as prepared; a later run removes the stale
``.partial`` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.errors import DataError
from recsys.data.prepared.meta import FORMAT, is_prepared, write_meta
from recsys.data.prepared.remote import upload_folder
from recsys.data.schema import DatasetSchema, SparseColumn
from recsys.prepare.checks import check
from recsys.prepare.encode import encode
from recsys.prepare.fit import BatchStats, Fitted, fit_batch
from recsys.prepare.ids import Codes, Vocabulary, batch_codes
from recsys.prepare.shards import ShardWriter
from recsys.prepare.sources import (
    BadLine,
    Inspection,
    Piece,
    Rows,
    count_rows,
    file_splits,
    input_files,
    inspect,
    line_of,
    plan_pieces,
    read_piece,
    with_rows,
)
from recsys.prepare.splits import SPLIT_NAMES, SplitPlan, split_of
from recsys.prepare.tasks import Executor, tree_merge
from recsys.prepare.values import epoch_seconds, is_list
from recsys.runtime import storage
from recsys.runtime.shared_storage import check_nodes_see

HIST_BINS = 1 << 16
CHUNK_MB = 64.0


# ---------------------------------------------------------------------------------------------
# Checking rows (the same in the fit and the write pass)


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


# ---------------------------------------------------------------------------------------------
# The passes: one task per piece


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


# ---------------------------------------------------------------------------------------------
# The whole preparation


def upload_prepared(
    make: Callable[[str], dict[str, Any]],
    out: str,
    overwrite: bool,
    address: str | None,
    log: Callable[[str], Any],
) -> dict[str, Any]:
    """Prepare with ``make`` into a local temporary folder (the system's temp folder), then
    upload it to object store URI ``out``: every file but ``meta.json``, then ``meta.json``,
    whose presence is what marks a prepared folder (``read_meta``), so a failed or killed
    upload never reads as prepared. An existing prepared ``out`` is refused, or with
    ``overwrite`` replaced; what a killed upload left there is removed first. The
    preparation's tasks write locally: not with ``address`` (a cluster's nodes do not share
    this machine's disk)."""

    if address:
        raise DataError(
            f"--out {out}: an object store is written from this machine's preparation, not from "
            f"a Ray cluster's nodes ({address}): prepare onto storage every node shares and copy "
            "the folder up, or prepare here with --address local"
        )
    storage.check_storage(out, flag="--out")
    prepared = is_prepared(out)
    if prepared and not overwrite:
        raise DataError(f"{out} exists; choose another --out or pass --overwrite")
    local = tempfile.mkdtemp(prefix="recsys-prepare-")
    try:
        meta = make(os.path.join(local, "prepared"))
        upload_folder(os.path.join(local, "prepared"), out, log)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return meta


@contextlib.contextmanager
def partial_output(out: str, overwrite: bool) -> Iterator[str]:
    """A fresh ``OUT.partial`` folder, renamed to ``OUT`` on success and removed on failure."""
    from filelock import FileLock, Timeout

    out = os.path.abspath(out.rstrip("/"))
    if os.path.exists(out) and not overwrite:
        raise DataError(f"{out} exists; choose another --out or pass --overwrite")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    lock = FileLock(out + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise DataError(f"{out}: another preparation is writing it ({out}.lock)") from None
    tmp = out + ".partial"
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # a killed earlier run's leftovers
        os.makedirs(tmp)
        yield tmp
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
        with contextlib.suppress(OSError):
            os.remove(out + ".lock")


def parquet_time_range(files: list[str], column: str) -> tuple[float, float] | None:
    """The time column's range from the Parquet files' row-group statistics (no data read), or
    None where a file lacks them or the type is not a plain number or timestamp."""
    import pyarrow.parquet as pq

    lo, hi = np.inf, -np.inf
    for path in files:
        meta = pq.ParquetFile(path).metadata
        arrow = meta.schema.to_arrow_schema()
        index, tp = arrow.get_field_index(column), arrow.field(column).type
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(index).statistics
            if stats is None or not stats.has_min_max:
                return None
            try:
                a, b = (epoch_seconds(pa.array([v], tp))[0][0] for v in (stats.min, stats.max))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                return None
            lo, hi = min(lo, a), max(hi, b)
    return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else None


def cuts_of(hist: np.ndarray, lo: float, hi: float, schema: DatasetSchema) -> tuple[float, float]:
    """``(val_from, test_from)``: the bin edges where the time histogram over ``[lo, hi]``
    reaches the training and the training + validation shares."""
    edges = np.linspace(lo, hi if hi > lo else lo + 1, HIST_BINS + 1)
    cum = np.cumsum(hist) / max(hist.sum(), 1)

    def cut(q: float) -> float:
        k = min(int(np.searchsorted(cum, q, side="left")) + 1, HIST_BINS)
        return float(edges[k]) if q < 1 else np.inf

    sp = schema.split
    return cut(1 - sp.val_fraction - sp.test_fraction), cut(1 - sp.test_fraction)


def time_cuts(ex: Executor, pieces: list[Piece], schema: DatasetSchema) -> tuple[float, float]:
    """``(val_from, test_from)`` from a histogram of the time column over all rows (its range
    from the Parquet statistics where every file has them, else from a pass of its own)."""
    assert schema.time is not None
    files = sorted({p.path for p in pieces})
    known = parquet_time_range(files, schema.time) if schema.format == "parquet" else None
    if known is None:
        ranges = ex.map(time_range, [(p, schema) for p in pieces], "time range")
        known = (min(r[0] for r in ranges), max(r[1] for r in ranges))
    lo, hi = known
    if lo > hi:
        raise DataError(f"time column {schema.time!r}: no row has a time")
    hists = ex.map(time_hist, [(p, schema, lo, hi) for p in pieces], "time cut points")
    return cuts_of(np.sum(hists, axis=0), lo, hi, schema)


def order_bounds(pieces: list[Piece], schema: DatasetSchema) -> tuple[int, int]:
    """``split.by: order``: the input row numbers (over all files) where validation and test
    start."""
    total = sum(p.rows or 0 for p in pieces)
    n_test = round(total * schema.split.test_fraction)
    n_val = round(total * schema.split.val_fraction)
    return total - n_test - n_val, total - n_test


def global_rows(pieces: list[Piece]) -> list[Piece]:
    """``order``: each piece with the rows of the files before its own (its rows' numbers plus
    that are input rows over all files)."""
    out, total, offset, file = [], 0, 0, -1
    for p in pieces:
        if p.file != file:
            offset, file = total, p.file
        out.append(dataclasses.replace(p, offset=offset))
        total += p.rows or 0
    return out


def fitted_from(stats: BatchStats, schema: DatasetSchema, plan: SplitPlan) -> Fitted:
    vocabs: dict[str, Vocabulary] = {}
    for name in schema.sparse:  # owners before their sharers or after: one vocabulary a table
        if not schema.has_vocabulary(name):
            continue
        table = schema.table_of(name)
        if table not in vocabs:
            spec = schema.sparse[table]
            values, counts = stats.counts.get(table, (np.zeros(0, np.uint64), np.zeros(0)))
            vocabs[table] = Vocabulary.build(values, counts, spec.min_count, spec.max_size,
                                             spec.oov_buckets)  # fmt: skip
        vocabs[name] = vocabs[table]
    dense_stats = {}
    for name in schema.dense:
        n, s, ss, lo, hi = stats.dense.get(name, np.array([0, 0, 0, 0, 0]))
        mean = s / n if n else 0.0
        std = float(np.sqrt(max(ss / n - mean * mean, 0.0))) if n else 1.0
        dense_stats[name] = {"mean": float(mean), "std": std if std > 1e-12 else 1.0,
                             "min": float(lo), "max": float(hi), "count": int(n)}  # fmt: skip
    return Fitted(schema, vocabs, dense_stats, plan)


def write_vocabs(folder: str, fitted: Fitted) -> dict[str, str]:
    """One file per table with a vocabulary (named by its owner's place); per feature with a
    vocabulary, its table's file."""
    schema = fitted.schema
    os.makedirs(os.path.join(folder, "vocab"))
    place = {name: j for j, name in enumerate(schema.sparse)}
    files = {}
    for name in schema.sparse:
        if name not in fitted.vocabs:
            continue
        table = schema.table_of(name)
        files[name] = f"vocab/sparse_{place[table]}.npy"
        if name == table:
            np.save(os.path.join(folder, files[name]), fitted.vocabs[name].hashes)
    return files


def write_examples(folder: str, pieces: list[Piece], schema: DatasetSchema) -> None:
    """A few raw input rows' features (``examples.parquet``): the served model's input example
    (dense values as numbers, ids as the file holds them, a CSV file's lists as lists), from the
    first piece with rows."""
    import pyarrow.parquet as pq

    from recsys.prepare.values import as_list, is_text, numeric

    cols = schema.serving_columns()
    batches = (good(b.table, schema) for p in pieces for b in read_piece(p, schema, cols, []))
    table = next(t for t in batches if t.num_rows).slice(0, 5)
    for name in schema.dense:
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.array(numeric(table.column(name))[0]))
    for name, spec in list_columns(schema).items():  # CSV text lists: as the lists they write
        i = table.column_names.index(name)
        if is_text(table.column(name).type):
            flat, lengths = as_list(table.column(name), spec)
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            table = table.set_column(i, name, pa.ListArray.from_arrays(offsets, flat))
    pq.write_table(table, os.path.join(folder, "examples.parquet"))


def list_columns(schema: DatasetSchema) -> dict[str, SparseColumn]:
    """Every column that holds lists, with the spec that splits its CSV text: the multi-hot
    id columns, their weights and sequence times."""
    out: dict[str, SparseColumn] = {}
    for name, spec in schema.sparse.items():
        if spec.multi_hot and spec.derive is None:
            out[name] = schema.id_spec(name)
            order = spec.sequence.order_by if spec.sequence is not None else None
            for column in (spec.weights, order):
                if column is not None:
                    out.setdefault(column, out[name])
    return out


def good(table: pa.Table, schema: DatasetSchema) -> pa.Table:
    """The rows of ``table`` without a bad value (``skip`` left them out of the output)."""
    bad = np.zeros(table.num_rows, bool)
    for mask, _ in check(table, schema).values():
        bad |= mask
    return table.filter(pa.array(~bad)) if bad.any() else table


def id_types(types: dict[str, Any], schema: DatasetSchema) -> dict[str, str]:
    """Per id column, the type its ids are hashed as (serving casts raw values to it). The
    columns of a shared table must agree (``5`` and ``"5"`` hash apart); one holding no value
    (Arrow's ``null`` type) takes its table's type."""
    out: dict[str, str] = {}
    known: dict[str, tuple[str, str]] = {}  # table: (a column with a type, its type)
    for name in schema.roles()["sparse"]:
        tp = types.get(name)
        inner = tp.value_type if tp is not None and is_list(tp) else tp
        if inner is not None and pa.types.is_dictionary(inner):
            inner = inner.value_type
        integer = inner is not None and pa.types.is_integer(inner)  # hex reads text only
        out[name] = "int" if integer else "string"
        if inner is not None and pa.types.is_null(inner):
            continue
        table = schema.table_of(name)
        other, kind = known.setdefault(table, (name, out[name]))
        if kind != out[name]:
            raise DataError(f"columns {other!r} ({kind} ids) and {name!r} ({out[name]} ids) "
                            f"share table {table!r}: ids of one table must be all integers or "
                            "all strings (cast one column)")  # fmt: skip
    for name in out:
        if schema.table_of(name) in known:
            out[name] = known[schema.table_of(name)][1]
    return out


def label_counts(stats: BatchStats, schema: DatasetSchema) -> dict[str, dict[str, Any]]:
    """Rows and positives per split and label."""
    out: dict[str, dict[str, Any]] = {}
    for s, split in enumerate(SPLIT_NAMES):
        rows = int(stats.rows[s])
        pos = stats.positives[s] if stats.positives.size else np.zeros(len(schema.labels))
        out[split] = {lab: {"rows": rows, "positives": int(pos[k])}
                      for k, lab in enumerate(schema.labels)}  # fmt: skip
    return out


def one_class(counts: dict[str, dict[str, Any]]) -> list[str]:
    """A line per split and label whose rows are all of one class (its AUC is undefined)."""
    out = []
    for split, labels in counts.items():
        for lab, c in labels.items():
            if c["rows"] and c["positives"] in (0, c["rows"]):
                cls = 1 if c["positives"] else 0
                out.append(f"label {lab!r} has one class in {split} ({c['rows']:,} rows, all "
                           f"{cls}): its AUC there cannot be computed")  # fmt: skip
    return out


def prepare(
    schema: DatasetSchema,
    inputs: list[str],
    out: str,
    *,
    workers: int | None = None,
    address: str | None = None,
    object_store_mb: int | None = None,
    chunk_mb: float = CHUNK_MB,
    overwrite: bool = False,
    progress: bool = False,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out`` (see the module docstring); returns its ``meta.json``.
    ``workers``: local Ray worker processes (None: every core; 0: no Ray, this process).
    ``out`` may be an object store URI (``upload_prepared``)."""
    if not chunk_mb > 0:
        raise DataError(f"--chunk-mb={chunk_mb}: must be > 0")
    if storage.is_uri(out):
        return upload_prepared(
            lambda local: prepare(
                schema, inputs, local, workers=workers, address=address,
                object_store_mb=object_store_mb, chunk_mb=chunk_mb, progress=progress, log=log,
            ),
            out, overwrite, address, log,
        )  # fmt: skip
    files = input_files(inputs, schema.format)
    seen = inspect(files, schema)
    splits = file_splits(files, schema) if schema.split_by == "files" else {}
    for warning in seen.warnings():
        log(f"prepare: warning: {warning}")
    with partial_output(out, overwrite) as tmp:
        ex = Executor(workers, address, object_store_mb, progress)
        try:
            if address:  # the cluster's tasks write the shards: every node must see --out
                check_nodes_see({"--out": tmp})
            meta = _prepare(ex, schema, files, seen, splits, tmp, int(chunk_mb * 2**20), log)
        finally:
            ex.close()
    return meta


def _plan(ex: Executor, schema: DatasetSchema, pieces: list[Piece], splits: dict[str, int]
          ) -> tuple[list[Piece], SplitPlan]:  # fmt: skip
    """The pieces with their rows counted where needed (text: for line numbers; ``order``:
    for the bounds), and the split plan."""
    by = schema.split_by
    need = [p for p in pieces if p.rows is None and (p.stop is not None or by == "order")]
    counts = ex.map(count_rows, [(p, schema) for p in need], "count rows") if need else []
    counted = dict(zip([p.index for p in need], counts, strict=True))
    pieces = with_rows(pieces, [counted.get(p.index, p.rows) for p in pieces])
    if by == "time":
        return pieces, SplitPlan("time", cuts=time_cuts(ex, pieces, schema))
    if by == "order":
        pieces = global_rows(pieces)
        return pieces, SplitPlan("order", bounds=order_bounds(pieces, schema))
    if by == "files":
        return pieces, SplitPlan("files", files=splits)
    return pieces, SplitPlan("hash")


def _prepare(
    ex: Executor, schema: DatasetSchema, files: list[str], seen: Inspection,
    splits: dict[str, int], folder: str, chunk_bytes: int, log: Callable[[str], Any],
) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()
    types = id_types(seen.types, schema)  # before any work: a shared table's types agree
    pieces, plan = _plan(ex, schema, plan_pieces(files, schema, chunk_bytes), splits)
    drops: list[np.ndarray | None] = [None] * len(pieces)
    fit = PieceFit(BatchStats(), Skips())
    if needs_fit(schema):
        fits = ex.map_keep(fit_piece, [(p, schema, plan) for p in pieces], "fit")
        fit = tree_merge(ex, [f for f, _ in fits], PieceFit.merge)
        drops = [dropped for _, dropped in fits]
        del fits  # the pieces' statistics: merged, so Ray may free them
        log(f"prepare: checked and fitted {int(fit.stats.rows.sum()):,} rows of {len(files)} "
            f"file(s) in {len(pieces)} piece(s) ({time.perf_counter() - t0:.1f}s)")  # fmt: skip
    fitted = fitted_from(fit.stats, schema, plan)
    fitted.id_types = types
    vocab_files = write_vocabs(folder, fitted)
    for s in SPLIT_NAMES:
        os.makedirs(os.path.join(folder, s))
    ref = ex.put(fitted)
    calls = [(p, ref, folder, d) for p, d in zip(pieces, drops, strict=True)]
    written = ex.map(write_piece, calls, "write")
    if not needs_fit(schema):  # one pass: its statistics came with the shards
        fit = PieceFit(
            BatchStats.merge_all([w["fit"].stats for w in written]),
            functools.reduce(Skips.merge, [w["fit"].skips for w in written], Skips()),
        )
        fitted.dense_stats = fitted_from(fit.stats, schema, plan).dense_stats  # fmt: skip
    meta = _meta(schema, files, fitted, fit, written, vocab_files, seen)
    if meta["rows"]["train"] == 0:
        raise DataError(f"{files[0]}...: no training rows after the split")
    for line in one_class(meta["label_counts"]):
        log(f"prepare: warning: {line}")
    write_examples(folder, pieces, schema)
    write_meta(folder, meta)
    rows = meta["rows"]
    log(f"prepare: wrote {sum(rows.values()):,} rows (train {rows['train']:,}, val "
        f"{rows['val']:,}, test {rows['test']:,}) in {time.perf_counter() - t0:.1f}s")  # fmt: skip
    return meta


def _meta(
    schema: DatasetSchema, files: list[str], fitted: Fitted, fit: PieceFit,
    written: list[dict[str, Any]], vocab_files: dict[str, str], seen: Inspection,
) -> dict[str, Any]:  # fmt: skip
    shards: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLIT_NAMES}
    truncated: dict[str, dict[str, int]] = {}
    for w in written:
        for s, shard in w["shards"].items():
            if shard["rows"]:
                shards[s].append(shard)
        for k, (rows, ids) in w["truncated"].items():
            t = truncated.setdefault(k, {"rows": 0, "ids": 0})
            t["rows"], t["ids"] = t["rows"] + rows, t["ids"] + ids
    plan = fitted.plan
    assert plan is not None
    counts = label_counts(fit.stats, schema)
    return {
        "format": FORMAT,
        "schema": schema.to_dict(),
        "sources": files,
        "rows": {s: sum(x["rows"] for x in shards[s]) for s in SPLIT_NAMES},
        "ids": {
            s: {n: sum(x["ids"][n] for x in shards[s]) for n in schema.sparse} for s in SPLIT_NAMES
        },
        "shards": shards,
        "skipped": {
            **fit.skips.columns,
            **({"lines": len(fit.skips.lines)} if fit.skips.lines else {}),
        },
        "truncated": truncated,
        "split": {
            "by": plan.by,
            "time_cuts": list(plan.cuts) if plan.cuts else None,
            "row_bounds": list(plan.bounds) if plan.bounds else None,
        },
        "label_counts": counts,
        "dense_stats": fitted.dense_stats,
        "feature_names": list(schema.sparse),
        "table_sizes": fitted.table_sizes(),
        "shared": schema.shared(),
        "features": {name: fitted.layout(name) for name in schema.sparse},
        "vocab": vocab_files,
        "id_types": fitted.id_types,
        "labels": list(schema.labels),
        "warnings": seen.warnings() + one_class(counts),
    }
