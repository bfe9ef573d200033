"""A preparation's input: the files, their columns, and the pieces the work is cut into.

A **piece** is a part of one input file that one task reads on its own, in order:

- Parquet: a run of consecutive row groups (about ``chunk_bytes`` of uncompressed data);
- plain delimited text: a byte range starting and ending at line starts (about ``chunk_bytes``);
- gzip-compressed text: the whole file, decompressed as it streams (a gzip stream cannot be
  entered in the middle: to spread one large file over cores, decompress it first).

Pieces depend only on the files and ``chunk_bytes``, never on how many workers run them, so the
prepared output is the same whatever the worker count. ``read_piece`` yields a piece's rows as
pyarrow tables of the schema's columns (text columns as text: ``recsys.prepare.values`` reads
and ``recsys.prepare.checks`` checks them, so a bad value is named the same way in every format),
each with the input row number of every row within its file (a text file's row ``r`` is on
line ``r + 1``, plus one with a header line).
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.configlib import nearest
from recsys.data.errors import DataError
from recsys.data.schema import DatasetSchema
from recsys.prepare.checks import column_problem
from recsys.prepare.splits import TEST, TRAIN, VAL
from recsys.prepare.values import is_list, is_text

BATCH_ROWS = 1 << 16
COUNT_BYTES = 1 << 22


@dataclass(frozen=True)
class Piece:
    """Part of input file ``path`` (``file`` its place among the inputs): row groups
    ``[start, stop)`` of a Parquet file, bytes ``[start, stop)`` of a plain text file, or the whole
    of a gzip file (``stop`` None). ``first_row``: the row number (within the file) of its first
    row, where known before reading (Parquet; text once lines are counted). ``offset``: the rows
    of the files before its own (``split.by: order`` numbers rows over all files)."""

    index: int
    file: int
    path: str
    start: int
    stop: int | None
    first_row: int | None = None
    rows: int | None = None
    offset: int = 0

    @property
    def name(self) -> str:
        return f"part-{self.index:05d}"


def is_gzip(path: str) -> bool:
    """Whether ``path`` is gzip-compressed (by its first bytes, not its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def natural(path: str) -> list[Any]:
    """A sort key that orders numbers in names by value: ``day_2`` before ``day_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]


def input_files(inputs: list[str], fmt: str) -> list[str]:
    """The files to read: files as given, folders expanded to their files (``*.parquet``; for
    text every file not starting with ``.`` or ``_``), in name order, numbers by value
    (``day_2`` before ``day_10``: the order ``split.by: order`` and time-ordered data need)."""
    files: list[str] = []
    for path in inputs:
        if os.path.isdir(path):
            pattern = "*.parquet" if fmt == "parquet" else "*"
            found = sorted(
                (f for f in glob.glob(os.path.join(path, pattern))
                 if os.path.isfile(f) and not os.path.basename(f).startswith((".", "_"))),
                key=natural,
            )  # fmt: skip
            if not found:
                raise DataError(f"{path}: a folder with no {pattern} files")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return [os.path.abspath(f) for f in files]


# ---------------------------------------------------------------------------------------------
# Columns and their types, checked before any work starts


def text_header(path: str, schema: DatasetSchema) -> tuple[list[str], int]:
    """``(column names, bytes of the header line)`` of a text file (no header: the schema's
    names and 0)."""
    opts = schema.csv
    if not opts.header:
        return list(opts.columns), 0
    import csv

    opener: Callable[..., Any] = gzip.open if is_gzip(path) else open
    with opener(path, "rb") as f:
        first = f.readline()
    if not first.strip():
        raise DataError(f"{path}: empty file (a header line is needed)")
    text = first.decode("utf-8-sig", errors="replace")
    names = next(csv.reader([text], delimiter=opts.delimiter))
    return [n.strip() for n in names], len(first)


def file_types(path: str, schema: DatasetSchema) -> dict[str, pa.DataType | None]:
    """A file's columns and their types (text: the header's names, types unknown: None)."""
    if schema.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return {f.name: f.type for f in pq.read_schema(path)}
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    return dict.fromkeys(text_header(path, schema)[0])


def _kind(tp: pa.DataType) -> str:
    """A type's family, for comparing files (int32 and int64 agree; int and string do not)."""
    if pa.types.is_dictionary(tp):
        return _kind(tp.value_type)
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


