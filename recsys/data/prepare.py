"""Prepare a user's click logs (Parquet or CSV, any schema) for training, on Ray Data.

    recsys-preprocess --schema schema.yaml logs/*.parquet --out data/logs_prepared
    recsys-preprocess --schema schema.yaml s3-mounted/*.parquet --out /shared/p --address auto

The files are read with Ray Data (``read_parquet`` / ``read_csv``, streamed in blocks; a local
Ray with ``--workers`` CPUs and ``--object-store-mb`` of object store, or a cluster with
``--address``) and go through up to three streamed passes of batch transforms
(``recsys.data.encode``), the same on every batch:

1. (with a ``time`` column) its range and a 65,536-bin histogram: the validation and test cut
   points;
2. check every value (bad ones stop the run naming file, column and row, or are skipped and
   counted) and fit on the **training rows only**: id counts per sparse column (vocabularies:
   values seen ``min_count`` times, by descending count; rare, unseen and missing share row 0) and
   dense sums (``standardize``'s mean and std);
3. encode (ids through the vocabularies or hash buckets, dense transforms, lists truncated to
   ``max_len``) and write, in input order, one folder per split (``train/``, ``val/``, ``test/``):
   ``dense.npy [N, I]`` float32, ``labels.npy [N, L]`` int8, and per sparse feature ``j`` either
   ``sparse_{j}.ids.npy [N]`` uint32 (one id per row) or ``sparse_{j}.values.npy [nnz]`` uint32
   with ``sparse_{j}.offsets.npy [N + 1]`` int64 (a list column: Arrow's list layout, never
   padded). ``vocab/sparse_{j}.npy`` holds each vocabulary's value hashes in row order, and
   ``meta.json`` (written last) the schema, the fitted statistics, table sizes and counts.

Nothing is materialised whole: each pass streams blocks, the driver merges small per-block
statistics and appends encoded blocks to the split files. The output is built in
``OUT.partial`` and renamed to ``OUT`` only when complete, so a failed or killed run never leaves
a folder that reads as prepared; a later run removes the stale ``.partial`` first.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pickle
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.columns import DataError
from recsys.data.encode import (
    SPLIT_NAMES,
    BadValue,
    BatchStats,
    Encoded,
    Fitted,
    Vocabulary,
    check,
    column_problem,
    encode,
    first_bad,
    fit_batch,
    is_list,
    is_text,
    split_of,
    time_values,
)
from recsys.data.meta import FORMAT, META
from recsys.data.schema import DatasetSchema

PATH_COLUMN = "path"  # the column Ray Data's include_paths adds
HIST_BINS = 1 << 16
BATCH_ROWS = 1 << 16
HEADER_BYTES = 256  # fixed npy header length, so the row count can be written at the end


# ---------------------------------------------------------------------------------------------
# Inputs


def input_files(inputs: list[str], fmt: str) -> list[str]:
    """The files to read: files as given, folders expanded to their ``*.<format>`` files."""
    files: list[str] = []
    for path in inputs:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, f"*.{fmt}")))
            if not found:
                raise DataError(f"{path}: a folder with no *.{fmt} files")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return [os.path.abspath(f) for f in files]


def file_types(path: str, fmt: str) -> dict[str, pa.DataType | None]:
    """A file's columns and their types (CSV: the header's names, types unknown: None)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return {f.name: f.type for f in pq.read_schema(path)}
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    import csv

    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise DataError(f"{path}: empty CSV file (a header line is needed)")
    return {name: None for name in header}


