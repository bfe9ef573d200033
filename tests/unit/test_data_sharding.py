"""Per-worker sharding: disjoint, complete, resumable, equal eval batch counts."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.config import SparseLayout
from recsys.data import Columns, shard_range
from recsys.data.input.loader import TrainStream, eval_batches, to_batch

N, F = 103, 3


def indexed(n: int = N) -> Columns:
    """Columns whose dense[:, 0] is the row number."""
    dense = np.zeros((n, 2), np.float32)
    dense[:, 0] = np.arange(n)
    sparse = np.arange(n * F, dtype=np.int64).reshape(n, F, 1)
    return Columns(dense, sparse, np.zeros((n, 1), np.float32))


def stream(cols: Columns, rank: int, world: int = 2, batch: int = 8, **kw) -> TrainStream:
    return TrainStream(
        cols,
        rank=rank,
        world_size=world,
        batch_size=batch,
        layout=SparseLayout(["a", "b", "c"], [1000] * F),
        seed=0,
        shuffle=True,
        **kw,
    )


def test_two_workers_cover_the_split_once_per_epoch():
    cols = indexed()
    seen = []
    for rank in range(2):
        s = stream(cols, rank)
        start, stop = shard_range(N, rank, 2)
        rows = []
        while s.position < stop - start:
            rows += next(s).dense_features[:, 0].long().tolist()
        rows = rows[: stop - start]  # the last batch wraps into the next epoch
        assert len(set(rows)) == len(rows) == stop - start
        seen.append(set(rows))
    assert seen[0].isdisjoint(seen[1])
    assert seen[0] | seen[1] == set(range(N))


def test_stream_resumes_exactly_from_position():
    cols = indexed()
    straight = stream(cols, 1)
    first = [next(straight) for _ in range(10)]
    resumed = stream(cols, 1, position=stream_position_after(cols, 4))
    for a, b in zip(first[4:], (next(resumed) for _ in range(6)), strict=True):
        np.testing.assert_array_equal(a.dense_features, b.dense_features)


def stream_position_after(cols: Columns, steps: int) -> int:
    s = stream(cols, 1)
    for _ in range(steps):
        next(s)
    return s.position


def test_eval_batches_equal_count_and_cover_once():
    cols = indexed()
    per_rank = []
    for rank in range(2):
        out = list(
            eval_batches(
                cols,
                rank=rank,
                world_size=2,
                batch_size=16,
                layout=SparseLayout(["a", "b", "c"], [1000] * F),
            )
        )
        per_rank.append(out)
    assert len(per_rank[0]) == len(per_rank[1]) == 4  # ceil(ceil(103 / 2) / 16)
    rows = [
        int(r)
        for out in per_rank
        for batch, valid in out
        for r in batch.dense_features[valid, 0].tolist()
    ]
    assert sorted(rows) == list(range(N))


def test_kjt_layout_and_modulo():
    cols = indexed(4)
    batch = to_batch(cols, SparseLayout(["a", "b", "c"], [5, 7, 1000]))
    kjt = batch.sparse_features
    assert kjt.keys() == ["a", "b", "c"]
    assert kjt["a"].values().tolist() == [0, 3 % 5, 6 % 5, 9 % 5]
    assert kjt["b"].values().tolist() == [1, 4, 7 % 7, 10 % 7]
    assert kjt.stride() == 4


def test_too_few_rows_for_workers():
    with pytest.raises(Exception, match="1 training rows cannot feed 2 workers"):
        stream(indexed(1), 0)


def test_ids_beyond_table_size_are_hashed_and_counted():
    cols = indexed(8)  # sparse ids 0..23 over 3 features
    s = TrainStream(
        cols,
        rank=0,
        world_size=1,
        batch_size=8,
        layout=SparseLayout(["a", "b", "c"], [10, 10, 1000]),
        seed=0,
        shuffle=False,
    )
    batch = next(s)
    expected = int((cols.sparse[:, :2, 0] >= 10).sum())
    assert s.ids_hashed == expected > 0
    assert max(batch.sparse_features["a"].values().tolist()) < 10


def test_synthetic_rows_are_generated_per_rank_for_its_own_rows_only():
    """A worker of a synthetic data set computes only its shard (not the whole set, as every rank
    did before), and those rows equal the same rows of the whole generated set."""
    from recsys.config import SyntheticConfig
    from recsys.data.input.synthetic import SyntheticRows, generate

    cfg = SyntheticConfig(num_samples=5_000, seed=3)
    tables = [50, 60, 70]
    whole = generate(cfg, 2, tables).columns()

    class Spied(SyntheticRows):
        def read(self, start: int, stop: int):
            spans.append((start, stop))
            return super().read(start, stop)

    for rank in range(2):
        spans: list[tuple[int, int]] = []
        rows = Spied(cfg, 2, tables)
        s = TrainStream(
            rows, rank=rank, world_size=2, batch_size=8, seed=0, shuffle=True,
            layout=SparseLayout(["a", "b", "c"], tables),
        )  # fmt: skip
        start, stop = shard_range(len(rows), rank, 2)
        assert spans == [(start, stop)]  # generated once, its own rows only
        np.testing.assert_array_equal(s.shard.read(0, stop - start).dense, whole.dense[start:stop])
        np.testing.assert_array_equal(
            s.shard.read(0, stop - start).sparse, np.asarray(whole.sparse[start:stop])
        )
