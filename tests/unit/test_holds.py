"""The tests' holds (``recsys.train.worker.hold``): a worker waits after its last report, or
after its checkpoint of one step, only in the runs of the seed named, and never unless asked."""

from __future__ import annotations

import pytest

from recsys.train import worker


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(worker.time, "sleep", slept.append)
    for name in (worker.HOLD_ENV, worker.HOLD_SEED_ENV, worker.HOLD_STEP_ENV):
        monkeypatch.delenv(name, raising=False)
    return slept


def test_no_hold_unless_asked(waits):
    worker.hold(1)
    worker.hold(1, step=200)
    assert waits == []


def test_the_hold_after_training_is_after_the_last_report_only(waits, monkeypatch):
    monkeypatch.setenv(worker.HOLD_ENV, "600")
    worker.hold(1, step=200)  # a checkpoint's report: no
    assert waits == []
    worker.hold(1)  # after the last report
    assert waits == [600.0]


def test_a_hold_at_a_step_is_after_that_checkpoint_in_the_seeds_runs_only(waits, monkeypatch):
    monkeypatch.setenv(worker.HOLD_ENV, "600")
    monkeypatch.setenv(worker.HOLD_STEP_ENV, "200")
    monkeypatch.setenv(worker.HOLD_SEED_ENV, "2")
    worker.hold(1, step=200)  # another seed's run
    worker.hold(2, step=100)  # another step
    worker.hold(2)  # the end: the hold was at a step
    assert waits == []
    worker.hold(2, step=200)
    assert waits == [600.0]
