"""Ranking and calibration metrics: GAUC (each group's AUC weighted by its rows, groups with one
class left out and their share reported) and ECE over 10 bins, equal to a plain pandas /
scikit-learn computation; the training workers' forms (``GroupAUC`` over batches that cut groups
anywhere, ``MetricState``'s calibration bins) equal the in-memory ones (on 2 gloo ranks:
``tests/distributed/test_group_auc.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from recsys.metrics.ranking import ece, gauc
from recsys.train.metrics import GroupAUC, MetricState


def rows(n: int = 3000, groups: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = rng.random(n) < 0.3
    s = np.round(rng.normal(size=n) + 0.8 * y + 0.3 * (g % 7), 1)  # rounded: ties within groups
    return pd.DataFrame({"g": g, "y": y.astype(float), "s": s})


def pandas_gauc(df: pd.DataFrame) -> tuple[float, float]:
    weighted = kept = left = 0.0
    for _, d in df.groupby("g"):
        if d["y"].nunique() < 2:
            left += len(d)
            continue
        weighted += len(d) * roc_auc_score(d["y"], d["s"])
        kept += len(d)
    return weighted / kept, left / len(df)


def test_gauc_is_each_groups_auc_weighted_by_its_rows():
    df = rows()
    value, left = gauc(df["g"].to_numpy(), df["y"].to_numpy(), df["s"].to_numpy())
    assert (value, left) == pytest.approx(pandas_gauc(df), abs=1e-12)
    assert left > 0  # some groups have one class only: left out, and said
    assert gauc(np.zeros(3), np.array([1.0, 1.0, 1.0]), np.ones(3))[0] != gauc(
        np.zeros(3), np.array([0.0, 1.0, 1.0]), np.array([0.0, 1.0, 2.0]))[0]  # fmt: skip


def test_ece_is_the_bins_gap_weighted_by_their_rows():
    rng = np.random.default_rng(1)
    p = rng.random(5000)
    y = (rng.random(5000) < p**1.3).astype(float)
    frame = pd.DataFrame({"p": p, "y": y, "b": np.minimum((p * 10).astype(int), 9)})
    gaps = frame.groupby("b").apply(lambda d: len(d) * abs(d["p"].mean() - d["y"].mean()),
                                    include_groups=False)  # fmt: skip
    assert ece(y, p) == pytest.approx(float(gaps.sum()) / len(frame))
    assert ece(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 0.0


def padded(x: torch.Tensor, a: int, b: int, size: int) -> torch.Tensor:
    """Rows ``a:b`` of ``x`` padded to ``size`` with its first rows (as ``eval_batches`` pads)."""
    return torch.cat([x[a:b], x[: size - (b - a)]])


def test_the_workers_forms_equal_the_in_memory_ones():
    df = rows()  # in no order of groups
    df["g"] += 1  # group 0 is a row without one
    logits = torch.tensor(df["s"].to_numpy(), dtype=torch.float32)[:, None]
    labels = torch.tensor(df["y"].to_numpy(), dtype=torch.float32)[:, None]
    groups = torch.tensor(df["g"].to_numpy())
    state, ranking = MetricState(1, torch.device("cpu"), bits=16), GroupAUC(1, torch.device("cpu"))
    for a in range(0, len(df), 256):  # batches cut groups anywhere; the last one padded
        b = min(a + 256, len(df))
        valid = torch.ones(256, dtype=torch.bool)
        valid[b - a :] = False
        x, y, g = (padded(v, a, b, 256) for v in (logits, labels, groups))
        state.update(x, y, valid)
        ranking.update(g, x, y, valid)
    ranking.finish(world_size=1)
    got = ranking.compute()
    want, left = pandas_gauc(df)
    assert got["gauc"] == pytest.approx(want, abs=1e-9) and got["gauc_left_out"] == pytest.approx(
        left)  # fmt: skip
    none = GroupAUC(1, torch.device("cpu"))  # rows without a group: left out, and said
    g = torch.tensor([0, 0, 5, 5])
    none.update(g, torch.tensor([[0.1], [0.2], [0.3], [0.9]]), torch.tensor([[0.0], [1.0],
                [0.0], [1.0]]), torch.ones(4, dtype=torch.bool))  # fmt: skip
    none.finish(world_size=1)
    assert none.compute() == {"gauc": 1.0, "gauc_left_out": 0.5}
    probs = torch.sigmoid(logits[:, 0].double()).numpy()
    assert state.compute()["ece"] == pytest.approx(ece(df["y"].to_numpy(), probs), abs=1e-9)
