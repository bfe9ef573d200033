"""Per-task evaluation: each task's figures equal scikit-learn's on its own label, under the
names a sweep can score by (``val_auc`` = the first task, ``val_auc/<task>``, ``val_auc/mean``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.metrics.binary import entropy
from recsys.train.evaluation import task_metrics
from recsys.train.metrics import MetricState


def test_each_task_equals_sklearn_on_its_label():
    rng = np.random.default_rng(0)
    n, names = 5000, ["click", "like", "share"]
    labels = (rng.random((n, 3)) < [0.3, 0.1, 0.02]).astype(np.float64)
    logits = rng.normal(size=(n, 3)) + 1.5 * labels  # a different signal per task
    state = MetricState(3, torch.device("cpu"))
    for lo in range(0, n, 1000):  # in batches, some rows padding
        valid = torch.ones(1000, dtype=torch.bool)
        valid[-7:] = lo < n - 1000  # the last batch's last 7 rows are padding
        state.update(
            torch.tensor(logits[lo : lo + 1000]).float(),
            torch.tensor(labels[lo : lo + 1000]),
            valid,
        )
    keep = np.ones(n, bool)
    keep[-7:] = False
    got = task_metrics([state.compute(t) for t in range(3)], names, "val")
    for t, name in enumerate(names):
        y, z = labels[keep, t], logits[keep, t].astype(np.float32)
        p = 1 / (1 + np.exp(-z.astype(np.float64)))
        assert (
            abs(got[f"val_auc/{name}"] - roc_auc_score(y, z))
            <= got[f"val_auc_error_bound/{name}"] + 1e-12
        )
        assert got[f"val_log_loss/{name}"] == pytest.approx(log_loss(y, p), rel=1e-6)
        assert got[f"val_ne/{name}"] == pytest.approx(log_loss(y, p) / entropy(y.mean()), rel=1e-6)
    assert got["val_auc"] == got["val_auc/click"]  # the first task is the unsuffixed one
    for m in ("auc", "log_loss", "ne", "accuracy"):
        assert got[f"val_{m}/mean"] == pytest.approx(np.mean([got[f"val_{m}/{k}"] for k in names]))


def test_one_task_reports_only_the_plain_names():
    state = MetricState(1, torch.device("cpu"))
    state.update(
        torch.tensor([[0.1], [2.0]]), torch.tensor([[0.0], [1.0]]), torch.ones(2, dtype=torch.bool)
    )
    got = task_metrics([state.compute(0)], ["click"], "val")
    assert got["val_auc"] == 1.0 and not any("/" in k for k in got)


def test_the_monitor_names_a_task_or_the_mean_or_is_refused():
    tasks = {"loss": {"tasks": [{"name": "click"}, {"name": "like", "label_column": 1}]}}
    for ok in ("val_auc/like", "val_ne/mean", "val_log_loss"):
        ExperimentConfig.from_dict({**tasks, "train": {"monitor": ok}})
    with pytest.raises(ConfigError, match="no task 'lkie'.*did you mean 'like'"):
        ExperimentConfig.from_dict({**tasks, "train": {"monitor": "val_auc/lkie"}})
    with pytest.raises(ConfigError, match="one of"):
        ExperimentConfig.from_dict({**tasks, "train": {"monitor": "val_acu"}})


def test_task_weights_are_set_by_task_name():
    base = {"loss": {"tasks": [{"name": "click"}, {"name": "like", "label_column": 1}]}}
    cfg = ExperimentConfig.from_dict(base).with_overrides({"loss.task_weights.like": 0.25})
    assert [t.weight for t in cfg.loss.tasks] == [1.0, 0.25]
    with pytest.raises(ConfigError, match="no such task.*did you mean 'like'"):
        ExperimentConfig.from_dict(base).with_overrides({"loss.task_weights.lke": 0.5})
