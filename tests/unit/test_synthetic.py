"""Synthetic rows without dense features (``num_dense=0``): ids only, the planted logit from the
sparse effects alone, the same rows for the same seed, whatever the row range."""

from __future__ import annotations

import numpy as np

from recsys.config import DataConfig, SyntheticConfig
from recsys.data.input.loader import load_splits
from recsys.data.input.synthetic import BLOCK, Generator, SyntheticRows, generate
from recsys.metrics.binary import auc

TABLES = [50, 200, 1000, 3000]


def test_rows_without_dense_features_carry_a_learnable_signal():
    cfg = SyntheticConfig(num_samples=BLOCK + 3000, seed=3)
    data = generate(cfg, 0, TABLES)
    n = cfg.num_samples
    assert data.dense_raw.shape == (n, 0) and data.sparse.shape == (n, len(TABLES), 1)
    assert data.labels.shape == (n,) and set(np.unique(data.labels)) == {0, 1}
    assert auc(data.labels, data.logits) > 0.6  # the true logits: the sparse effects alone
    assert 0.15 < data.labels.mean() < 0.35  # the bias still solves the positive rate (25%)
    cols = data.columns()
    assert cols.dense.shape == (n, 0) and cols.dense.dtype == np.float32
    # any row range equals the same rows of the whole data set (across a block boundary)
    part = SyntheticRows(cfg, 0, TABLES).read(BLOCK - 10, BLOCK + 10)
    assert part.dense.shape == (20, 0)
    np.testing.assert_array_equal(part.sparse, data.sparse[BLOCK - 10 : BLOCK + 10])


def test_rows_without_dense_features_are_deterministic_by_seed():
    cfg = SyntheticConfig(num_samples=2000, seed=5)
    a, b = generate(cfg, 0, TABLES), generate(cfg, 0, TABLES)
    for name in ("dense_raw", "sparse", "labels", "logits"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    other = generate(SyntheticConfig(num_samples=2000, seed=6), 0, TABLES)
    assert not np.array_equal(a.labels, other.labels)
    assert Generator(cfg, 0, TABLES).informative_dense == 0


def test_loader_splits_of_synthetic_rows_without_dense_features():
    data = DataConfig(source="synthetic", synthetic=SyntheticConfig(num_samples=1000, seed=1))
    splits = load_splits(data, 0, TABLES)
    cols = splits.train.read(0, 64)
    assert cols.dense.shape == (64, 0) and cols.labels.shape == (64, 1)
