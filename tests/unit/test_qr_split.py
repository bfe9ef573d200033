"""The QR split is one rule on every path: the loader's (fixed-width ``sparse_ids`` and ragged
``ragged_kjt``) equals the model's TorchScript ``qr_split_kjt`` (which the exported model runs on
raw ids) over random inputs, weighted lists included, eager and scripted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.config import SparseLayout
from recsys.data.columns import Columns, RaggedColumns
from recsys.data.input.loader import ragged_kjt, to_batch
from recsys.models.embeddings import qr_split_kjt

NAMES, ROWS = ["a", "b", "c", "d"], [50, 1000, 7, 300]
QR = {"b": 16, "d": 5}


def same(x, y) -> None:
    assert x.keys() == y.keys()
    torch.testing.assert_close(x.values(), y.values(), rtol=0, atol=0)
    torch.testing.assert_close(x.lengths(), y.lengths(), rtol=0, atol=0)
    if x.weights_or_none() is None:
        assert y.weights_or_none() is None
    else:
        torch.testing.assert_close(x.weights(), y.weights(), rtol=0, atol=0)


def ragged(seed: int, weighted: bool) -> RaggedColumns:
    rng = np.random.default_rng(seed)
    n = 37
    lengths = rng.integers(0, 6, size=(n, len(NAMES)))
    values = tuple(rng.integers(0, 10**6, size=int(lengths[:, f].sum())) for f in range(4))
    weights = None
    if weighted:  # two weighted lists, two plain
        weights = tuple(rng.random(len(v)).astype(np.float32) if f in (1, 2) else None
                        for f, v in enumerate(values))  # fmt: skip
    labels = np.zeros((n, 1), np.float32)
    return RaggedColumns(np.zeros((n, 0), np.float32), values, lengths, labels, weights=weights)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loaders_ragged_split_is_the_models(seed, weighted):
    cols = ragged(seed, weighted)
    plain = ragged_kjt(cols, SparseLayout(NAMES, ROWS))  # ids mod rows, no split
    split = ragged_kjt(cols, SparseLayout(NAMES, ROWS, QR))
    same(split, qr_split_kjt(plain, QR))
    same(split, torch.jit.script(qr_split_kjt)(plain, QR))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_loaders_fixed_width_split_is_the_models(seed):
    rng = np.random.default_rng(seed)
    cols = Columns(np.zeros((11, 0), np.float32), rng.integers(0, 10**6, size=(11, 4, 3)),
                   np.zeros((11, 1), np.float32))  # fmt: skip
    plain = to_batch(cols, SparseLayout(NAMES, ROWS)).sparse_features
    split = to_batch(cols, SparseLayout(NAMES, ROWS, QR)).sparse_features
    same(split, qr_split_kjt(plain, QR))
