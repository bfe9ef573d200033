"""Metrics against sklearn."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from recsys.metrics.binary import binary_metrics


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


def _state(logits, labels, rows=None):
    """A state over ``logits`` sized for ``rows`` rows in all (every rank sizes it alike)."""
    import torch

    from recsys.train.metrics import MetricState, bits_for

    state = MetricState(1, torch.device("cpu"), bits_for(rows or len(logits)))
    x, y = torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(labels).float()
    state.update(x[:, None], y[:, None], torch.ones(len(x), dtype=torch.bool))
    return state


def test_histogram_metrics_equal_sklearn_within_their_stated_bound():
    rng = np.random.default_rng(1)
    labels = (rng.random(50_000) < 0.25).astype(np.float64)
    for logits in (rng.normal(labels, 1.0), np.round(rng.normal(labels, 1.0), 1)):
        m = _state(logits, labels).compute()
        exact = binary_metrics(labels, logits.astype(np.float32))
        assert (
            abs(m["auc"] - roc_auc_score(labels, logits.astype(np.float32)))
            <= m["auc_error_bound"] + 1e-12
        )
        for k in ("log_loss", "ne", "calibration", "accuracy", "ctr", "count"):
            assert math.isclose(m[k], exact[k], rel_tol=1e-9), k
    continuous = _state(rng.normal(labels, 1.0), labels).compute()
    assert continuous["auc_error_bound"] < 1e-4  # the bound is tight for continuous scores


def test_states_of_two_ranks_sum_to_the_state_of_all_rows():
    rng = np.random.default_rng(2)
    labels = (rng.random(4000) < 0.3).astype(np.float64)
    logits = rng.normal(labels, 1.0)
    whole = _state(logits, labels)
    a, b = _state(logits[:1500], labels[:1500], 4000), _state(logits[1500:], labels[1500:], 4000)
    for ta, tb in zip(a.tensors(), b.tensors(), strict=True):
        ta += tb  # what the all-reduce does
    got, want = a.compute(), whole.compute()
    assert (got["auc"], got["auc_error_bound"], got["count"]) == (
        want["auc"],
        want["auc_error_bound"],
        want["count"],
    )  # the histograms add exactly; the float sums to rounding
    assert all(math.isclose(got[k], want[k], rel_tol=1e-12) for k in want)


def test_padding_rows_are_not_counted():
    import torch

    from recsys.train.metrics import MetricState

    state = MetricState(1, torch.device("cpu"))
    x, y = torch.tensor([[2.0], [-1.0], [9.0]]), torch.tensor([[1.0], [0.0], [0.0]])
    state.update(x, y, torch.tensor([True, True, False]))
    m = state.compute()
    assert m["count"] == 2 and m["auc"] == 1.0 and m["auc_error_bound"] == 0.0
