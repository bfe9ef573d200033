"""The preprocessed binary form: a folder of ``day_{k}_{dense,sparse,labels}.npy`` triples.

This is TorchRec's layout (``torchrec.datasets.criteo.BinaryCriteoUtils``):

- ``day_{k}_dense.npy``: ``[N, 13]`` float32, already transformed;
- ``day_{k}_sparse.npy``: ``[N, 26]`` integer hashes or vocabulary ids (ours: uint32; TorchRec:
  int64);
- ``day_{k}_labels.npy``: ``[N, 1]`` int32 in {0, 1}.

Files are memory-mapped (``NpyDay``): a worker touches only the rows it reads, and labels are
checked on the rows read. The dense transform is data, not an assumption:

- our folders have a ``meta.json`` (written by ``python -m recsys.data.preprocess``) recording it
  (``log1p``: ``log(1 + max(x, 0))``, missing -> 0), the source files, rows, skipped rows, and
  the vocabularies when ids are contiguous;
- a folder made by TorchRec's own ``tsv_to_npys`` has no ``meta.json``: its dense values are
  ``log(x - m + 2)`` with ``m`` the smallest raw dense value of that file (missing -> 0 first), so
  ``m`` differs from day to day and is not stored. It is recognised (no ``meta.json``) and each
  day's ``m`` is read off its first rows (``infer_torchrec_min``; or declared with
  ``data.torchrec_dense_min``); rows are converted to ``log1p`` as they are read, so training,
  export and ``CriteoScorer`` see one transform.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys.data.columns import Columns, DataError, RowSource

META = "meta.json"
FORMAT = "recsys-criteo-npy-v2"
LOG1P = "log1p"
TORCHREC = "torchrec"
PARTS = ("dense", "sparse", "labels")
DTYPES = {"dense": np.dtype("<f4"), "sparse": np.dtype("<u4"), "labels": np.dtype("<i4")}
_TRIPLE = re.compile(r"^day_(\d+)_(dense|sparse|labels)\.npy$")
INFER_ROWS = 1 << 20  # rows TorchRec's per-day minimum is read off


def day_paths(folder: str, k: int) -> dict[str, str]:
    return {p: os.path.join(folder, f"day_{k}_{p}.npy") for p in PARTS}


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes for an array of ``dtype`` and ``shape`` (format 1.0)."""
    import io

    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def set_rows(path: str, dtype: np.dtype, width: int, rows: int) -> None:
    """Make the npy file at ``path`` hold ``rows`` rows: rewrite its header and cut the file there
    (its header has the same length for any row count of these shapes)."""
    old = npy_header(dtype, (0, width))
    new = npy_header(dtype, (rows, width))
    if len(new) != len(old):
        raise RuntimeError(f"npy header length changed ({len(old)} -> {len(new)})")
    with open(path, "r+b") as f:
        f.write(new)
        f.truncate(len(new) + rows * width * dtype.itemsize)


@dataclass(frozen=True)
class DenseTransform:
    """How a day's dense values were stored: ``log1p``, or TorchRec's ``log(x - min + 2)``."""

    kind: str = LOG1P
    min: int = 0

    def to_log1p(self, stored: np.ndarray) -> np.ndarray:
        """Stored dense values -> ``log(1 + max(x, 0))`` float32 (raw values are integers)."""
        if self.kind == LOG1P:
            return np.asarray(stored, dtype=np.float32)
        raw = np.rint(np.exp(np.asarray(stored, dtype=np.float64)) + self.min - 2)
        return np.log1p(np.maximum(raw, 0)).astype(np.float32)


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
            "to the smallest raw dense value of the file, or preprocess the raw files with "
            "python -m recsys.data.preprocess"
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
        self.transform = transform or DenseTransform(
            TORCHREC, infer_torchrec_min(self.dense, self.source)
        )

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


def read_meta(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        meta: dict[str, Any] = json.load(f)
    transform = meta.get("dense_transform", LOG1P)
    if transform not in (LOG1P, "log(1 + max(x, 0)), missing -> 0"):
        raise DataError(f"{path}: unknown dense_transform {transform!r}")
    return meta


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
    """Every day of a binary folder, in day order, memory-mapped. Ours (with ``meta.json``) are
    ``log1p``; a TorchRec folder's transform is declared (``torchrec_dense_min``) or inferred."""
    meta = read_meta(folder)
    declared = (
        DenseTransform(TORCHREC, torchrec_dense_min) if torchrec_dense_min is not None else None
    )
    transform = DenseTransform() if meta is not None else declared
    return [NpyDay(folder, k, transform) for k in days(folder)]
