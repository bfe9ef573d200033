"""``in_lanes``: items a few at a time in threads (the references side by side, a retrain's
trainings at once)."""

from __future__ import annotations

import threading
import time

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


def test_without_the_caller_every_item_runs_in_a_lane_of_its_own():
    """``caller=False``: the caller's thread only waits (Ray Train's ``fit()`` in the main thread
    would take its SIGINT); ``keep_going=False``: after an error no item starts."""
    where: list[str] = []
    in_lanes(lambda item: where.append(threading.current_thread().name), ["a", "b", "c"],
             together=2, name="retrain", caller=False)  # fmt: skip
    assert len(where) == 3 and set(where) <= {"retrain-0", "retrain-1"}
    ran: list[str] = []
    b_in, a_lane = threading.Event(), []

    def first_fails(item: str) -> None:
        if item == "a":  # fails once b runs beside it
            a_lane.append(threading.current_thread())
            assert b_in.wait(30)
            raise ValueError("a failed")
        if item == "b":  # it ends once a's lane has (its error recorded)
            b_in.set()
            while not a_lane:
                time.sleep(0.01)
            a_lane[0].join(30)
        ran.append(item)

    with pytest.raises(ValueError, match="a failed"):
        in_lanes(first_fails, ["a", "b", "c", "d"], together=2, caller=False, keep_going=False)
    assert ran == ["b"]  # the one running ended; none started after a's error
    ran.clear()
    b_in.clear()
    a_lane.clear()
    with pytest.raises(ValueError, match="a failed"):
        in_lanes(first_fails, ["a", "b", "c", "d"], together=2, caller=False)
    assert sorted(ran) == ["b", "c", "d"]  # going on: every other item


def test_a_ctrl_c_while_the_caller_waits_starts_no_further_item():
    """``caller=False``: a Ctrl-C reaches the main thread while it waits on the lanes; it goes on
    up at once, and once the items running end, none further starts."""
    import _thread
    import signal

    release, started = threading.Event(), []

    def item(name: str) -> None:
        started.append(name)
        if name == "b":  # both lanes busy: the Ctrl-C comes while the caller waits
            _thread.interrupt_main()
        assert release.wait(30)

    saved = signal.signal(signal.SIGINT, signal.default_int_handler)  # (Python's own)
    try:
        with pytest.raises(KeyboardInterrupt):
            in_lanes(item, ["a", "b", "c", "d"], together=2, name="waited", caller=False)
    finally:
        signal.signal(signal.SIGINT, saved)
        release.set()
    deadline = time.monotonic() + 30
    while any(t.name.startswith("waited-") for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sorted(started) == ["a", "b"]  # c and d never started
