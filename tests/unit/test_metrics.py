"""Metrics against sklearn."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from recsys.train.metrics import binary_metrics


def test_metrics_match_sklearn():
    rng = np.random.default_rng(0)
    labels = (rng.random(500) < 0.3).astype(np.float64)
    logits = np.round(rng.normal(labels, 1.0), 1)  # rounding creates ties
    m = binary_metrics(labels, logits)
    probs = 1 / (1 + np.exp(-logits))
    assert math.isclose(m["auc"], roc_auc_score(labels, logits), rel_tol=1e-12)
    assert math.isclose(m["log_loss"], log_loss(labels, probs), rel_tol=1e-9)
    ctr = labels.mean()
    assert math.isclose(m["ne"], m["log_loss"] / log_loss(labels, np.full(500, ctr)), rel_tol=1e-9)
    assert math.isclose(m["calibration"], probs.mean() / ctr, rel_tol=1e-12)


def test_single_class_auc_is_nan():
    assert math.isnan(binary_metrics(np.zeros(4), np.zeros(4))["auc"])
