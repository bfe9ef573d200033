"""The preprocessed binary form: a folder of ``day_{k}_{dense,sparse,labels}.npy`` triples.

This is TorchRec's layout (``torchrec.datasets.criteo.BinaryCriteoUtils``), so a folder that
TorchRec's scripts made from Criteo 1TB is read as it is, and ours is readable by TorchRec's tools:

- ``day_{k}_dense.npy``: ``[N, 13]`` float32, already transformed;
- ``day_{k}_sparse.npy``: ``[N, 26]`` integer hashes or ids (ours: uint32; TorchRec: int64);
- ``day_{k}_labels.npy``: ``[N, 1]`` int32 in {0, 1}.

Files are memory-mapped: a trial touches only the rows its worker reads. ``meta.json`` (ours only)
records the source files, rows and skipped rows.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Callable

import numpy as np

from recsys.data.columns import Columns, DataError
from recsys.data.criteo import NUM_DENSE, NUM_SPARSE, ReadStats, is_gzip, iter_chunks

_TRIPLE = re.compile(r"^day_(\d+)_(dense|sparse|labels)\.npy$")


def count_lines(path: str) -> int:
    """Lines in a plain or gzip file (a last line without newline counts)."""
    opener: Callable[..., object] = gzip.open if is_gzip(path) else open
    n, last = 0, b"\n"
    with opener(path, "rb") as f:  # type: ignore[attr-defined]
        while block := f.read(1 << 22):  # type: ignore[attr-defined]
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _paths(out_dir: str, k: int) -> dict[str, str]:
    return {p: os.path.join(out_dir, f"day_{k}_{p}.npy") for p in ("dense", "sparse", "labels")}


def convert_file(
    path: str,
    out_dir: str,
    k: int,
    on_bad_row: str,
    progress: Callable[[int], None] | None = None,
    total: int | None = None,
) -> ReadStats:
    """Stream one Criteo TSV into ``day_{k}_*.npy`` in ``out_dir``, in constant memory.
    ``total``: its line count, if the caller has it already (else one more pass counts it)."""
    total = count_lines(path) if total is None else total
    paths = _paths(out_dir, k)
    shapes = {"dense": (total, NUM_DENSE), "sparse": (total, NUM_SPARSE), "labels": (total, 1)}
    dtypes = {"dense": np.float32, "sparse": np.uint32, "labels": np.int32}
    arrays = {
        p: np.lib.format.open_memmap(paths[p] + ".tmp", mode="w+", dtype=dtypes[p], shape=shapes[p])
        for p in paths
    }
    stats = ReadStats()
    row = skipped = 0
    for chunk in iter_chunks(path, on_bad_row=on_bad_row, stats=stats):
        n = len(chunk)
        arrays["dense"][row : row + n] = chunk.dense
        arrays["sparse"][row : row + n] = chunk.sparse[:, :, 0]
        arrays["labels"][row : row + n] = chunk.labels
        row += n
        if progress:
            progress(n + stats.skipped - skipped)
            skipped = stats.skipped
    if row == 0:
        raise DataError(f"{path}: no valid rows (skipped {stats.skipped})")
    for p, arr in arrays.items():
        arr.flush()
        if row == total:
            os.replace(paths[p] + ".tmp", paths[p])
        else:  # rows were skipped: keep only the filled part
            np.save(paths[p], np.asarray(arr[:row]))
            os.remove(paths[p] + ".tmp")
    return stats


def write_meta(out_dir: str, sources: list[str], stats: list[ReadStats]) -> None:
    meta = {
        "format": "recsys-criteo-npy-v1",
        "dense_transform": "log(1 + max(x, 0)), missing -> 0",
        "files": [
            {"day": k, "source": os.path.abspath(s), "rows": st.rows, "skipped": st.skipped}
            for k, (s, st) in enumerate(zip(sources, stats, strict=True))
        ],
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)


def _days(folder: str) -> list[int]:
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
        missing = {"dense", "sparse", "labels"} - parts
        if missing:
            raise DataError(f"{folder}: day_{k}_{sorted(missing)[0]}.npy is missing")
    return sorted(found)


def load_day(folder: str, k: int) -> Columns:
    """Memory-map one day's triple and check shapes and labels."""
    paths = _paths(folder, k)
    try:
        dense, sparse, labels = (np.load(paths[p], mmap_mode="r") for p in paths)
    except (ValueError, OSError) as e:
        raise DataError(f"{folder}: day_{k} is not a readable npy triple: {e}") from None
    if dense.ndim != 2 or sparse.ndim != 2:
        raise DataError(f"{paths['dense']}: expected 2-d arrays, got {dense.shape}, {sparse.shape}")
    if len(dense) == 0:
        raise DataError(f"{paths['dense']}: empty")
    bad = np.flatnonzero((labels != 0) & (labels != 1))
    if len(bad):
        raise DataError(
            f"{paths['labels']}: row {bad[0]}: label must be 0 or 1, got {labels[bad[0]]}"
        )
    return Columns(
        dense=dense,
        sparse=sparse.reshape(len(sparse), sparse.shape[1], 1),
        labels=labels.reshape(len(labels), -1),
        source=paths["dense"],
    )


def load_folder(folder: str) -> list[Columns]:
    """Every day of a binary folder, in day order."""
    return [load_day(folder, k) for k in _days(folder)]
