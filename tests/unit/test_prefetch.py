"""The background batch prefetcher: the source's order, its errors in the caller, a clean stop."""

from __future__ import annotations

import itertools

import pytest

from recsys.data.columns import DataError
from recsys.data.input.prefetch import Prefetcher


def test_items_come_in_the_sources_order_and_then_it_ends():
    p = Prefetcher(iter(range(100)), depth=3)
    assert list(itertools.islice(p, 100)) == list(range(100))
    with pytest.raises(StopIteration):
        next(p)
    p.close()


def test_a_source_error_is_raised_in_the_callers_thread():
    def rows():
        yield 1
        raise DataError("day_3_labels.npy: row 7: label must be 0 or 1")

    p = Prefetcher(rows(), depth=2)
    assert next(p) == 1
    with pytest.raises(DataError, match="row 7"):
        next(p)
    p.close()


def test_it_stays_bounded_and_close_stops_an_endless_source():
    made = itertools.count()
    p = Prefetcher(made, depth=2)
    assert next(p) == 0
    p.close()
    assert not p.thread.is_alive()
    # the thread made at most depth + 2 items (queued, in hand, and the one consumed)
    assert next(made) <= 2 + 2 + 1
