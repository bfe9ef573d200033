"""``in_lanes``: items a few at a time in threads (the references side by side, a retrain's
trainings at once)."""

from __future__ import annotations

import threading

import pytest

from recsys.runtime.lanes import in_lanes


def test_items_run_side_by_side_and_a_lanes_error_comes_after_all_end():
    both_in = threading.Barrier(2, timeout=30)  # passed only with both lanes inside at once
    ended: list[str] = []

    def one(item: str) -> None:
        if item != "c":  # a and b wait for each other: two lanes at once, or a timeout
            both_in.wait()
        if item == "b":
            raise ValueError("b failed")
        ended.append(item)

    with pytest.raises(ValueError, match="b failed"):
        in_lanes(one, ["a", "b", "c"], together=2)
    assert sorted(ended) == ["a", "c"]  # c ran after b's error, in the lane b left
    order: list[str] = []
    in_lanes(order.append, ["a", "b", "c"], together=1)  # one at a time, in order
    assert order == ["a", "b", "c"]


def test_an_interrupt_in_a_lane_starts_no_further_item():
    started: list[str] = []

    def interrupted(item: str) -> None:
        started.append(item)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the caller's lane: at once
        in_lanes(interrupted, ["a", "b", "c", "d"], together=2)
    assert len(started) <= 2 and "d" not in started  # each lane's first only, then none
