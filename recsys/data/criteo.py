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
            dense.append(int(x) if x else 0)
        except ValueError:
            raise BadRow(f"integer feature I{k} is not an integer: {x!r}") from None
    sparse = []
    for k in range(1 + num_dense, len(fields)):
        x = fields[k]
        if len(x) > 8:
            raise BadRow(f"categorical feature C{k - num_dense} is not a 32-bit hex hash: {x!r}")
        try:
            sparse.append(int(x, 16) if x else 0)
        except ValueError:
            raise BadRow(f"categorical feature C{k - num_dense} is not a hex hash: {x!r}") from None
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


def iter_chunks(
    path: str,
    *,
    chunk_rows: int = 100_000,
    on_bad_row: str = "error",
    num_dense: int = NUM_DENSE,
    num_sparse: int = NUM_SPARSE,
    stats: ReadStats | None = None,
) -> Iterator[Columns]:
    """Parse ``path`` into ``Columns`` chunks of up to ``chunk_rows`` rows (sparse ``H = 1``)."""
    stats = stats if stats is not None else ReadStats()
    labels: list[int] = []
    dense: list[list[int]] = []
    sparse: list[list[int]] = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            try:
                label, d, s = parse_row(line, num_dense, num_sparse)
            except BadRow as e:
                if on_bad_row == "error":
                    raise DataError(f"{path}:{lineno}: {e}") from None
                stats.skip(f"{path}:{lineno}", str(e))
                continue
            labels.append(label)
            dense.append(d)
            sparse.append(s)
            if len(labels) == chunk_rows:
                yield _to_columns(labels, dense, sparse, path, num_dense, num_sparse)
                stats.rows += len(labels)
                labels, dense, sparse = [], [], []
    if labels:
        stats.rows += len(labels)
        yield _to_columns(labels, dense, sparse, path, num_dense, num_sparse)


def _to_columns(
    labels: list[int],
    dense: list[list[int]],
    sparse: list[list[int]],
    path: str,
    num_dense: int,
    num_sparse: int,
) -> Columns:
    n = len(labels)
    return Columns(
        dense=transform_dense(np.asarray(dense, dtype=np.int64).reshape(n, num_dense)),
        sparse=np.asarray(sparse, dtype=np.uint32).reshape(n, num_sparse, 1),
        labels=np.asarray(labels, dtype=np.float32).reshape(n, 1),
        source=path,
    )


def read_tsv(
    path: str,
    *,
    on_bad_row: str = "error",
    num_dense: int = NUM_DENSE,
    num_sparse: int = NUM_SPARSE,
) -> Columns:
    """Read a whole Criteo TSV (plain or gzip) into memory. Empty files are a ``DataError``."""
    stats = ReadStats()
    chunks = list(
        iter_chunks(
            path,
            on_bad_row=on_bad_row,
            num_dense=num_dense,
            num_sparse=num_sparse,
            stats=stats,
        )
    )
    if stats.skipped:
        log.warning(
            "%s: skipped %d malformed rows, e.g. %s", path, stats.skipped, "; ".join(stats.examples)
        )
    if not chunks:
        raise DataError(f"{path}: no valid rows (skipped {stats.skipped})")
    return Columns(
        dense=np.concatenate([c.dense for c in chunks]),
        sparse=np.concatenate([c.sparse for c in chunks]),
        labels=np.concatenate([c.labels for c in chunks]),
        source=path,
    )


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
