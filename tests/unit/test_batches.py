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
from recsys.data.input.loader import to_batch

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
    from recsys.data.input.loader import map_position

    assert map_position(250, 100, 100) == 250  # same shard: unchanged
    assert map_position(250, 100, 40) == 2 * 40 + 20  # epoch 2, half done
    assert map_position(250, 100, 300) == 2 * 300 + 150
    assert map_position(99, 100, 7) == 6  # rounded down, still in the same epoch
    assert map_position(250, 0, 40) == 250  # a checkpoint that did not record its shard


def test_weighted_lists_give_a_weighted_kjt_taken_and_gathered_with_their_ids():
    """A weighted list's weights travel with its ids through a row gather (``take``) into the
    KJT; the unweighted features' ids weigh 1 and a QR remainder weighs as its quotient."""
    lengths = np.array([[1, 2, 1], [1, 0, 1], [1, 3, 1]])
    values = (np.array([1, 2, 3]), np.array([10, 11, 12, 13, 14]), np.array([4, 5, 6]))
    weights = (None, np.array([0.5, 1.5, 2.0, 3.0, 4.0], np.float32), None)
    cols = RaggedColumns(np.zeros((3, 2), np.float32), values, lengths, np.zeros((3, 1)),
                         weights=weights)  # fmt: skip
    rows = cols.take(np.array([2, 0]))
    assert rows.weights is not None and rows.weights[1].tolist() == [2.0, 3.0, 4.0, 0.5, 1.5]
    assert rows.weights[0] is None
    kjt = to_batch(rows, LAYOUT).sparse_features
    assert kjt.weights_or_none() is not None
    assert kjt["b"].values().tolist() == [v // 8 for v in [12, 13, 14, 10, 11]]
    assert kjt["b"].weights().tolist() == [2.0, 3.0, 4.0, 0.5, 1.5]
    assert kjt["b__qr_r"].weights().tolist() == [2.0, 3.0, 4.0, 0.5, 1.5]
    assert kjt["a"].weights().tolist() == [1.0, 1.0] and kjt["c"].weights().tolist() == [1.0, 1.0]
    _check(kjt, [rows.lengths[:, 0], rows.lengths[:, 1], rows.lengths[:, 2], rows.lengths[:, 1]])
    assert to_batch(RaggedColumns(cols.dense, values, lengths, cols.labels), LAYOUT
                    ).sparse_features.weights_or_none() is None  # fmt: skip
    with pytest.raises(ValueError, match="5 ids and 4 weights"):
        RaggedColumns(cols.dense, values, lengths, cols.labels,
                      weights=(None, weights[1][:4], None))  # fmt: skip