def _kind(tp: pa.DataType) -> str:
    """A type's family, for comparing files (int32 and int64 agree; int and string do not)."""
    if is_list(tp):
        return f"list<{_kind(tp.value_type)}>"
    for name, test in (
        ("text", is_text),
        ("integer", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("boolean", pa.types.is_boolean),
        ("timestamp", pa.types.is_timestamp),
        ("date", pa.types.is_date),
    ):
        if test(tp):
            return name
    return str(tp)


def inspect(files: list[str], schema: DatasetSchema) -> dict[str, pa.DataType | None]:
    """Check that every file has every schema column, and (Parquet) that the files agree on
    their types, before anything runs. Returns each column's type (of the first file)."""
    first: dict[str, tuple[str, pa.DataType | None]] = {}
    for path in files:
        types = file_types(path, schema.format)
        for role, names in schema.roles().items():
            for name in names:
                if name not in types:
                    raise DataError(
                        f"{path}: column {name!r} ({role} in the schema) is missing; the file "
                        f"has {sorted(types)[:12]}"
                    )
                tp = types[name]
                if name not in first:
                    first[name] = (path, tp)
                elif tp is not None and _kind(tp) != _kind(first[name][1]):  # type: ignore[arg-type]
                    other, otp = first[name]
                    raise DataError(
                        f"files disagree on column {name!r}: {other} has {otp}, {path} has {tp}"
                    )
    for name, (path, tp) in first.items():
        if tp is None or pa.types.is_null(tp) or name in schema.labels or name == schema.time:
            continue  # CSV, or checked per value
        bad, why = column_problem(name, pa.nulls(1, tp), schema)
        if bad.any():
            raise DataError(f"{path}: column {name!r} has type {tp}: {why}")
    return {name: tp for name, (_, tp) in first.items()}


def read(files: list[str], schema: DatasetSchema, columns: list[str]) -> Any:
    """The files as a Ray ``Dataset`` of the named columns plus each row's file (``path``);
    CSV columns are read as text and converted by ``recsys.data.encode`` (so a bad value is
    found and named there, as in Parquet). One read block per file (at least one per CPU):
    Ray's default, many small blocks, made each pass 2x slower here (BENCHMARKS.md)."""
    import ray
    import ray.data

    blocks = max(len(files), int(ray.cluster_resources().get("CPU", 1)))
    if schema.format == "parquet":
        ds = ray.data.read_parquet(files, include_paths=True, override_num_blocks=blocks)
        return ds.select_columns([*columns, PATH_COLUMN])
    import pyarrow.csv as pacsv

    convert = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in columns}, include_columns=columns
    )
    return ray.data.read_csv(
        files, include_paths=True, convert_options=convert, override_num_blocks=blocks
    )


def iter_file(path: str, schema: DatasetSchema, columns: list[str]) -> Iterator[pa.Table]:
    """One file's rows in order, in batches, without Ray (locating a bad row; examples)."""
    if schema.format == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(BATCH_ROWS, columns=columns):
            yield pa.Table.from_batches([batch])
        return
    import pyarrow.csv as pacsv

    convert = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in columns}, include_columns=columns
    )
    with pacsv.open_csv(path, convert_options=convert) as reader:
        for batch in reader:
            yield pa.Table.from_batches([batch])


def locate(bad: BadValue, schema: DatasetSchema) -> DataError:
    """The error of a bad value with its row: its file is read again (this file, this column
    only) up to the first bad row. CSV rows are also given as lines (the header is line 1)."""
    row = 0
    for batch in iter_file(bad.path, schema, [bad.column]):
        mask, why = column_problem(bad.column, batch.column(bad.column), schema)
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            line = f" (line {row + i + 2})" if schema.format == "csv" else ""
            value = batch.column(bad.column)[i].as_py()
            return DataError(
                f"{bad.path}: column {bad.column!r}, row {row + i}{line}: {why} (got {value!r})"
            )
        row += batch.num_rows
    return DataError(str(bad))


# ---------------------------------------------------------------------------------------------
# The passes (each a function of one batch, run by Ray Data)


def _checked(table: pa.Table, schema: DatasetSchema) -> tuple[pa.Table, dict[str, int]]:
    """The batch without its bad rows (``skip``), and the bad rows per column; ``error``
    raises the first bad value (in the fit pass it is returned as data instead: Ray keeps only
    the text of a task's exception)."""
    problems = check(table, schema)
    if not problems:
        return table, {}
    if schema.on_bad_row == "error":
        raise first_bad(table, problems, PATH_COLUMN)
    bad = np.zeros(table.num_rows, bool)
    skipped = {}
    for name, (mask, _) in problems.items():
        skipped[name] = int((mask & ~bad).sum())
        bad |= mask
    return table.filter(pa.array(~bad)), skipped


