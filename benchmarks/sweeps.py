"""Sweep efficiency: how fast a sweep finds a configuration as good as the best of a 16-trial
random FIFO sweep (same space, same synthetic data, same seed), for random search with ASHA (or
Hyperband: ASHA's 3 brackets) and early stopping, for Optuna, and for a grown sweep (8 Optuna
trials, then ``--more 8`` warm-started with them, as ``recsys-sweep --more`` runs it) against
one 16-trial Optuna sweep; wall time and training steps until then, as ratios to the FIFO
sweep's whole run and to the time the FIFO sweep's own order took to reach its best (the goal's
measure, ``benchmarks.goals.sweep_efficiency``: with the same seed random search samples the
same order with or without a scheduler, so a ratio to the FIFO wall is mostly where that order
finds its best). A trial "finds" the target when its best report reaches it; time is when that
trial ended, steps are those trained by every trial that ended by then. The FIFO sweep runs to its
end (it sets the target); the others end once a trial reached the target. A method that never
reached the target counts as the worst in the medians (not left out): a median that falls on a
miss reads ``missed``."""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import table
from benchmarks.goals import SWEEP_GOAL, at_most, shown, sweep_efficiency, sweep_ratio
from recsys.runtime.cluster import connect
from recsys.tune import space as spaces
from recsys.tune.results import trial_frame
from recsys.tune.sweep import SweepOptions, build_tuner, legacy_tune_output
from recsys.tune.trial import TrialSpec

METHODS = [
    ("random, FIFO", "random", "fifo", 0),
    ("random, ASHA + early stopping", "random", "asha", 2),
    ("random, Hyperband + early stopping", "random", "hyperband", 2),
    ("Optuna (TPE), FIFO", "optuna", "fifo", 0),
    ("Optuna, 8 + 8 grown (warm start)", "optuna", "fifo", -1),  # patience -1: grown, none
]


class TargetReached:
    """Ends a sweep once a trial's best report reaches ``target`` (what happens after cannot
    change the time to the target; without it the benchmark would run every sweep to the end)."""

    def __init__(self, key: str, target: float) -> None:
        from ray.tune import Stopper

        class _Stopper(Stopper):  # type: ignore[misc]
            def __init__(self) -> None:
                self.hit = False

            def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
                if result.get(key, float("-inf")) >= target - 1e-12:
                    self.hit = True
                return False

            def stop_all(self) -> bool:
                return self.hit

        self.stopper = _Stopper()


def run_one(
    space: Any,
    search: str,
    scheduler: str,
    patience: int,
    seed: int,
    trials: int,
    tmp: str,
    target: float | None = None,
) -> tuple[list[dict[str, Any]], float, float]:
    """The trials' (end time, steps, best score) and the sweep's start and end times; with a
    ``target``, the sweep ends once a trial reached it. ``patience`` -1: a grown sweep, half the
    trials, then the other half warm-started with them (no patience)."""
    grown = patience < 0
    patience = max(patience, 0)
    s = dataclasses.replace(space, base=space.base.with_overrides({"train.patience": patience}))
    name = f"{search}-{scheduler}-{patience}-{'grown-' if grown else ''}{seed}"
    opts = SweepOptions(
        name=name,
        storage=f"{tmp}/runs",
        tracking_uri=f"sqlite:///{tmp}/m.db",
        num_samples=trials // 2 if grown else trials,
        search=search,
        scheduler=scheduler,
        seed=seed,
    )
    spec = TrialSpec(
        sweep=name,
        base=s.base.to_dict(),
        storage=opts.storage,
        tracking_uri=opts.tracking_uri,
        experiment_id="0",
        parent_run_id="",
        num_workers=2,
        use_gpu=False,
        cpus_per_worker=0.95,
        max_failures=0,
        metric=s.metric,
        mode=s.mode,
    )
    start = time.time()
    with legacy_tune_output():
        stop = None if target is None else TargetReached(f"best_{s.metric}", target).stopper
        results = list(build_tuner(s, opts, spec, restore=False, stop=stop).fit())
        if grown and not (stop is not None and stop.hit):
            first = trial_frame(results, s)
            more = dataclasses.replace(opts, seed=opts.seed + 1)  # (as --more's default seed)
            tuner = build_tuner(s, more, spec, restore=False, stop=stop, growth=1, prior=first)
            results += list(tuner.fit())
    end = time.time()
    out = []
    for result in results:
        m = result.metrics or {}
        out.append(
            {
                "end": m.get("timestamp", end),
                "steps": m.get("step", 0),
                "score": m.get(f"best_{s.metric}", float("nan")),
            }
        )
    return out, start, end


