"""Vocabularies: each categorical feature's values mapped to contiguous ids.

Values seen at least ``min_count`` times get ids ``1..V`` by descending frequency (ties by value),
and everything else (rare values, and missing, stored as hash 0) shares id 0, as the published
DLRM / QR results on Criteo Kaggle do (TorchRec's contiguous preprocessing, dlrm's Kaggle path).
A feature's table then needs ``V + 1`` rows. A hash of ``00000000`` reads as missing (as in
TorchRec's and dlrm's readers).

Counting is a map-reduce: ``count_values`` over any block of rows, ``merge_counts`` of any two
results (associative and commutative, so any tree of merges gives the same counts).

On disk (in the preprocessed folder, named in ``meta.json``): ``vocab/C{f}.npy`` lists feature
``f``'s kept values in id order (value ``i`` has id ``i + 1``).
"""

from __future__ import annotations

import os

import numpy as np

Counts = tuple[np.ndarray, np.ndarray]  # (sorted distinct values uint32, counts int64)
MISSING_ID = 0


def count_values(column: np.ndarray) -> Counts:
    """Distinct non-missing values of one feature's column and how often each occurs."""
    values, counts = np.unique(np.asarray(column, dtype=np.uint32), return_counts=True)
    keep = values != 0
    return values[keep], counts[keep].astype(np.int64)


def merge_counts(a: Counts, b: Counts) -> Counts:
    """The counts of the union of two blocks of rows."""
    values = np.concatenate([a[0], b[0]])
    counts = np.concatenate([a[1], b[1]])
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    if len(values) == 0:
        return values, counts
    first = np.concatenate([[True], values[1:] != values[:-1]])
    starts = np.flatnonzero(first)
    return values[starts], np.add.reduceat(counts, starts)


def build(counts: Counts, min_count: int) -> np.ndarray:
    """The kept values (seen >= ``min_count`` times) in id order: descending count, then value
    (in the values' own dtype: Criteo's uint32 hashes, or a user's data's uint64 value hashes)."""
    values, n = counts
    keep = n >= min_count
    values, n = values[keep], n[keep]
    return values[np.lexsort((values, -n))]


class Vocab:
    """Lookup of one feature: ``ids(values) -> ids`` (0 for values not kept)."""

    def __init__(self, kept: np.ndarray) -> None:
        self.kept = np.asarray(kept, dtype=np.uint32)
        order = np.argsort(self.kept, kind="stable")
        self.keys = self.kept[order]
        self.ids_of_keys = (order + 1).astype(np.uint32)

    @property
    def size(self) -> int:
        """Rows a table needs: the kept values and the shared id."""
        return len(self.kept) + 1

    def ids(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.uint32)
        if len(self.keys) == 0:
            return np.zeros(values.shape, dtype=np.uint32)
        pos = np.minimum(np.searchsorted(self.keys, values), len(self.keys) - 1)
        return np.where(self.keys[pos] == values, self.ids_of_keys[pos], MISSING_ID).astype(
            np.uint32
        )


def file_name(feature: int) -> str:
    return os.path.join("vocab", f"C{feature + 1}.npy")


def save(folder: str, kept: list[np.ndarray]) -> list[str]:
    """Write each feature's kept values; returns the file names (relative to ``folder``)."""
    os.makedirs(os.path.join(folder, "vocab"), exist_ok=True)
    names = [file_name(f) for f in range(len(kept))]
    for name, values in zip(names, kept, strict=True):
        np.save(os.path.join(folder, name), values)
    return names


def load(folder: str, names: list[str]) -> list[Vocab]:
    return [Vocab(np.load(os.path.join(folder, name))) for name in names]


def apply(sparse: np.ndarray, vocabs: list[Vocab]) -> np.ndarray:
    """``[N, F]`` raw hashes -> ``[N, F]`` ids."""
    out = np.empty(sparse.shape, dtype=np.uint32)
    for f, v in enumerate(vocabs):
        out[:, f] = v.ids(sparse[:, f])
    return out