def _time_range(table: pa.Table, time_col: str) -> pa.Table:
    t, missing, bad = time_values(table.column(time_col))
    t = t[~(missing | bad)]
    lo, hi = (float(t.min()), float(t.max())) if len(t) else (np.inf, -np.inf)
    return pa.table({"lo": [lo], "hi": [hi]})


def _time_hist(table: pa.Table, time_col: str, lo: float, hi: float) -> pa.Table:
    t, missing, bad = time_values(table.column(time_col))
    t = t[~(missing | bad)]
    hist = np.histogram(t, bins=HIST_BINS, range=(lo, hi if hi > lo else lo + 1))[0]
    return pa.table({"hist": [pickle.dumps(hist.astype(np.int64))]})


def _fit(table: pa.Table, schema: DatasetSchema, cuts: Any) -> pa.Table:
    """A batch's statistics, or (``error``) its first bad value, pickled."""
    try:
        table, skipped = _checked(table, schema)
    except BadValue as bad:
        return pa.table({"stats": [pickle.dumps(bad)]})
    stats = fit_batch(table, schema, split_of(table, schema, cuts))
    return pa.table({"stats": [pickle.dumps((stats, skipped))]})


def _encode(table: pa.Table, fitted: Fitted) -> pa.Table:
    """Encoded rows as a table: ``__split``, ``d{j}`` dense, ``y{k}`` labels, ``s{j}`` ids
    (one-hot) or ``list<uint32>`` (multi-hot), plus the truncation counts of the batch."""
    table, _ = _checked(table, fitted.schema)
    split = split_of(table, fitted.schema, fitted.cuts)
    enc = encode(table, fitted)
    cols: dict[str, Any] = {"__split": split}
    for j in range(enc.dense.shape[1]):
        cols[f"d{j}"] = enc.dense[:, j]
    assert enc.labels is not None
    for k in range(enc.labels.shape[1]):
        cols[f"y{k}"] = enc.labels[:, k]
    for j, name in enumerate(fitted.schema.sparse):
        lens = enc.lengths[name]
        if lens is None:
            cols[f"s{j}"] = enc.ids[name]
        else:
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            cols[f"s{j}"] = pa.ListArray.from_arrays(offsets, pa.array(enc.ids[name]))
    out = pa.table(cols)
    trunc = json.dumps({k: list(v) for k, v in enc.truncated.items()}).encode()
    return out.replace_schema_metadata({"truncated": trunc})


def decode_block(block: pa.Table, schema: DatasetSchema) -> tuple[np.ndarray, Encoded]:
    """``(split, Encoded)`` of a block made by ``_encode``."""
    n_dense, n_labels = len(schema.dense), len(schema.labels)
    dense = np.stack([block.column(f"d{j}").to_numpy() for j in range(n_dense)], 1)
    labels = np.stack([block.column(f"y{k}").to_numpy() for k in range(n_labels)], 1)
    ids, lengths = {}, {}
    for j, name in enumerate(schema.sparse):
        col = block.column(f"s{j}").combine_chunks()
        if is_list(col.type):
            lengths[name] = np.diff(col.offsets.to_numpy()).astype(np.int64)
            ids[name] = col.flatten().to_numpy().astype(np.uint32)
        else:
            ids[name], lengths[name] = col.to_numpy().astype(np.uint32), None
    meta = block.schema.metadata or {}
    trunc = json.loads(meta.get(b"truncated", b"{}"))
    split = block.column("__split").to_numpy()
    enc = Encoded(dense.astype(np.float32), labels.astype(np.int8), ids, lengths, trunc)
    return split, enc