def to_target(rows: list[dict[str, Any]], start: float, target: float) -> tuple[float, float]:
    """Seconds and training steps until the first trial whose best reached ``target`` ended."""
    rows = sorted(rows, key=lambda r: r["end"])
    steps = 0.0
    for r in rows:
        steps += r["steps"]
        if r["score"] >= target - 1e-12:
            return r["end"] - start, steps
    return float("nan"), steps


def median_text(ratios: list[float]) -> str:
    """The median of ``ratios`` with a miss (NaN: the target never reached) counted as the
    worst, not left out; ``missed`` where the median falls on one."""
    worst = sorted(math.inf if math.isnan(r) else r for r in ratios)
    mid = statistics.median(worst)
    return "missed" if math.isinf(mid) else f"{mid:.2f}"


def run(seeds: list[int], trials: int, steps: int, space_name: str = "default") -> str:
    connect("local", log_to_driver=False)
    space = spaces.load(space_name)
    space = dataclasses.replace(space, base=space.base.with_overrides({"train.steps": steps}))
    rows: list[list[Any]] = []
    ratios: dict[str, tuple[list[float], list[float]]] = {m[0]: ([], []) for m in METHODS}
    seconds: dict[str, list[float]] = {m[0]: [] for m in METHODS}  # to the target, per seed
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            fifo = run_one(space, *METHODS[0][1:], seed, trials, tmp)  # type: ignore[misc]
            target = max(r["score"] for r in fifo[0])
            results = {METHODS[0][0]: fifo}
            for label, search, scheduler, patience in METHODS[1:]:
                results[label] = run_one(
                    space, search, scheduler, patience, seed, trials, tmp, target
                )
                print(seed, label, to_target(results[label][0], *results[label][1:2], target))
        fifo_rows, f_start, f_end = fifo
        fifo_wall, fifo_steps = f_end - f_start, sum(r["steps"] for r in fifo_rows)
        fifo_t, _ = to_target(fifo_rows, f_start, target)
        for label, (trial_rows, start, end) in results.items():
            t, n = to_target(trial_rows, start, target)
            best = max(r["score"] for r in trial_rows)
            seconds[label].append(t)
            ratios[label][0].append(t / fifo_wall)
            ratios[label][1].append(n / fifo_steps if t == t else math.nan)  # (a miss: worst)
            rows.append(
                [
                    seed,
                    label,
                    f"{best:.4f}",
                    f"{target:.4f}",
                    f"{t:.0f}",
                    f"{t / fifo_wall:.2f}",
                    f"{t / fifo_t:.2f}",
                    f"{n:.0f}",
                    f"{n / fifo_steps:.2f}",
                    f"{end - start:.0f}",
                ]
            )
    fifo_s = seconds[METHODS[0][0]]
    summary = [[label, median_text(w), own_text(seconds[label], fifo_s), median_text(s)]
               for label, (w, s) in ratios.items()]  # fmt: skip
    goals = [[f"{label}: wall time to the target <= {SWEEP_GOAL}x the FIFO sweep's own time to it",
              own_text(seconds[label], fifo_s), sweep_efficiency({label: seconds[label]}, fifo_s)]
             for label in list(seconds)[1:]]  # fmt: skip
    head = (
        f"`{space_name}` space at {steps} steps, {trials} trials per sweep, 2 workers per trial, "
        f"seeds {seeds}. Target: the best val AUC of the seed's random FIFO sweep.\n\n"
    )
    medians = table(["method", "median wall-time ratio", "median / FIFO's own time to target",
                     "median steps ratio"], summary)  # fmt: skip
    header = [
        "seed",
        "method",
        "best val AUC",
        "target",
        "seconds to target",
        "/ FIFO wall",
        "/ FIFO's own time to target",
        "steps to target",
        "/ FIFO steps",
        "sweep wall s (ends at the target)",
    ]
    verdicts = table(["goal", "figure", "verdict"], goals)
    return head + medians + "\n\n" + table(header, rows) + "\n\n" + verdicts


def own_text(seconds: list[float], fifo: list[float]) -> str:
    """The median over seeds of ``seconds`` over the FIFO sweep's own seconds to the target (a
    miss the worst), as ``sweep_efficiency`` judges it."""
    r = sweep_ratio(seconds, fifo)
    return "missed" if math.isinf(r) else shown(r, lambda x: at_most(x, SWEEP_GOAL), 2, sign=False)
