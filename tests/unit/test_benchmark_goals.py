"""Each goal's function in ``benchmarks.goals`` judges by its stated rule: an interval that
crosses the goal is never met; a figure at a rounded boundary prints with the digits its verdict
needs; a comparison says what it is against."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from benchmarks import goals
from benchmarks.goals import Interval

NAN = math.nan


def test_an_interval_that_crosses_the_goal_is_not_met() -> None:
    assert goals.interval_at_least(Interval(0.02, 0.011, 0.03), 0.01) == "met"
    assert goals.interval_at_least(Interval(0.0121, 0.0047, 0.0196), 0.01) == (
        "not met: the 95% interval +0.0047..+0.0196 crosses the goal"
    )
    assert goals.interval_at_least(Interval(0.009, 0.005, 0.013), 0.01) == "missed"
    assert goals.interval_at_least(Interval(0.02, NAN, NAN), 0.01).startswith("not met")
    assert goals.interval_at_least(Interval(0.01, 0.01, 0.02), 0.01) == "met"  # at or above
    assert goals.interval_at_least(Interval(0.01, 0.0, 0.02), 0.0, strict=True) == (
        "not met: the 95% interval +0.0000..+0.0200 crosses the goal"
    )


def test_the_trial_overhead_is_met_only_with_its_whole_interval_at_or_below_the_goal() -> None:
    assert goals.interval_at_most(Interval(1.0, 0.95, 1.1), 1.1) == "met"  # at or below
    assert goals.interval_at_most(Interval(1.05, 0.98, 1.12), 1.1) == (
        "not met: the 95% interval 0.980..1.120 crosses the goal"
    )
    assert goals.interval_at_most(Interval(1.14, 1.1, 1.2), 1.1) == "missed"
    assert goals.interval_at_most(Interval(1.0, NAN, NAN), 1.1).startswith("not met")
    assert goals.interval_at_most(Interval(1.09, 1.08, 1.1004), 1.1) == (
        "not met: the 95% interval 1.080..1.1004 crosses the goal"  # never "..1.100 crosses"
    )
    floor = [10.0, 10.1, 9.9, 10.0]
    assert goals.trial_overhead([10.2, 10.3, 10.4, 10.3], floor) == "met"
    assert goals.trial_overhead([10.0, 11.6, 10.1, 10.5], floor).startswith("not met")
    assert goals.trial_overhead([11.0, 12.0, 11.4, 11.2], floor) == "missed"
    # the floor's own spread widens the interval: the same trials against a noisier floor
    assert goals.trial_overhead([10.4, 10.5, 10.6, 10.5], floor) == "met"
    assert goals.trial_overhead([10.4, 10.5, 10.6, 10.5], [9.0, 11.0, 9.5, 10.5]).startswith(
        "not met"
    )


def test_a_ratio_of_means_has_the_delta_methods_welch_interval() -> None:
    """``Interval.ratio`` against a plain computation: the ratio of the means, its relative
    standard error from both samples, Student's t at Welch's degrees of freedom (scipy)."""
    import statistics

    from scipy import stats

    num, den = [11.2, 11.9, 11.5, 12.3, 11.7], [10.1, 10.6, 9.8]
    r = statistics.fmean(num) / statistics.fmean(den)
    a = statistics.variance(num) / (5 * statistics.fmean(num) ** 2)
    b = statistics.variance(den) / (3 * statistics.fmean(den) ** 2)
    df = (a + b) ** 2 / (a**2 / 4 + b**2 / 2)
    half = stats.t.ppf(0.975, df) * r * (a + b) ** 0.5
    got = Interval.ratio(num, den)
    assert (got.mean, got.low, got.high) == pytest.approx((r, r - half, r + half))
    assert math.isnan(Interval.ratio(num, [10.0]).low) and math.isnan(Interval.ratio([], den).mean)


def test_the_interval_is_students_t_of_the_seeds() -> None:
    d = Interval.of([0.01, 0.02, 0.03])
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t(0.975, 2) x std / sqrt(n)
    assert math.isclose(d.mean, 0.02) and math.isclose(d.low, 0.02 - half)
    assert math.isclose(d.high, 0.02 + half)
    one = Interval.of([0.01])
    assert one.mean == 0.01 and math.isnan(one.low) and math.isnan(one.high)


def test_the_sequences_goal_from_its_seeds() -> None:
    """The planted history log's per-seed test AUCs (sum, attention) as BENCHMARKS.md records
    them: a mean above the goal, an interval across it."""
    sums, attention = [0.6821, 0.6792, 0.6760], [0.6923, 0.6898, 0.6916]
    d = Interval.of([a - s for a, s in zip(attention, sums, strict=True)])
    assert f"{d.mean:+.4f} {d.low:+.4f} {d.high:+.4f}" == "+0.0121 +0.0047 +0.0196"
    assert goals.pooling_gain(d).startswith("not met: the 95% interval +0.0047..+0.0196")


def test_the_lr_reference_is_within_the_tolerance_on_either_side() -> None:
    """As ``tests/distributed/test_reference_quality.py`` holds the references: the LR within
    0.005 of scikit-learn's on either side, the FM not more than 0.005 below the plain FM."""
    assert goals.lr_reference(-0.0007) == "met"
    assert goals.lr_reference(0.005) == "met"
    assert goals.lr_reference(0.6646 - 0.6595) == "missed"  # +0.0051, the demo log's LR
    assert goals.lr_reference(-0.0051) == "missed"
    assert goals.fm_reference(0.0051) == "met"
    assert goals.fm_reference(-0.0051) == "missed"
    planted, demo = (0.6881, 0.6888), (0.6646, 0.6595)
    assert goals.references({"planted": planted, "demo": demo}, {"demo": (0.6460, 0.6478)}) == (
        "met for the planted LR and the demo FM; missed for the demo LR"
    )


