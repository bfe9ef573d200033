"""Ranking and calibration metrics on predictions in memory, in NumPy: what a recommender's
evaluation reports beside the global AUC (the training workers compute the same from their own
rows: ``recsys.train.metrics``; tests hold the two equal).

- ``gauc``: the group AUC. A recommender ranks each user's items one user at a time, and a model
  that separates users well but ranks each user's items badly scores well on the global AUC. GAUC
  is each group's AUC weighted by its rows, over the groups with both classes; the groups with one
  class (no pair to rank) are left out, and their share of the rows is reported with it.
- ``ece``: the expected calibration error over ``ECE_BINS`` equal-width bins of the predicted
  probability: ``sum_b n_b / N * |mean p_b - mean y_b|``.
"""

from __future__ import annotations

import numpy as np

ECE_BINS = 10


def group_aucs(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each group's rows and its AUC (NaN with one class): ``[G]`` each, in the order of the
    groups' first rows after a sort by group. Vectorised: ranks within a group by one sort of
    ``(group, score)``, ties sharing their average rank."""
    groups, y = np.asarray(groups), np.asarray(labels).astype(bool)
    s = np.asarray(scores, np.float64)
    order = np.lexsort((s, groups))
    g, y, s = groups[order], y[order], s[order]
    n = len(g)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    new_group = np.r_[True, g[1:] != g[:-1]]
    gid = np.cumsum(new_group) - 1
    first = np.flatnonzero(new_group)
    position = np.arange(n) - first[gid]  # 0-based within the group
    run_start = np.flatnonzero(new_group | np.r_[True, s[1:] != s[:-1]])
    run_len = np.diff(np.r_[run_start, n])
    ranks = np.repeat(position[run_start] + (run_len + 1) / 2.0, run_len)
    size = np.bincount(gid)
    pos = np.bincount(gid, y.astype(np.float64))
    neg = size - pos
    rank_sum = np.bincount(gid, ranks * y)
    with np.errstate(divide="ignore", invalid="ignore"):
        aucs = (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
    return size, np.where((pos > 0) & (neg > 0), aucs, np.nan)


def gauc(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """``(GAUC, share of the rows left out)``: groups ``[N]`` (integer ids), labels and
    scores ``[N]``. NaN GAUC where no group has both classes."""
    size, aucs = group_aucs(groups, labels, scores)
    kept = ~np.isnan(aucs)
    rows = size[kept].sum()
    value = float((size[kept] * aucs[kept]).sum() / rows) if rows else float("nan")
    return value, (float(size[~kept].sum() / size.sum()) if size.sum() else float("nan"))


def ece(labels: np.ndarray, probs: np.ndarray, bins: int = ECE_BINS) -> float:
    """The expected calibration error of ``probs`` against ``labels`` (``[N]`` each)."""
    p, y = np.asarray(probs, np.float64), np.asarray(labels, np.float64)
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    sum_p = np.bincount(b, p, minlength=bins)
    sum_y = np.bincount(b, y, minlength=bins)
    return float(np.abs(sum_p - sum_y).sum() / max(len(p), 1))
