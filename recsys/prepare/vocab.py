"""Vocabularies: each categorical feature's values mapped to contiguous ids.

Values seen at least ``min_count`` times in the training rows are kept, at most ``max_size`` of
them (the most frequent), by descending frequency (ties by value: the value's 64-bit hash). A
table puts them after its missing row and its ``oov_buckets`` rows for unseen values, so it has
``1 + oov_buckets + V`` rows (``recsys.prepare.ids.Vocabulary`` looks ids up).

Counting is a map-reduce: any block of rows gives ``(values, counts)``, and ``merge_counts`` of
any two results is associative and commutative, so any tree of merges gives the same counts.
"""

from __future__ import annotations

import numpy as np

Counts = tuple[np.ndarray, np.ndarray]  # (distinct values, counts int64)


def merge_counts(a: Counts, b: Counts) -> Counts:
    """The counts of the union of two blocks of rows (values sorted, distinct)."""
    values = np.concatenate([a[0], b[0]])
    counts = np.concatenate([a[1], b[1]])
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    if len(values) == 0:
        return values, counts
    first = np.concatenate([[True], values[1:] != values[:-1]])
    starts = np.flatnonzero(first)
    return values[starts], np.add.reduceat(counts, starts)


def build(counts: Counts, min_count: int, max_size: int | None = None) -> np.ndarray:
    """The kept values in id order (descending count, then value): those seen >= ``min_count``
    times, then the first ``max_size`` of them (None: all)."""
    values, n = counts
    keep = n >= min_count
    values, n = values[keep], n[keep]
    return values[np.lexsort((values, -n))][:max_size]
