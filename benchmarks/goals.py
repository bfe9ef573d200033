"""One function per benchmark goal: each takes the figures a benchmark produces and returns its
verdict's first words, by the rule in its docstring. The benchmarks print these verdicts and
BENCHMARKS.md's Summary table is generated from them (``benchmarks.summary``); no verdict is typed.

The words: ``met``; ``missed``; ``not met: ...`` where a mean meets the goal but its 95% interval
over the seeds crosses it (an interval that crosses the goal is never met); ``measured`` where a
row has no goal. A goal judged on several cases says each (``met in time order; missed with
shuffling``). Figures are judged as given, unrounded; ``shown`` prints one with enough digits
that the printed figure gives the same verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MET, MISSED, MEASURED = "met", "missed", "measured"


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its 95% interval (Student's t, as the sweep's seed check computes
    it); ``low`` and ``high`` NaN from one seed."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Interval:
        from recsys.tune.confirm import spread

        if len(values) < 2:
            return cls(float(statistics.fmean(values)), math.nan, math.nan)
        s = spread("", list(values))
        return cls(s.mean, s.low, s.high)

    @classmethod
    def ratio(cls, num: Sequence[float], den: Sequence[float]) -> Interval:
        """``mean(num) / mean(den)`` of two independent samples, with its 95% interval: the
        ratio's standard error by the delta method (each sample's relative variance of its
        mean, added), Student's t at Welch's degrees of freedom; NaN bounds where either sample
        has fewer than 2 values, a NaN mean where either has none."""
        from recsys.tune.confirm import _t

        if not num or not den:
            return cls(math.nan, math.nan, math.nan)
        mn, md = statistics.fmean(num), statistics.fmean(den)
        r = mn / md
        if len(num) < 2 or len(den) < 2:
            return cls(r, math.nan, math.nan)
        a = statistics.variance(num) / (len(num) * mn**2)
        b = statistics.variance(den) / (len(den) * md**2)
        if a + b == 0.0:
            return cls(r, r, r)
        df = (a + b) ** 2 / (a**2 / (len(num) - 1) + b**2 / (len(den) - 1))
        half = _t(0.975, df) * r * math.sqrt(a + b)
        return cls(r, r - half, r + half)


def shown(
    value: float,
    judge: Callable[[float], str],
    digits: int = 4,
    sign: bool = True,
    percent: bool = False,
) -> str:
    """``value`` with at least ``digits`` decimals (of a percentage, ``percent``), and more until
    the printed figure read back gets ``judge``'s verdict of the unrounded value (+0.005031
    against "within 0.005" prints +0.00503, not +0.0050)."""
    want = judge(value)
    for d in range(digits, digits + 8):
        text = f"{value:{'+' if sign else ''}.{d}{'%' if percent else 'f'}}"
        back = float(text.rstrip("%")) / 100 if percent else float(text)
        if judge(back) == want:
            return text
    return repr(value)


def at_most(value: float, goal: float) -> str:
    return MET if value <= goal else MISSED


def at_least(value: float, goal: float) -> str:
    return MET if value >= goal else MISSED


def interval_at_least(d: Interval, goal: float, strict: bool = False) -> str:
    """``met`` where the whole interval is at or above ``goal`` (above, ``strict``); ``missed``
    where the mean is not; otherwise ``not met``: the interval crosses the goal (or there is
    none, from one seed)."""

    def ok(x: float) -> bool:
        return x > goal if strict else x >= goal

    if not ok(d.mean):
        return MISSED
    if math.isnan(d.low):
        return "not met: one seed, no interval"
    if ok(d.low):
        return MET
    return f"not met: the 95% interval {d.low:+.4f}..{d.high:+.4f} crosses the goal"


def interval_at_most(d: Interval, goal: float) -> str:
    """``met`` where the whole interval is at or below ``goal``; ``missed`` where the mean is
    not; otherwise ``not met``: the interval crosses the goal (or there is none, from one
    sample)."""
    if d.mean > goal:
        return MISSED
    if math.isnan(d.high):
        return "not met: one sample, no interval"
    if d.high <= goal:
        return MET
    high = shown(d.high, lambda v: MET if v <= goal else MISSED, digits=3, sign=False)
    return f"not met: the 95% interval {d.low:.3f}..{high} crosses the goal"


def cases(verdicts: Sequence[tuple[str, str]], sep: str = "; ", prefix: str = "") -> str:
    """One verdict from several ``(label, verdict)`` cases: the verdict where they agree, else
    each verdict with the labels it holds for, in order of first appearance (``met in time
    order; missed with shuffling``), each group's labels after ``prefix``."""
    words = [v for _, v in verdicts]
    if len(set(words)) == 1:
        return words[0]
    groups: dict[str, list[str]] = {}
    for label, v in verdicts:
        groups.setdefault(v, []).append(label)
    return sep.join(f"{v} {prefix}{_and(labels)}" for v, labels in groups.items())