# ---------------------------------------------------------------------------------------------
# Writing


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 npy header padded to ``HEADER_BYTES`` (the same length for any shape)."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(d).encode("latin1")
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f"npy header for {shape} longer than {HEADER_BYTES} bytes")
    body = text + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class NpyAppender:
    """An npy file written in pieces: rows are appended, the shape written on ``close``."""

    def __init__(self, path: str, dtype: str, width: int | None) -> None:
        self.path, self.dtype, self.width = path, np.dtype(dtype), width
        self.rows = 0
        self.f = open(path, "wb")  # noqa: SIM115 (closed in close)
        self.f.write(b"\0" * HEADER_BYTES)

    def append(self, array: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(array, dtype=self.dtype).tobytes())
        self.rows += len(array)

    def close(self) -> None:
        shape = (self.rows,) if self.width is None else (self.rows, self.width)
        self.f.seek(0)
        self.f.write(npy_header(self.dtype, shape))
        self.f.close()


def sparse_files(j: int, multi_hot: bool) -> dict[str, str]:
    if multi_hot:
        return {"values": f"sparse_{j}.values.npy", "offsets": f"sparse_{j}.offsets.npy"}
    return {"ids": f"sparse_{j}.ids.npy"}


class SplitWriter:
    """Appends encoded rows to one split's folder."""

    def __init__(self, folder: str, schema: DatasetSchema) -> None:
        os.makedirs(folder)
        self.schema = schema
        self.dense = NpyAppender(os.path.join(folder, "dense.npy"), "<f4", len(schema.dense))
        self.labels = NpyAppender(os.path.join(folder, "labels.npy"), "i1", len(schema.labels))
        self.sparse: dict[str, dict[str, NpyAppender]] = {}
        self.ends: dict[str, int] = {}
        for j, (name, spec) in enumerate(schema.sparse.items()):
            files = sparse_files(j, spec.multi_hot)
            dtypes = {"ids": "<u4", "values": "<u4", "offsets": "<i8"}
            self.sparse[name] = {
                k: NpyAppender(os.path.join(folder, f), dtypes[k], None) for k, f in files.items()
            }
            if spec.multi_hot:
                self.sparse[name]["offsets"].append(np.zeros(1, np.int64))
                self.ends[name] = 0

    def append(self, enc: Encoded) -> None:
        self.dense.append(enc.dense)
        assert enc.labels is not None
        self.labels.append(enc.labels)
        for name, files in self.sparse.items():
            lens = enc.lengths[name]
            if lens is None:
                files["ids"].append(enc.ids[name])
                continue
            files["values"].append(enc.ids[name])
            files["offsets"].append(self.ends[name] + np.cumsum(lens))
            self.ends[name] += int(lens.sum())

    def close(self) -> dict[str, Any]:
        for f in [self.dense, self.labels, *(a for d in self.sparse.values() for a in d.values())]:
            f.close()
        nnz = {n: self.ends.get(n, self.dense.rows) for n in self.schema.sparse}
        return {"rows": self.dense.rows, "ids": nnz}


# ---------------------------------------------------------------------------------------------
# The whole preparation


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


def _batches(ds: Any) -> Iterator[pa.Table]:
    """Blocks of a Ray dataset, in input order."""
    yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")


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
                a, b = (time_values(pa.array([v], tp))[0][0] for v in (stats.min, stats.max))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                return None
            lo, hi = min(lo, a), max(hi, b)
    return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else None


def time_cuts(ds: Any, schema: DatasetSchema, files: list[str]) -> tuple[float, float]:
    """``(val_from, test_from)`` from a histogram of the time column over all rows (its range
    from the Parquet statistics where every file has them, else from a pass of its own)."""
    assert schema.time is not None
    t = schema.time
    known = parquet_time_range(files, t) if schema.format == "parquet" else None
    if known is not None:
        lo, hi = known
    else:
        ranges = list(_batches(ds.select_columns([t]).map_batches(
            _time_range, fn_args=(t,), batch_format="pyarrow", batch_size=BATCH_ROWS)))  # fmt: skip
        lo = min(min(r.column("lo").to_pylist()) for r in ranges)
        hi = max(max(r.column("hi").to_pylist()) for r in ranges)
    if lo > hi:
        raise DataError(f"time column {t!r}: no row has a time")
    hist = np.zeros(HIST_BINS, np.int64)
    hists = ds.select_columns([t]).map_batches(
        _time_hist, fn_args=(t, lo, hi), batch_format="pyarrow", batch_size=BATCH_ROWS
    )
    for b in _batches(hists):
        for h in b.column("hist").to_pylist():
            hist += pickle.loads(h)
    return cuts_of(hist, lo, hi, schema)


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


