"""Readers of the raw Criteo Display Advertising format.

One row per line, tab-separated: ``label``, ``I`` integer features, ``F`` categorical features as
hex hashes (8 hex digits in Criteo's files); an empty field is missing. Kaggle ``train.txt``, its
100k-row ``dac_sample.txt`` and the Terabyte ``day_N`` files share it (``I = 13``, ``F = 26``);
files may be gzip-compressed (detected by content, not by name).

Transforms (as the DLRM reference): dense ``x`` -> ``log(1 + max(x, 0))`` with missing -> 0;
a categorical hash ``h`` -> the integer ``h`` (missing -> 0), mapped to a table row later by
``h mod rows``.

Malformed rows (wrong field count, a non-integer dense field, a bad hash, a label not 0/1) either
stop the read with an error naming file and line (``on_bad_row="error"``) or are skipped and
counted (``"skip"``). Columns never shift silently.

Parsing is vectorised over a block of lines (``parse_lines``, about 1M rows/s per process): fields
are found from the tab and newline positions and the digits are accumulated column-wise. A row the
fast path cannot take as it is (a wrong field count, a character outside ``[0-9-]`` in a dense
field or outside ``[0-9a-fA-F]`` in a hash, an over-long field) goes through ``parse_row``, the
per-row reference parser, which either reads it (``+5``, `` 7``) or names what is wrong, so the
results and the error messages are the reference parser's.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from recsys.data.columns import Columns, DataError

NUM_DENSE = 13
NUM_SPARSE = 26
log = logging.getLogger(__name__)


def transform_dense(raw: np.ndarray) -> np.ndarray:
    """``log(1 + max(x, 0))`` as float32; callers map missing to 0 first."""
    return np.log1p(np.maximum(raw, 0)).astype(np.float32)


def is_gzip(path: str) -> bool:
    """Whether ``path`` is gzip-compressed (by its magic bytes, not its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def open_text(path: str) -> IO[str]:
    """Open a plain or gzip text file; a missing file is a ``DataError``."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="ascii", errors="replace")
    return open(path, encoding="ascii", errors="replace")


class BadRow(ValueError):
    pass


INT64_MAX = 2**63 - 1


def parse_row(line: str, num_dense: int, num_sparse: int) -> tuple[int, list[int], list[int]]:
    """``label, dense, hashes`` (missing -> 0) of one line; ``BadRow`` says what is wrong."""
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 1 + num_dense + num_sparse:
        raise BadRow(
            f"expected {1 + num_dense + num_sparse} tab-separated fields, got {len(fields)}"
        )
    if fields[0] not in ("0", "1"):
        raise BadRow(f"label must be 0 or 1, got {fields[0]!r}")
    dense = []
    for k in range(1, 1 + num_dense):
        x = fields[k]
        try:
            value = int(x) if x else 0
        except ValueError:
            raise BadRow(f"integer feature I{k} is not an integer: {x!r}") from None
        if abs(value) > INT64_MAX:
            raise BadRow(f"integer feature I{k} is out of the 64-bit range: {x!r}")
        dense.append(value)
    sparse = []
    for k in range(1 + num_dense, len(fields)):
        x = fields[k]
        if len(x) > 8:
            raise BadRow(f"categorical feature C{k - num_dense} is not a 32-bit hex hash: {x!r}")
        try:
            value = int(x, 16) if x else 0
        except ValueError:
            raise BadRow(f"categorical feature C{k - num_dense} is not a hex hash: {x!r}") from None
        if value < 0:
            raise BadRow(f"categorical feature C{k - num_dense} is not a hex hash: {x!r}")
        sparse.append(value)
    return int(fields[0]), dense, sparse


@dataclass
class ReadStats:
    """What a read saw: rows kept, rows skipped, and the first few reasons."""

    rows: int = 0
    skipped: int = 0
    examples: list[str] = field(default_factory=list)

    def skip(self, where: str, reason: str) -> None:
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {reason}")

    def merge(self, other: ReadStats) -> None:
        self.rows += other.rows
        self.skipped += other.skipped
        self.examples = (self.examples + other.examples)[:5]


@dataclass(frozen=True)
class Parsed:
    """Rows parsed from a block of lines, in line order.

    Attributes:
        dense: ``[N, I]`` float32, transformed. sparse: ``[N, F]`` uint32 hashes.
        labels: ``[N, 1]`` int32. lines: how many lines the block had (kept + skipped).
    """

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    lines: int

    def __len__(self) -> int:
        return len(self.labels)

    def columns(self, source: str) -> Columns:
        n = len(self)
        return Columns(
            self.dense, self.sparse.reshape(n, -1, 1), self.labels.astype(np.float32), source
        )


_IS_HEX = np.zeros(256, dtype=bool)
_IS_HEX[[*range(48, 58), *range(97, 103), *range(65, 71)]] = True
_IS_DEC = np.zeros(256, dtype=bool)
_IS_DEC[48:58] = True
MAX_DIGITS = 8  # one 64-bit word; longer fields go through parse_row
PAD = 8  # bytes before and after the block, so every field's 8-byte window is inside
_U = np.uint64


def _words(a: np.ndarray, end: np.ndarray, width: np.ndarray, is_digit: np.ndarray) -> tuple:
    """Each field's last 8 bytes as a little-endian uint64 word, the bytes before the field set
    to ASCII '0' (so a short field reads as leading zeros). ``end``: one past each field's last
    byte. Returns the words and a mask of fields holding a byte ``is_digit`` rejects."""
    window = np.lib.stride_tricks.sliding_window_view(a, MAX_DIGITS)[end - MAX_DIGITS]  # [.., 8]
    live = np.arange(MAX_DIGITS) >= (MAX_DIGITS - width)[..., None]
    bad = (live & ~is_digit[window]).any(axis=-1)
    window = np.where(live, window, np.uint8(48))
    return np.ascontiguousarray(window).view(np.uint64)[..., 0], bad


def _decimal(words: np.ndarray) -> np.ndarray:
    """8 ASCII decimal digits per word (first digit in the lowest byte) -> their value (SWAR)."""
    x = words - _U(0x3030303030303030)
    x = (x * _U(10) + (x >> _U(8))) & _U(0x00FF00FF00FF00FF)
    x = (x * _U(100) + (x >> _U(16))) & _U(0x0000FFFF0000FFFF)
    x = (x * _U(10000) + (x >> _U(32))) & _U(0x00000000FFFFFFFF)
    return x.astype(np.int64)


def _hexadecimal(words: np.ndarray) -> np.ndarray:
    """8 ASCII hex digits per word (first digit in the lowest byte) -> their value (SWAR):
    each byte to its nibble (``(c & 15) + 9 * (c >> 6)`` for 0-9, a-f, A-F), then pairs, quads,
    the word."""
    x = (words & _U(0x0F0F0F0F0F0F0F0F)) + _U(9) * ((words >> _U(6)) & _U(0x0101010101010101))
    x = ((x & _U(0x00FF00FF00FF00FF)) << _U(4)) | ((x >> _U(8)) & _U(0x00FF00FF00FF00FF))
    x = ((x & _U(0x0000FFFF0000FFFF)) << _U(8)) | ((x >> _U(16)) & _U(0x0000FFFF0000FFFF))
    return (((x & _U(0xFFFFFFFF)) << _U(16)) | (x >> _U(32))).astype(np.int64)


def _fast_rows(
    a: np.ndarray, starts: np.ndarray, ends: np.ndarray, tabs: np.ndarray, nd: int, ns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse every line with exactly ``nd + ns`` tabs; returns ``ok`` (per line) and, for the ok
    lines in order, raw dense int64 ``[n, nd]``, hashes ``[n, ns]`` and labels ``[n]``."""
    nf = 1 + nd + ns
    first_tab = np.searchsorted(tabs, starts)
    count = np.searchsorted(tabs, ends) - first_tab
    cand = np.flatnonzero(count == nf - 1)
    t = tabs[first_tab[cand][:, None] + np.arange(nf - 1)]  # [n, nf - 1]
    fs = np.concatenate([starts[cand][:, None], t + 1], axis=1)  # field starts
    width = np.concatenate([t, ends[cand][:, None]], axis=1) - fs
    label_ok = (width[:, 0] == 1) & ((a[fs[:, 0]] == 48) | (a[fs[:, 0]] == 49))
    ds, dw = fs[:, 1 : 1 + nd], width[:, 1 : 1 + nd]
    neg = (dw > 1) & (a[ds] == 45)
    digits = np.minimum(dw - neg, MAX_DIGITS)
    words, dense_bad = _words(a, ds + dw, digits, _IS_DEC)
    dense = _decimal(words)
    hs, hw = fs[:, 1 + nd :], width[:, 1 + nd :]
    words, hash_bad = _words(a, hs + hw, np.minimum(hw, MAX_DIGITS), _IS_HEX)
    hashes = _hexadecimal(words)
    ok = (
        label_ok
        & ~dense_bad.any(1)
        & ~hash_bad.any(1)
        & ((dw - neg) <= MAX_DIGITS).all(1)
        & (hw <= MAX_DIGITS).all(1)
    )
    lines_ok = np.zeros(len(starts), dtype=bool)
    lines_ok[cand[ok]] = True
    labels = (a[fs[ok, 0]] - 48).astype(np.int32)
    return lines_ok, np.where(neg, -dense, dense)[ok], hashes[ok], labels


def parse_lines(
    buf: bytes,
    *,
    path: str,
    first_line: int,
    on_bad_row: str,
    stats: ReadStats,
    num_dense: int = NUM_DENSE,
    num_sparse: int = NUM_SPARSE,
) -> Parsed:
    """Parse whole lines ``buf`` (its first line is line ``first_line`` of ``path``, 1-based)."""
    if not buf:
        empty = np.zeros((0, num_dense), np.int64)
        return Parsed(transform_dense(empty), np.zeros((0, num_sparse), np.uint32),
                      np.zeros((0, 1), np.int32), 0)  # fmt: skip
    if not buf.endswith(b"\n"):
        buf += b"\n"
    a = np.frombuffer(bytes(PAD) + buf + bytes(PAD), dtype=np.uint8)
    nl = np.flatnonzero(a == 10)
    starts = np.concatenate([[PAD], nl[:-1] + 1]).astype(np.int64)
    ends = nl - ((nl > starts) & (a[nl - 1] == 13))  # one CR before LF: CRLF
    tabs = np.flatnonzero(a == 9)
    ok, dense, hashes, labels = _fast_rows(a, starts, ends, tabs, num_dense, num_sparse)
    slow = np.flatnonzero(~ok)
    if len(slow):
        dense, hashes, labels = _merge_slow(
            buf, starts, nl, ok, slow, (dense, hashes, labels), path, first_line, on_bad_row,
            stats, num_dense, num_sparse,
        )  # fmt: skip
    stats.rows += len(labels)
    return Parsed(
        dense=transform_dense(dense.reshape(-1, num_dense)),
        sparse=hashes.astype(np.uint32).reshape(-1, num_sparse),
        labels=labels.reshape(-1, 1),
        lines=len(starts),
    )


def _merge_slow(
    buf: bytes,
    starts: np.ndarray,
    nl: np.ndarray,
    ok: np.ndarray,
    slow: np.ndarray,
    fast: tuple[np.ndarray, np.ndarray, np.ndarray],
    path: str,
    first_line: int,
    on_bad_row: str,
    stats: ReadStats,
    num_dense: int,
    num_sparse: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the lines the fast path refused through ``parse_row`` (the first bad one raises, or
    bad ones are skipped and counted) and merge them with the fast rows, in line order."""
    kept_lines, rows = [], []
    for i in slow:
        line = buf[starts[i] - PAD : nl[i] + 1 - PAD].decode("ascii", errors="replace")
        try:
            rows.append(parse_row(line, num_dense, num_sparse))
            kept_lines.append(i)
        except BadRow as e:
            where = f"{path}:{first_line + int(i)}"
            if on_bad_row == "error":
                raise DataError(f"{where}: {e}") from None
            stats.skip(where, str(e))
    order = np.concatenate([np.flatnonzero(ok), np.asarray(kept_lines, dtype=np.int64)])
    perm = np.argsort(order, kind="stable")
    dense = np.concatenate(
        [fast[0], np.asarray([r[1] for r in rows], np.int64).reshape(-1, num_dense)]
    )
    hashes = np.concatenate(
        [fast[1], np.asarray([r[2] for r in rows], np.int64).reshape(-1, num_sparse)]
    )
    labels = np.concatenate([fast[2], np.asarray([r[0] for r in rows], np.int32)])
    return dense[perm], hashes[perm], labels[perm]


# 4 MiB: the parser's per-block temporaries (about 20x the block) stay small; on the dev box
# 4 MiB blocks parse ~1.4x faster than 16 MiB ones (BENCHMARKS.md, preprocess).
BLOCK_BYTES = 1 << 22


def iter_blocks(
    path: str, start: int = 0, stop: int | None = None, block_bytes: int = BLOCK_BYTES
) -> Iterator[bytes]:
    """Whole lines of ``path`` in blocks of about ``block_bytes``: bytes ``[start, stop)`` of a
    plain file (both on line starts), or all of a gzip file, decompressed once, in one pass."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    compressed = is_gzip(path)
    if compressed and (start != 0 or stop is not None):
        raise ValueError(f"{path}: a gzip file is read whole, in one pass")
    remaining = None if stop is None else stop - start
    with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
        f.seek(start)
        carry = b""
        while True:
            size = block_bytes if remaining is None else min(block_bytes, remaining)
            data = f.read(size) if size > 0 else b""
            if remaining is not None:
                remaining -= len(data)
            if not data:
                if carry:
                    yield carry
                return
            data = carry + data
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                yield data[:cut]


def iter_parsed(
    path: str,
    *,
    on_bad_row: str = "error",
    stats: ReadStats | None = None,
    start: int = 0,
    stop: int | None = None,
    first_line: int = 1,
    num_dense: int = NUM_DENSE,
    num_sparse: int = NUM_SPARSE,
) -> Iterator[Parsed]:
    """Parsed blocks of ``path`` (or of its bytes ``[start, stop)``, whose first line is line
    ``first_line``)."""
    stats = stats if stats is not None else ReadStats()
    line = first_line
    for buf in iter_blocks(path, start, stop):
        parsed = parse_lines(
            buf, path=path, first_line=line, on_bad_row=on_bad_row, stats=stats,
            num_dense=num_dense, num_sparse=num_sparse,
        )  # fmt: skip
        line += parsed.lines
        yield parsed


def read_tsv(
    path: str,
    *,
    on_bad_row: str = "error",
    num_dense: int = NUM_DENSE,
    num_sparse: int = NUM_SPARSE,
) -> Columns:
    """Read a whole Criteo TSV (plain or gzip) into memory (small files: tests, samples; the
    training path converts files to the memory-mapped binary form instead). Empty files are a
    ``DataError``."""
    stats = ReadStats()
    blocks = list(
        iter_parsed(
            path, on_bad_row=on_bad_row, stats=stats, num_dense=num_dense, num_sparse=num_sparse
        )
    )
    if stats.skipped:
        log.warning(
            "%s: skipped %d malformed rows, e.g. %s", path, stats.skipped, "; ".join(stats.examples)
        )
    if not stats.rows:
        raise DataError(f"{path}: no valid rows (skipped {stats.skipped})")
    return Parsed(
        np.concatenate([b.dense for b in blocks]),
        np.concatenate([b.sparse for b in blocks]),
        np.concatenate([b.labels for b in blocks]),
        sum(b.lines for b in blocks),
    ).columns(path)


def write_tsv(
    path: str,
    labels: np.ndarray,
    dense_raw: np.ndarray,
    sparse_ids: np.ndarray,
    *,
    compress: bool = False,
) -> None:
    """Write rows in the Criteo format.

    Args:
        labels: ``[N]`` in {0, 1}.
        dense_raw: ``[N, I]`` float, NaN where missing (written as an empty field).
        sparse_ids: ``[N, F]`` ints in ``[0, 2**32)`` written as 8 hex digits; negative = missing.
    """
    opener = gzip.open if compress else open
    with opener(path, "wt", encoding="ascii") as f:  # type: ignore[operator]
        for y, d, s in zip(labels, dense_raw, sparse_ids, strict=True):
            dense = ["" if np.isnan(x) else str(int(x)) for x in d]
            cats = ["" if x < 0 else f"{int(x):08x}" for x in s]
            f.write("\t".join([str(int(y)), *dense, *cats]) + "\n")
