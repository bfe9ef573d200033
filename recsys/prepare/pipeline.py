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

The passes are ``recsys.prepare.passes``, what the driver writes ``recsys.prepare.outputs``; here
is their order, the split's plan, and the output folder (built aside, or uploaded).

What ``meta.json`` says of the features (``SparseColumn`` has the row layout):

- ``feature_names``, ``table_sizes``: per sparse feature in schema order, its table's rows (a
  column sharing another's table has that table's size);
- ``shared``: ``{sharer: owner}`` for the columns using another column's table (``table``);
- ``vocab``: per feature with a vocabulary, its file (a sharer: its owner's);
- ``unseen``: per split and feature with a vocabulary, the ids that went to its unseen rows;
- ``like`` (``--like``): the earlier folder whose transforms were applied, and the rows each
  table grew by (``--grow-vocab``; ``recsys.prepare.like``);
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
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.errors import DataError
from recsys.data.prepared.meta import is_prepared, write_meta
from recsys.data.prepared.remote import upload_folder
from recsys.data.schema import DatasetSchema
from recsys.prepare.fit import BatchStats, Fitted
from recsys.prepare.like import check_dense, check_types, grown, like_meta, load_fitted
from recsys.prepare.outputs import (
    column_id_types,
    fitted_from,
    holds_nothing,
    id_types,
    meta_of,
    one_class,
    write_examples,
    write_vocabs,
)
from recsys.prepare.passes import (
    HIST_BINS,
    PieceFit,
    Skips,
    fit_piece,
    needs_fit,
    time_hist,
    time_range,
    write_piece,
)
from recsys.prepare.sources import (
    Inspection,
    Piece,
    count_rows,
    file_splits,
    input_files,
    inspect,
    plan_pieces,
    with_rows,
)
from recsys.prepare.splits import SPLIT_NAMES, SplitPlan
from recsys.prepare.tasks import Executor, tree_merge
from recsys.prepare.values import epoch_seconds
from recsys.runtime import storage
from recsys.runtime.shared_storage import check_nodes_see

CHUNK_MB = 64.0


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
    like: str | None = None,
    grow_vocab: bool = False,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out`` (see the module docstring); returns its ``meta.json``.
    ``workers``: local Ray worker processes (None: every core; 0: no Ray, this process).
    ``out`` may be an object store URI (``upload_prepared``). ``like``: an earlier prepared
    folder whose transforms this preparation applies (``schema`` must be its:
    ``recsys.prepare.like``), ``grow_vocab`` growing its vocabularies."""
    if not chunk_mb > 0:
        raise DataError(f"--chunk-mb={chunk_mb}: must be > 0")
    if storage.is_uri(out):
        return upload_prepared(
            lambda local: prepare(
                schema, inputs, local, workers=workers, address=address,
                object_store_mb=object_store_mb, chunk_mb=chunk_mb, progress=progress, like=like,
                grow_vocab=grow_vocab, log=log,
            ),
            out, overwrite, address, log,
        )  # fmt: skip
    earlier = checked_earlier(schema, like, grow_vocab)
    files, seen, splits = checked_inputs(schema, inputs, earlier, like, log)
    with partial_output(out, overwrite) as tmp:
        ex = Executor(workers, address, object_store_mb, progress)
        try:
            if address:  # the cluster's tasks write the shards: every node must see --out
                check_nodes_see({"--out": tmp})
            meta = _prepare(
                ex,
                schema,
                files,
                seen,
                splits,
                tmp,
                int(chunk_mb * 2**20),
                log,
                Earlier(str(like), earlier, grow_vocab) if earlier else None,
            )
        finally:
            ex.close()
    return meta


def checked_earlier(schema: DatasetSchema, like: str | None, grow_vocab: bool) -> Fitted | None:
    """The earlier folder's fitted transforms (``load_fitted``) for ``--like``, its schema
    checked against ``schema``; None without ``like``."""
    if grow_vocab and like is None:
        raise DataError("--grow-vocab grows an earlier folder's vocabularies: it needs --like")
    if like is None:
        return None
    if storage.is_uri(like):
        raise DataError(f"--like {like}: a local prepared folder (copy it from the store first)")
    earlier = load_fitted(like)
    check_same_schema(schema, earlier.schema, like)
    return earlier


def skipped_line(skipped: dict[str, int]) -> str:
    """What ``--on-bad-row skip`` left out: bad values per column, and text lines that did not
    split (``meta.json``'s ``skipped``: its ``lines``)."""
    columns = ", ".join(f"{k} {v:,}" for k, v in skipped.items() if k != "lines")
    parts = [f"bad values per column: {columns}"] if columns else []
    if skipped.get("lines"):
        parts.append(f"{skipped['lines']:,} text lines that did not split")
    return "; ".join(parts)


def checked_inputs(
    schema: DatasetSchema,
    inputs: list[str],
    earlier: Fitted | None,
    like: str | None,
    log: Callable[[str], Any],
) -> tuple[list[str], Inspection, dict[str, int]]:
    """The input files, what a first read of them saw (refused where a column's type or a group
    breaks ``schema``, or the types differ from ``earlier``'s), and their splits by file."""
    files = input_files(inputs, schema.format)
    seen = inspect(files, schema)
    if earlier is not None:
        # each column against its earlier self first: a shared table's column that changed
        # type is named as the change it is, not as a disagreement with its table's others
        held = {n: k for n, k in column_id_types(seen.types, schema).items()
                if not holds_nothing(seen.types.get(n))}  # fmt: skip
        check_types(str(like), earlier.id_types, held)
        check_dense(seen.types, schema, str(like))
    check_group(seen.types, schema)
    splits = file_splits(files, schema) if schema.split_by == "files" else {}
    for warning in seen.warnings():
        log(f"prepare: warning: {warning}")
    return files, seen, splits


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


FREE_WITH_LIKE = ("format", "csv", "split", "on_bad_row")  # do not change what an id means


def check_same_schema(schema: DatasetSchema, earlier: DatasetSchema, folder: Any) -> None:
    """``--like``: ``schema`` is the earlier folder's in everything that says what an id or a
    value means (it may read another format, split otherwise, skip bad rows: ``FREE_WITH_LIKE``);
    else the keys that differ are named."""
    mine = {k: v for k, v in schema.to_dict().items() if k not in FREE_WITH_LIKE}
    theirs = {k: v for k, v in earlier.to_dict().items() if k not in FREE_WITH_LIKE}
    if mine != theirs:
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise DataError(
            f"--like {folder}: the schema differs from that folder's in {keys}; a later period "
            "is prepared with the earlier folder's own schema"
        )


def check_group(types: dict[str, pa.DataType | None], schema: DatasetSchema) -> None:
    """``group_by`` names a column of integers or text: a float's values would merge when
    hashed as integers, and its NaNs would form one group."""
    tp = types.get(schema.group_by or "")
    if tp is not None and pa.types.is_floating(tp):
        raise DataError(f"group_by={schema.group_by!r}: a column of {tp}; groups are integers or "
                        "text (cast the column)")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Earlier:
    """``--like``: the earlier folder, its transforms, and whether its vocabularies grow."""

    folder: str
    fitted: Fitted
    grow: bool

    def fitted_for(self, stats: BatchStats, schema: DatasetSchema, plan: SplitPlan) -> Fitted:
        return grown(self.fitted, stats if self.grow else BatchStats(), schema, plan)


def _prepare(
    ex: Executor, schema: DatasetSchema, files: list[str], seen: Inspection,
    splits: dict[str, int], folder: str, chunk_bytes: int, log: Callable[[str], Any],
    earlier: Earlier | None = None,
) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()
    types = id_types(seen.types, schema)  # before any work: a shared table's types agree
    pieces, plan = _plan(ex, schema, plan_pieces(files, schema, chunk_bytes), splits)
    drops: list[np.ndarray | None] = [None] * len(pieces)
    fit = PieceFit(BatchStats(), Skips())
    fits_first = earlier.grow if earlier is not None else needs_fit(schema)
    if fits_first:
        fits = ex.map_keep(fit_piece, [(p, schema, plan) for p in pieces], "fit")
        fit = tree_merge(ex, [f for f, _ in fits], PieceFit.merge)
        drops = [dropped for _, dropped in fits]
        del fits  # the pieces' statistics: merged, so Ray may free them
        log(f"prepare: checked and fitted {int(fit.stats.rows.sum()):,} rows of {len(files)} "
            f"file(s) in {len(pieces)} piece(s) ({time.perf_counter() - t0:.1f}s)")  # fmt: skip
    if earlier is not None:
        fitted = earlier.fitted_for(fit.stats, schema, plan)
    else:
        fitted = fitted_from(fit.stats, schema, plan)
        fitted.id_types = types
    vocab_files = write_vocabs(folder, fitted)
    for s in SPLIT_NAMES:
        os.makedirs(os.path.join(folder, s))
    ref = ex.put(fitted)
    calls = [(p, ref, folder, d) for p, d in zip(pieces, drops, strict=True)]
    written = ex.map(write_piece, calls, "write")
    if not fits_first:  # one pass: its statistics came with the shards
        fit = PieceFit(
            BatchStats.merge_all([w["fit"].stats for w in written]),
            functools.reduce(Skips.merge, [w["fit"].skips for w in written], Skips()),
        )
        if earlier is None:  # (--like: the earlier training rows' statistics stay)
            fitted.dense_stats = fitted_from(fit.stats, schema, plan).dense_stats
    meta = meta_of(schema, files, fitted, fit, written, vocab_files, seen)
    if earlier is not None:
        meta["like"] = like_meta(earlier.folder, earlier.fitted, fitted)
    if meta["rows"]["train"] == 0:
        raise DataError(f"{files[0]}...: no training rows after the split")
    for line in one_class(meta["label_counts"]):
        log(f"prepare: warning: {line}")
    if meta["skipped"]:  # (--on-bad-row skip) said here as well as in meta.json
        log(f"prepare: skipped rows ({skipped_line(meta['skipped'])}; meta.json's 'skipped')")
    write_examples(folder, pieces, schema)
    write_meta(folder, meta)
    rows = meta["rows"]
    log(f"prepare: wrote {sum(rows.values()):,} rows (train {rows['train']:,}, val "
        f"{rows['val']:,}, test {rows['test']:,}) in {time.perf_counter() - t0:.1f}s")  # fmt: skip
    return meta
