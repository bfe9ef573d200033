"""Binary-classification metrics of CTR models on predictions in memory, in NumPy: ``auc``,
``log_loss``, normalised entropy and the rest (``binary_metrics``). Exact; checked against sklearn
in ``tests/unit/test_metrics.py``. Below both the data and the training code: the planted log's
oracle, the export's FP32-vs-quantized check and the split-wide ``MetricState`` use them.
"""

from __future__ import annotations

import math

import numpy as np

EPS = 1e-7


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties sharing their average rank (as ``scipy.stats.rankdata``,
    without importing scipy into every training worker)."""
    order = np.argsort(x, kind="mergesort")
    _, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return ranks


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum statistic (ties get average ranks); NaN with a single class."""
    labels = np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = average_ranks(np.asarray(scores))
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(probs.astype(np.float64), EPS, 1 - EPS)
    y = labels.astype(np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def entropy(rate: float) -> float:
    """Binary entropy of the background click rate (the log loss of always predicting it)."""
    r = min(max(rate, EPS), 1 - EPS)
    return -(r * math.log(r) + (1 - r) * math.log(1 - r))


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.asarray(logits, dtype=np.float64)))


def binary_metrics(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """AUC, log loss, normalized entropy (log loss / entropy of the CTR), calibration
    (mean prediction / mean label) and accuracy at 0.5, over ``[N]`` labels and logits."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    probs = sigmoid(logits)
    ctr = float(labels.mean())
    ll = log_loss(labels, probs)
    return {
        "auc": auc(labels, logits),
        "log_loss": ll,
        "ne": ll / entropy(ctr),
        "calibration": float(probs.mean() / ctr) if ctr > 0 else float("nan"),
        "accuracy": float(((probs > 0.5) == (labels > 0.5)).mean()),
        "ctr": ctr,
        "count": float(len(labels)),
    }