@dataclass
class Inspection:
    """What the files say before anything runs: each column's type (of the first file that
    gives it one) and the columns that are Arrow's ``null`` type (no value at all) per file."""

    types: dict[str, pa.DataType | None]
    all_null: dict[str, list[str]]

    def warnings(self) -> list[str]:
        return [
            f"column {name!r} holds no value in {len(files)} file(s) (e.g. {files[0]}): it is "
            "missing in those rows; a column missing everywhere carries no information"
            for name, files in self.all_null.items()
        ]


def _near(name: str, types: dict[str, Any], schema: DatasetSchema) -> str:
    """The file's column a missing one was likely meant as: the same name in another case,
    else the nearest name that no other schema column takes (``C1`` is not ``C11``)."""
    taken = set(schema.columns())
    free = [c for c in types if c not in taken]
    same = [c for c in free if c.lower() == name.lower()]
    return f" (did you mean {same[0]!r}?)" if same else nearest(name, free)


def inspect(files: list[str], schema: DatasetSchema) -> Inspection:
    """Check that every file has every schema column, and (Parquet) that the files agree on
    their types, before anything runs."""
    first: dict[str, tuple[str, pa.DataType | None]] = {}
    all_null: dict[str, list[str]] = {}
    for path in files:
        types = file_types(path, schema)
        if schema.group_by and schema.group_by not in types:
            raise DataError(f"{path}: column {schema.group_by!r} (group_by in the schema) is "
                            f"missing{_near(schema.group_by, types, schema)}; the file has "
                            f"{sorted(types)[:12]}")  # fmt: skip
        for role, names in schema.roles().items():
            for name in names:
                if name not in types:
                    raise DataError(
                        f"{path}: column {name!r} ({role} in the schema) is missing"
                        f"{_near(name, types, schema)}; the file has {sorted(types)[:12]}"
                    )
                tp = types[name]
                if tp is not None and pa.types.is_null(tp):
                    all_null.setdefault(name, []).append(path)
                    continue  # agrees with any type
                if name not in first or first[name][1] is None:
                    first[name] = (path, tp)
                elif tp is not None and _kind(tp) != _kind(first[name][1]):  # type: ignore[arg-type]
                    other, otp = first[name]
                    raise DataError(
                        f"files disagree on column {name!r}: {other} has {otp}, {path} has {tp}"
                    )
    for name, (path, tp) in first.items():
        if tp is None or name in schema.labels or name == schema.time:
            continue  # text, or checked per value
        bad, why = column_problem(name, pa.nulls(1, tp), schema)
        if bad.any():
            raise DataError(f"{path}: column {name!r} has type {tp}: {why}")
    for name in schema.labels:
        if name in all_null:
            raise DataError(f"{all_null[name][0]}: label column {name!r} holds no value")
    types = {name: tp for name, (_, tp) in first.items()}
    if schema.group_by and schema.group_by not in types:  # (not a role: its type read here)
        types[schema.group_by] = file_types(files[0], schema).get(schema.group_by)
    types.update({n: pa.null() for n in all_null if n not in types})
    return Inspection(types, all_null)


# ---------------------------------------------------------------------------------------------
# Pieces


def plan_pieces(files: list[str], schema: DatasetSchema, chunk_bytes: int) -> list[Piece]:
    """Every file cut into pieces, in input order."""
    pieces: list[Piece] = []
    parts: list[tuple[int, int | None, int | None, int | None]]
    for k, path in enumerate(files):
        if schema.format == "parquet":
            parts = _parquet_parts(path, chunk_bytes)
        elif is_gzip(path):
            parts = [(0, None, None, None)]
        else:
            parts = [(a, b, None, None) for a, b in _byte_ranges(path, schema, chunk_bytes)]
        for start, stop, first_row, rows in parts:
            pieces.append(Piece(len(pieces), k, path, start, stop, first_row, rows))
    return pieces


