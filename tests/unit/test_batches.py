"""Batches as the model reads them: KJTs carry ``length_per_key`` and ``offset_per_key`` known on
the host (without them every input distribution computes them with a device-to-host sync), for
fixed-width (Criteo) and ragged (a user's lists) rows, QR keys included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import SparseLayout
from recsys.data.columns import Columns, RaggedColumns
from recsys.data.loader import to_batch

LAYOUT = SparseLayout(["a", "b", "c"], [50, 1000, 7], {"b": 8})


def _check(kjt: KeyedJaggedTensor, lengths_per_key: list[np.ndarray]) -> None:
    per_key = [int(x.sum()) for x in lengths_per_key]
    assert kjt._length_per_key == per_key  # set when built, not computed later
    assert kjt._offset_per_key == [0, *np.cumsum(per_key).tolist()]
    moved = kjt.to(torch.device("cpu"))
    assert moved._length_per_key == per_key and moved._offset_per_key == kjt._offset_per_key
    plain = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                              stride=kjt.stride())  # fmt: skip
    assert plain.length_per_key() == per_key  # what TorchRec would compute on the device


def test_fixed_width_batches_carry_length_per_key():
    rng = np.random.default_rng(0)
    cols = Columns(rng.normal(size=(6, 2)).astype(np.float32),
                   rng.integers(0, 10_000, (6, 3, 2)), np.zeros((6, 1)))  # fmt: skip
    kjt = to_batch(cols, LAYOUT).sparse_features
    assert kjt.keys() == ["a", "b", "c", "b__qr_r"]
    _check(kjt, [np.full(6, 2)] * 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_batches_carry_length_per_key_and_real_lengths(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, (7, 3))
    lengths[0] = 0  # a row with every bag empty
    values = tuple(rng.integers(0, 10_000, int(lengths[:, f].sum())) for f in range(3))
    cols = RaggedColumns(np.zeros((7, 2), np.float32), values, lengths, np.zeros((7, 1)))
    kjt = to_batch(cols, LAYOUT).sparse_features
    per_key = [lengths[:, 0], lengths[:, 1], lengths[:, 2], lengths[:, 1]]
    assert kjt.lengths().tolist() == np.concatenate(per_key).tolist()
    _check(kjt, per_key)
    b = values[1] % 1000
    assert kjt["b"].values().tolist() == (b // 8).tolist()
    assert kjt["b__qr_r"].values().tolist() == (b % 8).tolist()
    assert kjt["a"].values().tolist() == (values[0] % 50).tolist()


def test_a_data_position_keeps_its_epoch_and_fraction_on_another_shard():
    from recsys.data.loader import map_position

    assert map_position(250, 100, 100) == 250  # same shard: unchanged
    assert map_position(250, 100, 40) == 2 * 40 + 20  # epoch 2, half done
    assert map_position(250, 100, 300) == 2 * 300 + 150
    assert map_position(99, 100, 7) == 6  # rounded down, still in the same epoch
    assert map_position(250, 0, 40) == 250  # a checkpoint that did not record its shard