def fit(ds: Any, schema: DatasetSchema, cuts: Any) -> tuple[BatchStats, dict[str, int]]:
    stats, skipped = BatchStats(), dict[str, int]()
    for b in _batches(ds.map_batches(_fit, fn_args=(schema, cuts), batch_format="pyarrow",
                                     batch_size=BATCH_ROWS)):  # fmt: skip
        for blob in b.column("stats").to_pylist():
            got = pickle.loads(blob)
            if isinstance(got, BadValue):
                raise got  # the first in input order: blocks arrive in order
            s, sk = got
            stats = stats.merge(s)
            for k, v in sk.items():
                skipped[k] = skipped.get(k, 0) + v
    return stats, skipped


def fitted_from(stats: BatchStats, schema: DatasetSchema, cuts: Any) -> Fitted:
    vocabs = {}
    for name, spec in schema.sparse.items():
        if spec.hash_buckets is None:
            values, counts = stats.counts.get(name, (np.zeros(0, np.uint64), np.zeros(0)))
            vocabs[name] = Vocabulary.build(values, counts, spec.min_count)
    dense_stats = {}
    for name in schema.dense:
        n, s, ss, lo, hi = stats.dense.get(name, np.array([0, 0, 0, 0, 0]))
        mean = s / n if n else 0.0
        std = float(np.sqrt(max(ss / n - mean * mean, 0.0))) if n else 1.0
        dense_stats[name] = {"mean": float(mean), "std": std if std > 1e-12 else 1.0,
                             "min": float(lo), "max": float(hi), "count": int(n)}  # fmt: skip
    return Fitted(schema, vocabs, dense_stats, cuts)


def write(ds: Any, fitted: Fitted, folder: str) -> dict[str, Any]:
    """Encode every row and append it to its split's files; per split rows and ids."""
    writers = [SplitWriter(os.path.join(folder, s), fitted.schema) for s in SPLIT_NAMES]
    truncated: dict[str, list[int]] = {}
    for block in _batches(ds.map_batches(_encode, fn_args=(fitted,), batch_format="pyarrow",
                                         batch_size=BATCH_ROWS)):  # fmt: skip
        split, enc = decode_block(block, fitted.schema)
        for k, (rows, ids) in enc.truncated.items():
            t = truncated.setdefault(k, [0, 0])
            t[0], t[1] = t[0] + rows, t[1] + ids
        for s, w in enumerate(writers):
            mask = split == s
            if mask.any():
                w.append(enc.take(mask))
    out = {name: w.close() for name, w in zip(SPLIT_NAMES, writers, strict=True)}
    out["truncated"] = {k: {"rows": v[0], "ids": v[1]} for k, v in truncated.items()}
    return out


def write_vocabs(folder: str, fitted: Fitted) -> dict[str, str]:
    os.makedirs(os.path.join(folder, "vocab"))
    files = {}
    for j, name in enumerate(fitted.schema.sparse):
        if name in fitted.vocabs:
            files[name] = f"vocab/sparse_{j}.npy"
            np.save(os.path.join(folder, files[name]), fitted.vocabs[name].hashes)
    return files


def write_examples(folder: str, files: list[str], schema: DatasetSchema) -> None:
    """A few raw input rows' features (``examples.parquet``): the served model's input example."""
    import pyarrow.parquet as pq

    batch = next(iter_file(files[0], schema, [*schema.dense, *schema.sparse]))
    pq.write_table(batch.slice(0, 5), os.path.join(folder, "examples.parquet"))