def _parquet_parts(
    path: str, chunk_bytes: int
) -> list[tuple[int, int | None, int | None, int | None]]:
    """``(first group, stop group, first row, rows)`` runs of row groups of about
    ``chunk_bytes`` each."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    parts: list[tuple[int, int | None, int | None, int | None]] = []
    start, row, size, rows = 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        size += meta.row_group(g).total_byte_size
        rows += meta.row_group(g).num_rows
        if size >= chunk_bytes or g == meta.num_row_groups - 1:
            parts.append((start, g + 1, row, rows))
            start, row, size, rows = g + 1, row + rows, 0, 0
    return parts or [(0, 0, 0, 0)]


def _byte_ranges(path: str, schema: DatasetSchema, chunk_bytes: int) -> list[tuple[int, int]]:
    """Line-aligned byte ranges of a plain text file after its header line."""
    _, start = text_header(path, schema)
    size = os.path.getsize(path)
    bounds = [start]
    with open(path, "rb") as f:
        while bounds[-1] + chunk_bytes < size:
            f.seek(bounds[-1] + chunk_bytes)
            f.readline()  # to the start of the next line
            if f.tell() >= size:
                break
            bounds.append(f.tell())
    return list(zip(bounds, [*bounds[1:], size], strict=True))


def count_rows(piece: Piece, schema: DatasetSchema) -> int:
    """The input rows of a piece (Parquet: from the metadata; text: its lines, a last line
    without a line break included)."""
    if piece.rows is not None:
        return piece.rows
    _, header = text_header(piece.path, schema)
    if piece.stop is None:  # gzip: decompressed once
        n, last = 0, 10
        with gzip.open(piece.path, "rb") as f:
            f.read(header)
            while block := f.read(COUNT_BYTES):
                n, last = n + block.count(b"\n"), block[-1]
        return n + (last != 10)
    return _count_lines(piece.path, piece.start, piece.stop)


def _count_lines(path: str, start: int, stop: int) -> int:
    buf = bytearray(COUNT_BYTES)
    n, last, left = 0, 10, stop - start
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while left > 0:
            k = f.readinto(memoryview(buf)[: min(COUNT_BYTES, left)])
            if not k:
                break
            n, last, left = n + buf.count(b"\n", 0, k), buf[k - 1], left - k
    return n + (last != 10)


def with_rows(pieces: list[Piece], counts: list[int | None]) -> list[Piece]:
    """The pieces with their row counts and first rows (within their files) filled in; a count
    of None (a gzip file not counted: one piece, its rows numbered from 0) stays unknown."""
    out, row, file = [], 0, -1
    for p, n in zip(pieces, counts, strict=True):
        row = 0 if p.file != file else row
        file = p.file
        out.append(Piece(p.index, p.file, p.path, p.start, p.stop, row, n))
        row += n or 0
    return out


def file_splits(files: list[str], schema: DatasetSchema) -> dict[str, int]:
    """``split.by: files``: each file's split by its name; a pattern matching no file, or a
    file matched as both test and validation, is refused."""
    sp = schema.split
    out = {}
    for path in files:
        name = os.path.basename(path)
        test = any(fnmatch.fnmatch(name, p) for p in sp.test_files)
        val = any(fnmatch.fnmatch(name, p) for p in sp.val_files)
        if test and val:
            raise DataError(f"{path}: matches both split.test_files and split.val_files")
        out[path] = TEST if test else VAL if val else TRAIN
    for key, patterns in (("test_files", sp.test_files), ("val_files", sp.val_files)):
        for p in patterns:
            if not any(fnmatch.fnmatch(os.path.basename(f), p) for f in files):
                raise DataError(f"split.{key}: {p!r} matches none of the {len(files)} input files")
    return out


# ---------------------------------------------------------------------------------------------
# Reading a piece


@dataclass
class Rows:
    """A batch of a piece: the schema's columns, and each row's row number within its file."""

    table: pa.Table
    rows: np.ndarray  # int64 [n]


class BadLine(ValueError):
    """A text line the parser could not split into the schema's columns."""

    def __init__(self, row: int, why: str) -> None:
        super().__init__(row, why)
        self.row, self.why = row, why


