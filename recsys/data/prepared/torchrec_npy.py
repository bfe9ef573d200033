"""A folder of TorchRec's own preprocessed Criteo (``torchrec.datasets.criteo``'s
``tsv_to_npys``): ``day_{k}_{dense,sparse,labels}.npy`` triples, read as they are
(``data.source: torchrec``). One reader of that layout, nothing more: every other data set,
Criteo's text included, goes through ``recsys-preprocess`` and a prepared folder.

- ``day_{k}_dense.npy``: ``[N, 13]`` float32, stored as ``log(x - m + 2)``;
- ``day_{k}_sparse.npy``: ``[N, 26]`` integer hashes or contiguous ids (taken ``mod`` the table
  rows when batches are made);
- ``day_{k}_labels.npy``: ``[N, 1]`` int32 in {0, 1}.

Files are memory-mapped (``NpyDay``): a worker touches only the rows it reads, and labels are
checked on the rows read. ``m`` is the smallest raw dense value of that day's file, so it
differs from day to day and is not stored: it is read off each day's first rows
(``infer_torchrec_min``) or declared with ``data.torchrec_dense_min``, and rows are converted to
``log(1 + max(x, 0))`` (the ``log1p`` transform of ``schemas/criteo_kaggle.yaml``) as they are
read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from recsys.data.columns import Columns, DataError, RowSource
from recsys.data.dense import log1p_counts
from recsys.data.prepared.meta import is_prepared, read_meta

PARTS = ("dense", "sparse", "labels")
_TRIPLE = re.compile(r"^day_(\d+)_(dense|sparse|labels)\.npy$")
INFER_ROWS = 1 << 20  # rows TorchRec's per-day minimum is read off


def day_paths(folder: str, k: int) -> dict[str, str]:
    return {p: os.path.join(folder, f"day_{k}_{p}.npy") for p in PARTS}


@dataclass(frozen=True)
class DenseTransform:
    """How a day's dense values were stored: TorchRec's ``log(x - min + 2)``."""

    min: int = 0

    def to_log1p(self, stored: np.ndarray) -> np.ndarray:
        """Stored dense values -> ``log(1 + max(x, 0))`` float32 (raw values are integers)."""
        raw = np.rint(np.exp(np.asarray(stored, dtype=np.float64)) + self.min - 2)
        return log1p_counts(raw).astype(np.float32)


def infer_torchrec_min(dense: np.ndarray, path: str) -> int:
    """The ``m`` of a TorchRec day (``stored = log(x - m + 2)``), from its first rows.

    The assumption (Criteo's): raw 0, which is also what missing values become, is the smallest
    value of most dense columns (Criteo: every column but ``I2``, the one with negative values), so
    the value most column minima share is ``log(2 - m)``. Refused, asking for a declaration, unless
    a majority of the columns share their minimum and it gives an integer ``m <= 0``."""
    sample = np.asarray(dense[:INFER_ROWS], dtype=np.float64)
    if len(sample) == 0:
        raise DataError(f"{path}: empty")
    minima = np.round(sample.min(axis=0), 4)
    values, counts = np.unique(minima, return_counts=True)
    zero, agree = float(values[counts.argmax()]), int(counts.max())
    m = 2 - np.exp(zero)
    shared = agree * 2 > len(minima)
    if not shared or abs(m - round(m)) > 1e-2 or round(m) > 0 or sample.min() < np.log(2) - 1e-4:
        raise DataError(
            f"{path}: no meta.json and the dense values do not look like TorchRec's "
            f"log(x - min + 2) with raw 0 the smallest value of most columns ({agree} of "
            f"{len(minima)} share a minimum, giving min = {m:.4f}); set data.torchrec_dense_min "
            "to the smallest raw dense value of the file, or prepare the raw files with "
            "recsys-preprocess --schema criteo_kaggle"
        )
    return round(m)


class NpyDay(RowSource):
    """One memory-mapped day; ``read``/``take`` return converted, label-checked rows."""

    def __init__(self, folder: str, k: int, transform: DenseTransform | None) -> None:
        paths = day_paths(folder, k)
        try:
            self.dense, self.sparse, self.labels = (np.load(paths[p], mmap_mode="r") for p in PARTS)
        except (ValueError, OSError) as e:
            raise DataError(f"{folder}: day_{k} is not a readable npy triple: {e}") from None
        self.source = paths["dense"]
        self.labels_path = paths["labels"]
        self._check_shapes(paths)
        self.transform = transform or DenseTransform(infer_torchrec_min(self.dense, self.source))

    def _check_shapes(self, paths: dict[str, str]) -> None:
        d, s, lab = self.dense, self.sparse, self.labels
        if d.ndim != 2 or s.ndim != 2 or lab.ndim not in (1, 2):
            raise DataError(f"{paths['dense']}: expected 2-d arrays, got {d.shape}, {s.shape}")
        if not len(d) == len(s) == len(lab):
            raise DataError(
                f"{paths['dense']}: row counts differ: dense {len(d)}, sparse {len(s)}, "
                f"labels {len(lab)}"
            )
        if len(d) == 0:
            raise DataError(f"{paths['dense']}: empty")

    def __len__(self) -> int:
        return len(self.dense)

    def _columns(self, rows: slice | np.ndarray, first: int | np.ndarray) -> Columns:
        labels = np.asarray(self.labels[rows]).reshape(-1, 1)
        bad = np.flatnonzero((labels != 0) & (labels != 1))
        if len(bad):
            row = first + bad[0] if isinstance(first, int) else int(first[bad[0]])
            raise DataError(
                f"{self.labels_path}: row {row}: label must be 0 or 1, got {labels[bad[0], 0]}"
            )
        sparse = np.asarray(self.sparse[rows])
        return Columns(
            self.transform.to_log1p(self.dense[rows]),
            sparse.reshape(len(sparse), -1, 1),
            labels,
            self.source,
        )

    def read(self, start: int, stop: int) -> Columns:
        return self._columns(slice(start, stop), start)

    def take(self, idx: np.ndarray) -> Columns:
        idx = np.asarray(idx, dtype=np.int64)
        return self._columns(idx, idx)


def days(folder: str) -> list[int]:
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such folder (expected day_N_{{dense,sparse,labels}}.npy)")
    found: dict[int, set[str]] = {}
    for name in os.listdir(folder):
        m = _TRIPLE.match(name)
        if m:
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    if not found:
        raise DataError(f"{folder}: no day_N_{{dense,sparse,labels}}.npy files")
    for k, parts in sorted(found.items()):
        missing = set(PARTS) - parts
        if missing:
            raise DataError(f"{folder}: day_{k}_{sorted(missing)[0]}.npy is missing")
    return sorted(found)


def load_folder(folder: str, torchrec_dense_min: int | None = None) -> list[NpyDay]:
    """Every day of a TorchRec folder, in day order, memory-mapped; its dense transform is
    declared (``torchrec_dense_min``) or inferred per day. A folder with a ``meta.json`` is not
    TorchRec's: a prepared folder is named as such, an earlier version's with the command that
    prepares it again."""
    if is_prepared(folder):
        read_meta(folder)  # refuses an earlier version's folder, naming the command
        raise DataError(f"{folder}: a prepared folder, not TorchRec's; use data.source=prepared")
    declared = DenseTransform(torchrec_dense_min) if torchrec_dense_min is not None else None
    return [NpyDay(folder, k, declared) for k in days(folder)]