def _and(labels: Sequence[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def measured(**figures: object) -> str:
    """A row with no goal: its figures are reported, never judged."""
    return MEASURED


# --- speed --------------------------------------------------------------------------------------

STEP_FLOOR = 1.1


def step_vs_floor(ratios: Mapping[str, float]) -> str:
    """Training step against the machine: each interaction's (``dot``, ``cat``, ...; QR off,
    Criteo-shaped, 1 thread) step time over the dense-GEMM floor's at most 1.1x."""
    return cases([(f"`{op}`", at_most(r, STEP_FLOOR)) for op, r in ratios.items()], prefix="for ")


TRIAL_OVERHEAD = 1.1  # per-trial overhead over an empty Ray Train trial's, at most (issue 59)


def trial_overhead(ours: Sequence[float], floor: Sequence[float]) -> str:
    """Per-trial overhead over an empty Ray Train trial of as many workers, with TorchRec: at
    most 1.1x, judged on the ratio of the means (``ours``: each of our trials' overhead in
    seconds; ``floor``: each empty trial's wall) with its 95% interval (``Interval.ratio``: both
    samples' spread): met only where the whole interval is at or below 1.1x."""
    return interval_at_most(Interval.ratio(ours, floor), TRIAL_OVERHEAD)


SWEEP_GOAL = 0.5


def sweep_efficiency(seconds: Mapping[str, Sequence[float]], fifo: Sequence[float]) -> str:
    """Each method's wall time to the seed's random FIFO sweep's best, over the time **the FIFO
    sweep's own order** took to reach that best (``fifo``, per seed), median over the seeds (a
    miss, NaN, counts as the worst): at most 0.5x. Against the FIFO sweep's whole wall instead,
    a method in the same random order would meet the goal wherever that order finds its best
    early: the order's figure, not the method's."""
    verdicts = [(m, at_most(sweep_ratio(s, fifo), SWEEP_GOAL)) for m, s in seconds.items()]
    return cases(verdicts, prefix="by ")


def sweep_ratio(seconds: Sequence[float], fifo: Sequence[float]) -> float:
    """The median over seeds of ``seconds / fifo``, a miss (NaN) the worst (inf)."""
    ratios = [math.inf if math.isnan(s) else s / f for s, f in zip(seconds, fifo, strict=True)]
    return statistics.median(ratios)


# --- data ---------------------------------------------------------------------------------------


def worker_memory_by_days(ratios: Mapping[str, float]) -> str:
    """Worker peak RSS, 8 Terabyte-shaped days over 2, in each read order: at most 1.2x."""
    return cases([(order, at_most(r, 1.2)) for order, r in ratios.items()])


PARSER_ROWS_S = 166_000


def preprocess_rate(rates: Mapping[str, float]) -> str:
    """Criteo text through the one preparation path, per schema: rows/s in one process at least
    the earlier Criteo parser's 166k."""
    return cases([(ids, at_least(r, PARSER_ROWS_S)) for ids, r in rates.items()], prefix="for ")


def preprocess_scaling(
    two: Mapping[str, float], one_ray: Mapping[str, float], one_process: Mapping[str, float]
) -> str:
    """Criteo preparation on 2 Ray worker processes, per schema: rows/s at least 1.7x both one
    Ray worker's (the scaling of Ray's workers) and one process's without Ray (what a user gains
    by 2 workers); said against each."""
    out = []
    for against, base in (
        ("against one Ray worker", one_ray),
        ("against one process", one_process),
    ):
        v = cases([(ids, at_least(two[ids] / base[ids], 1.7)) for ids in two], ", ", "for ")
        out.append(f"{v} {against}" if v in (MET, MISSED) else f"{against}: {v}")
    return "; ".join(out)


def own_data_prepare(one_process_s: float, two_workers_s: float, ray_start_s: float) -> str:
    """Own-data preparation on 2 Ray workers: at least 1.6x faster than one process, as run (a
    local Ray's start included) and with that start subtracted (a Ray already running)."""
    as_run = at_least(one_process_s / two_workers_s, 1.6)
    started = at_least(one_process_s / (two_workers_s - ray_start_s), 1.6)
    return cases([("as run", as_run), ("with Ray's start subtracted", started)])


def preparation_memory(peaks_mib: Sequence[float]) -> str:
    """Peak PSS of every process of a preparation (MiB), for each input size: at most 1.5 GiB."""
    return at_most(max(peaks_mib) / 1024, 1.5)


def multihot_cost(per_id_ratio: float) -> str:
    """A training step's cost per id, bags of mean length 20 over one-hot: at most 1.5x."""
    return at_most(per_id_ratio, 1.5)


def loader_not_bottleneck(loader: float, step: float) -> str:
    """The loader's samples/s above the fastest training step's (``step``)."""
    return MET if loader > step else MISSED


# --- the tracking store under load ----------------------------------------------------------------


def soak_scale(trials: int, driver_kills: int, outages: int, worker_kills: int) -> str:
    """At least 200 trials with 2 driver kills (resumed), a server outage and a worker kill."""
    ok = trials >= 200 and driver_kills >= 2 and outages >= 1 and worker_kills >= 1
    return MET if ok else MISSED


def soak_nothing_lost(trials: int, runs: int, finished: int, problems: int) -> str:
    """One run per trial, each finished, and no problem found in the store's histories."""
    return MET if runs == trials == finished and problems == 0 else MISSED


def soak_driver_memory(at_50: float, at_200: float) -> str:
    """Driver peak memory by 200 finished trials over by 50: at most 1.3x."""
    return at_most(at_200 / at_50, 1.3)


def soak_overhead(soak_s: float, reference_s: float) -> str:
    """Slot-seconds of overhead per trial in the soak over a 16-trial sweep's: at most 1.2x."""
    return at_most(soak_s / reference_s, 1.2)


def export_memory(peak_gib: float, fp32_gib: float) -> str:
    """Peak memory of an INT8 export: at most half the FP32 tables' bytes plus 1 GiB."""
    return at_most(peak_gib, 0.5 * fp32_gib + 1.0)


# --- quality ------------------------------------------------------------------------------------

SHARE = 0.9  # of the way from 0.5 to the oracle's AUC
TOLERANCE = 0.005  # a reference against its independent twin (AUC)
POOLING_GAIN = 0.01  # attention over sum pooling


def beats_plain_mlp(sweep: float, mlp: float) -> str:
    """The sweep's best (served) test AUC at least the independent plain MLP's."""
    return at_least(sweep, mlp)


def oracle_share(sweep: float, oracle: float) -> str:
    """The sweep's best test AUC at least 90% of the way from 0.5 to the oracle's."""
    return at_least((sweep - 0.5) / (oracle - 0.5), SHARE)


def lr_reference(diff: float) -> str:
    """The LR reference's test AUC minus scikit-learn's tuned LR's within 0.005 on either side
    (as ``tests/distributed/test_reference_quality.py`` holds it): one model fitted two ways, so
    far below is a weak bar and far above is not the same model."""
    return MET if abs(diff) <= TOLERANCE else MISSED


LR_VAL_TOLERANCE = 0.003  # the LR reference against scikit-learn's tuned LR (validation AUC)


def lr_reference_val(ours: float, sklearn: float) -> str:
    """The LR reference's validation AUC (``ours``) within 0.003 on either side of
    scikit-learn's tuned LR's (``C`` over decades on the same validation rows): the product's
    LR at its optimum."""
    return MET if abs(ours - sklearn) <= LR_VAL_TOLERANCE else MISSED


def refit_beats_lr(sweep: float, lr: float) -> str:
    """The sweep's best, refitted on training + validation and served, at least scikit-learn's
    tuned LR refitted on the same rows (test AUC): a winner worth serving over the plain recipe."""
    return at_least(sweep, lr)


def fm_reference(diff: float) -> str:
    """The FM reference's test AUC minus the plain-PyTorch FM's not below -0.005 (as
    ``tests/distributed/test_reference_quality.py`` holds it): a weak bar is the risk."""
    return MET if diff >= -TOLERANCE else MISSED


def references(lr: Mapping[str, tuple[float, float]], fm: Mapping[str, tuple[float, float]]) -> str:
    """``lr_reference`` and ``fm_reference`` of each log's ``(reference, independent)`` test
    AUCs, keyed by the log's name."""
    verdicts = [(f"the {log} LR", lr_reference(r - i)) for log, (r, i) in lr.items()]
    verdicts += [(f"the {log} FM", fm_reference(r - i)) for log, (r, i) in fm.items()]
    return cases(verdicts, prefix="for ")


def pooling_gain(diff: Interval) -> str:
    """A pooling's test AUC over sum pooling of the same history (paired over seeds): at least
    +0.01, the whole 95% interval (``interval_at_least``)."""
    return interval_at_least(diff, POOLING_GAIN)


def independent_confirms(diff: float) -> str:
    """The independent models' difference in the product's direction (above 0), or not."""
    return "same direction" if diff > 0 else "not confirmed"


def experts_beat_shared(settings: Mapping[str, Sequence[Interval]]) -> str:
    """Some expert setting beats the shared bottom on every task: each task's paired test-AUC
    difference above 0, the whole 95% interval (``interval_at_least``, strict). A setting misses
    where one task's mean is not above 0; the goal is met by any setting that meets it, missed
    where every setting missed, else not met (an interval crosses 0)."""
    each = [_every_task([interval_at_least(d, 0.0, strict=True) for d in ds])
            for ds in settings.values()]  # fmt: skip
    if MET in each:
        return MET
    return MISSED if all(v == MISSED for v in each) else next(v for v in each if v != MISSED)


def _every_task(verdicts: Sequence[str]) -> str:
    if MISSED in verdicts:
        return MISSED
    return next((v for v in verdicts if v != MET), MET)


RETRAIN_GAP = 0.005  # test AUC a retrained model may trail a new sweep by
RETRAIN_COST = 0.1  # of a new sweep's compute


def retrain_keeps_up(gaps: Sequence[float], cost: float) -> str:
    """The time walk: in every period the test AUC of the retrain's refit (the model it
    registers) minus a new sweep's refit's is at least -0.005, and the retrains' compute at most
    a tenth of the new sweeps' (their trainings' own seconds, all periods)."""
    verdicts = [("in AUC", MET if all(g >= -RETRAIN_GAP for g in gaps) else MISSED),
                ("in compute", MET if cost <= RETRAIN_COST else MISSED)]  # fmt: skip
    return cases(verdicts)


def retrain_beats_frozen(periods: Mapping[int, tuple[Interval, float]]) -> str:
    """The time walk, from its third period on: the picked seeds' test AUC above the frozen
    champion's (one figure: the checkpoint as it is), the whole 95% interval, every period
    (``interval_at_least``, strictly; keyed by period)."""
    if not periods:
        return MISSED
    verdicts = [(str(p), interval_at_least(i, frozen, strict=True).split(":")[0])
                for p, (i, frozen) in sorted(periods.items())]  # fmt: skip
    return cases(verdicts, prefix="in period ")


# --- the first sweep (issue 59) ------------------------------------------------------------------

QUICKSTART_S = 300.0  # the default sweep, start to exit, on 2 cores, at most


def quickstart(seconds: float) -> str:
    """The README's default sweep (``benchmarks.quickstart``), its wall seconds: at most 5 min."""
    return at_most(seconds, QUICKSTART_S)


# --- references under successive halving (issue 59) ---------------------------------------------

HALVING_GAP = 0.002  # a reference's chosen score under halving below the full grid's, at most
HALVING_COST = 0.40  # a reference's trial-seconds under halving over the full grid's, at most


def halving_score(diffs: Mapping[str, float]) -> str:
    """Each reference's chosen score (its best validation score) searched under successive
    halving minus the same reference's with its full grid trained to the end, signed so that
    above 0 is halving's better, keyed by the case (``the planted LR``): within 0.002 on either
    side, or better (at least -0.002)."""
    return cases([(k, at_least(d, -HALVING_GAP)) for k, d in diffs.items()], prefix="for ")


def halving_cost(ratios: Mapping[str, float]) -> str:
    """Each reference's trial-seconds (its trainings' wall seconds, summed) under successive
    halving over its full grid's, keyed by the case: at most 0.40x."""
    return cases([(k, at_most(r, HALVING_COST)) for k, r in ratios.items()], prefix="for ")