def id_types(types: dict[str, Any], schema: DatasetSchema) -> dict[str, str]:
    """Per sparse column, the type its ids are hashed as (serving casts raw values to it)."""
    out = {}
    for name in schema.sparse:
        tp = types.get(name)
        inner = tp.value_type if tp is not None and is_list(tp) else tp
        out[name] = "int" if inner is not None and pa.types.is_integer(inner) else "string"
    return out


def prepare(
    schema: DatasetSchema,
    inputs: list[str],
    out: str,
    *,
    workers: int | None = None,
    address: str | None = None,
    object_store_mb: int | None = None,
    overwrite: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out`` (see the module docstring); returns its ``meta.json``."""
    files = input_files(inputs, schema.format)
    types = inspect(files, schema)
    with partial_output(out, overwrite) as tmp:
        import ray

        from recsys.cluster import connect

        started = not ray.is_initialized()
        connect(address, num_cpus=workers, log_to_driver=False,
                object_store_memory=object_store_mb)  # fmt: skip
        try:
            meta = _prepare(schema, files, types, tmp, log)
        except BadValue as bad:
            raise locate(bad, schema) from None
        finally:
            if started:
                ray.shutdown()
    return meta


def _prepare(
    schema: DatasetSchema, files: list[str], types: Any, folder: str, log: Any
) -> dict[str, Any]:
    import logging

    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # our own line per phase instead
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "bars disabled"
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # blocks in input order: deterministic output
    ctx.enable_progress_bars = False
    ds = read(files, schema, schema.columns())
    t0 = time.perf_counter()
    cuts = time_cuts(ds, schema, files) if schema.time else None
    t_cuts = time.perf_counter()
    stats, skipped = fit(ds, schema, cuts)
    fitted = fitted_from(stats, schema, cuts)
    fitted.id_types = id_types(types, schema)
    cut_s = f"; time cut points {t_cuts - t0:.1f}s" if cuts else ""
    log(f"prepare: checked and fitted {int(stats.rows.sum()):,} rows "
        f"({time.perf_counter() - t0:.1f}s{cut_s})")  # fmt: skip
    vocab_files = write_vocabs(folder, fitted)
    written = write(ds, fitted, folder)
    write_examples(folder, files, schema)
    meta = {
        "format": FORMAT,
        "schema": schema.to_dict(),
        "sources": files,
        "rows": {s: written[s]["rows"] for s in SPLIT_NAMES},
        "ids": {s: written[s]["ids"] for s in SPLIT_NAMES},
        "skipped": skipped,
        "truncated": written["truncated"],
        "time_cuts": list(cuts) if cuts else None,
        "dense_stats": fitted.dense_stats,
        "feature_names": list(schema.sparse),
        "table_sizes": fitted.table_sizes(),
        "vocab": vocab_files,
        "id_types": fitted.id_types,
        "labels": list(schema.labels),
    }
    if meta["rows"]["train"] == 0:
        raise DataError(f"{files[0]}...: no training rows after the split")
    with open(os.path.join(folder, META), "w") as f:
        json.dump(meta, f, indent=2)
    log(f"prepare: wrote {sum(meta['rows'].values()):,} rows (train {meta['rows']['train']:,}, "
        f"val {meta['rows']['val']:,}, test {meta['rows']['test']:,}) in "
        f"{time.perf_counter() - t0:.1f}s")  # fmt: skip
    return meta


def main_schema(args: Any) -> None:
    """``recsys-preprocess --schema ...`` (called by ``recsys.data.preprocess.main``)."""
    from recsys.configlib import ConfigError

    try:
        schema = DatasetSchema.load(args.schema)
        prepare(
            schema, args.inputs, args.out, workers=args.workers or None, address=args.address,
            object_store_mb=args.object_store_mb, overwrite=args.overwrite,
            log=lambda s: print(s, file=sys.stderr),
        )  # fmt: skip
    except (DataError, ConfigError) as e:
        raise SystemExit(f"error: {e}") from None