def test_a_figure_at_a_boundary_prints_the_digits_its_verdict_needs() -> None:
    within = goals.lr_reference
    assert goals.shown(0.005031, within) == "+0.00503"  # +0.0050 would read as within
    assert goals.shown(0.0049, within) == "+0.0049"
    assert goals.shown(-0.0007, within) == "-0.0007"
    share = lambda x: goals.at_least(x, 0.9)  # noqa: E731
    assert goals.shown(0.868, share, 1, sign=False, percent=True) == "86.8%"
    assert goals.shown(0.89996, share, 1, sign=False, percent=True) == "89.996%"


def test_sweep_efficiency_is_judged_against_the_fifo_orders_own_time() -> None:
    """With the same seed, ASHA samples the FIFO sweep's order: 0.29x of the FIFO wall where the
    FIFO order itself found its best at 0.31x is no saving of ASHA's."""
    fifo = [60.0, 254.0, 638.0]  # seconds the FIFO sweep's own order took to its best
    assert goals.sweep_efficiency({"ASHA": [48.0, 237.0, 626.0]}, fifo) == "missed"
    assert goals.sweep_efficiency({"fast": [25.0, 120.0, 400.0]}, fifo) == "met"
    assert math.isclose(goals.sweep_ratio([48.0, 237.0, 626.0], fifo), 237 / 254)
    assert goals.sweep_ratio([NAN, NAN, 10.0], fifo) == math.inf  # a miss counts as the worst
    assert goals.sweep_efficiency({"a": [25.0, 120.0, 300.0], "b": [NAN, NAN, 1.0]}, fifo) == (
        "met by a; missed by b"
    )


def test_preprocessing_scaling_is_said_against_one_ray_worker_and_one_process() -> None:
    two = {"the shipped schema": 177_522.0, "hashed ids": 343_839.0}
    ray = {"the shipped schema": 100_279.0, "hashed ids": 193_050.0}
    process = {"the shipped schema": 101_752.0, "hashed ids": 213_547.0}
    assert goals.preprocess_scaling(two, ray, process) == (
        "met against one Ray worker; against one process: met for the shipped schema, missed "
        "for hashed ids"
    )
    assert goals.preprocess_scaling(two, ray, ray) == (
        "met against one Ray worker; met against one process"
    )