def read_piece(
    piece: Piece, schema: DatasetSchema, columns: list[str], skipped: list[int] | None = None
) -> Iterator[Rows]:
    """A piece's rows in order, in batches. A text line with the wrong number of fields raises
    ``BadLine`` (its row within the file), or, given a ``skipped`` list, is dropped and its row
    number (within the file) appended there."""
    if schema.format == "parquet":
        yield from _parquet_rows(piece, columns)
    else:
        yield from _text_rows(piece, schema, columns, skipped)


def _parquet_rows(piece: Piece, columns: list[str]) -> Iterator[Rows]:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(piece.path)
    row = piece.first_row or 0
    groups = list(range(piece.start, piece.stop or 0))
    if not groups:
        return
    for batch in f.iter_batches(BATCH_ROWS, row_groups=groups, columns=columns):
        n = batch.num_rows
        yield Rows(pa.Table.from_batches([batch]), np.arange(row, row + n, dtype=np.int64))
        row += n


def _text_rows(
    piece: Piece, schema: DatasetSchema, columns: list[str], skipped: list[int] | None
) -> Iterator[Rows]:
    import pyarrow.csv as pacsv

    names, header = text_header(piece.path, schema)
    first = piece.first_row or 0
    dropped: list[int] = []  # rows within the piece

    def on_invalid(row: Any) -> str:
        if skipped is None:
            return "error"  # pyarrow raises, naming the row: see below
        dropped.append(int(row.number) - 1)
        skipped.append(first + int(row.number) - 1)
        return "skip"

    read = pacsv.ReadOptions(column_names=names, use_threads=False, block_size=1 << 22)
    parse = pacsv.ParseOptions(
        delimiter=schema.csv.delimiter, ignore_empty_lines=False, invalid_row_handler=on_invalid
    )
    convert = pacsv.ConvertOptions(
        column_types=dict.fromkeys(columns, pa.string()), include_columns=columns,
        strings_can_be_null=False, quoted_strings_can_be_null=False,
    )  # fmt: skip
    stream = _open_text(piece, header)
    kept = 0
    try:
        reader = pacsv.open_csv(stream, read, parse, convert)
        for batch in reader:
            n = batch.num_rows
            local = _input_rows(np.arange(kept, kept + n), np.asarray(dropped, np.int64))
            kept += n
            yield Rows(pa.Table.from_batches([batch]), first + local)
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return  # no rows
        raise BadLine(first + _row_of(str(e)), _why(str(e))) from None
    finally:
        stream.close()


def _row_of(message: str) -> int:
    """The 0-based row of pyarrow's ``Row #N: ...`` parse error (within the stream)."""
    m = re.search(r"Row #(\d+)", message)
    return int(m.group(1)) - 1 if m else 0


def _why(message: str) -> str:
    """pyarrow's parse error in our words (``expected 40 fields, got 39``)."""
    m = re.search(r"Expected (\d+) columns, got (\d+)", message)
    if m:
        return f"expected {m.group(1)} fields, got {m.group(2)}"
    return message.removeprefix("CSV parse error: ")


def _input_rows(kept: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """The input rows (0-based, within the piece) of kept rows ``kept`` when the rows
    ``skipped`` (sorted) were dropped."""
    if len(skipped) == 0:
        return kept
    shifted = skipped - np.arange(len(skipped))
    return kept + np.searchsorted(shifted, kept, side="right")


def _open_text(piece: Piece, header: int) -> Any:
    """The piece's bytes as a pyarrow input stream (a gzip file decompressed as it streams)."""
    if piece.stop is None:
        stream = pa.input_stream(piece.path, compression="gzip")
        stream.read(header)
        return stream
    mapped = pa.memory_map(piece.path)
    mapped.seek(piece.start)
    buf = mapped.read_buffer(piece.stop - piece.start)
    return pa.BufferReader(buf)


def line_of(schema: DatasetSchema, row: int) -> int:
    """The line number (1-based) of row ``row`` (within the file) of a text file."""
    return row + 1 + int(schema.csv.header)