def test_experts_meet_the_goal_only_with_every_task_wholly_above_zero() -> None:
    up, across, down = (
        Interval(0.01, 0.002, 0.02),
        Interval(0.01, -0.002, 0.02),
        Interval(-0.01, -0.02, 0.001),
    )
    assert goals.experts_beat_shared({"a": [up, up], "b": [down, down]}) == "met"
    assert goals.experts_beat_shared({"a": [up, down], "b": [down, up]}) == "missed"
    assert goals.experts_beat_shared({"a": [up, across], "b": [down, up]}).startswith("not met")


def test_the_lr_reference_is_judged_either_side_of_scikit_learns() -> None:
    assert goals.lr_reference_val(0.6301, 0.6286) == "met"
    assert goals.lr_reference_val(0.6257, 0.6286) == "met"  # below, within 0.003
    assert goals.lr_reference_val(0.5862, 0.6286) == "missed"
    assert goals.lr_reference_val(0.6330, 0.6286) == "missed"  # above by more is no optimum
    assert goals.refit_beats_lr(0.6930, 0.6617) == "met"
    assert goals.refit_beats_lr(0.6600, 0.6617) == "missed"


def test_the_time_walk_is_judged_per_period_and_by_its_interval() -> None:
    assert goals.retrain_keeps_up([-0.004, 0.01], 0.08) == "met"
    assert goals.retrain_keeps_up([-0.006, 0.01], 0.08) == "missed in AUC; met in compute"
    assert goals.retrain_keeps_up([0.0], 0.2) == "met in AUC; missed in compute"
    above, across = goals.Interval(0.71, 0.705, 0.715), goals.Interval(0.71, 0.69, 0.73)
    assert goals.retrain_beats_frozen({3: (above, 0.70), 4: (above, 0.70)}) == "met"
    assert goals.retrain_beats_frozen({3: (above, 0.70), 4: (across, 0.70)}) == (
        "met in period 3; not met in period 4"
    )
    assert goals.retrain_beats_frozen({3: (above, 0.72)}) == "missed"
    assert goals.retrain_beats_frozen({}) == "missed"


def test_the_first_sweep_is_judged_by_its_wall_seconds() -> None:
    assert goals.quickstart(300.0) == "met"
    assert goals.quickstart(300.5) == "missed"


def test_references_under_halving_are_judged_by_score_and_trial_seconds() -> None:
    assert goals.halving_score({"the planted LR": 0.0, "the demo FM": -0.002}) == "met"
    assert goals.halving_score({"the planted LR": 0.004}) == "met"  # better than the full grid
    assert goals.halving_score({"the planted LR": -0.0021, "the demo FM": 0.001}) == (
        "missed for the planted LR; met for the demo FM"
    )
    assert goals.halving_cost({"the planted LR": 0.40, "the demo FM": 0.1}) == "met"
    assert goals.halving_cost({"the planted LR": 0.41, "the demo FM": 0.1}) == (
        "missed for the planted LR; met for the demo FM"
    )


def test_cases_say_each_verdict_with_its_labels() -> None:
    assert goals.cases([("a", "met"), ("b", "met")]) == "met"
    assert goals.cases([("in time order", "met"), ("with shuffling", "missed")]) == (
        "met in time order; missed with shuffling"
    )
    pairs = [("x", "met"), ("y", "missed"), ("z", "met")]
    assert goals.cases(pairs, prefix="for ") == "met for x and z; missed for y"


def test_the_goals_import_only_the_standard_library() -> None:
    """``benchmarks.goals`` imports only the standard library at import time: every benchmark
    and the summary can import it without torch or Ray."""
    text = Path(goals.__file__).read_text()
    top = [line for line in text.splitlines() if re.match(r"(from|import) ", line)]
    assert all(not re.search(r"\b(torch|ray|numpy|recsys)\b", line) for line in top), top
