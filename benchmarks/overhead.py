"""Orchestration overhead per trial, against Ray Train's own floor, in one run.

Ours: a sweep of short trials on a local Ray, each trial's wall time (around ``trainer.fit()``)
split into worker-group start (processes, imports, process group), setup (data, planning,
sharding), training, evaluation, checkpointing and teardown (timestamps from its MLflow run); its
overhead is the wall time minus training and evaluation. The goal (``goals.trial_overhead``) is
judged on the ratio of the mean overhead to the floor's mean trial, with its 95% interval from
both samples' spread.

The floor: the same number of Tune trials (Tune set as ours: one at a time, a finished trial's
actor reused for the next), each fitting a ``TorchTrainer`` with the same workers and resources
whose function only imports torch (and, second variant, TorchRec and FBGEMM too) and
reports once: what any Ray Train trial costs before it does work. ``ours / floor`` compares the
overhead with the floor that imports TorchRec.

Both kinds of trial are also split as Ray Train's controller sees them (``benchmarks.start_clock``:
its controller up, the worker actors, their train contexts, the process group, the shutdown),
the same marks for the floor's runs and ours: the floor's own parts.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from typing import Any

from mlflow.tracking import MlflowClient

from benchmarks import goals, start_clock
from benchmarks.common import table
from benchmarks.goals import Interval
from recsys.runtime.cluster import connect
from recsys.tracking.tracker import Tracker
from recsys.tune import space as spaces
from recsys.tune.space import Confirm
from recsys.tune.sweep import SweepOptions, legacy_tune_output, run_sweep
from recsys.tune.trial import reuse_actors

PHASES = ["worker start", "setup", "train", "eval", "checkpoint", "teardown", "overhead", "wall"]


def phases(m: dict[str, float]) -> dict[str, float]:
    """One trial's phases in seconds, from its MLflow metrics."""
    start = m["t_worker_start"] - m["trial_fit_start"]
    teardown = m["trial_fit_end"] - m["t_report"]
    wall = m["trial_fit_end"] - m["trial_fit_start"]
    return {
        "worker start": start,
        "setup": m["setup_s"],
        "train": m["train_s"],
        "eval": m["eval_s"],
        "checkpoint": m["ckpt_s"],
        "teardown": teardown,
        "overhead": wall - m["train_s"] - m["eval_s"],
        "wall": wall,
    }


def floor(
    trials: int, torchrec: bool, tmp: str, cpus: float = 0.95, workers: int = 2
) -> list[dict[str, float]]:
    """Per-trial figures of ``trials`` empty Ray Train trials of ``workers`` workers, run as Tune
    trials like ours."""
    from ray import tune

    from benchmarks.floor import floor_trial

    trainable = tune.with_resources(
        tune.with_parameters(floor_trial, storage=f"{tmp}/floor", cpus=cpus, workers=workers),
        {"CPU": 0.1},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"torchrec": torchrec},
        tune_config=tune.TuneConfig(
            num_samples=trials, max_concurrent_trials=1, reuse_actors=reuse_actors()
        ),  # Tune's settings as ours
        run_config=tune.RunConfig(storage_path=f"{tmp}/tune", verbose=0),
    )
    with legacy_tune_output():
        grid = tuner.fit()
    return [dict(grid[i].metrics or {}) for i in range(len(grid))]


def fits(rows: list[dict[str, float]], start: str, end: str) -> list[tuple[float, float]]:
    """Each trial's ``fit()`` (start, return), by its metrics' keys."""
    return [(r[start], r[end]) for r in rows if start in r and end in r]


def ours(
    trials: int, steps: int, space: str, tmp: str, workers: int = 2
) -> tuple[list[dict[str, float]], float, list[tuple[float, float]]]:
    loaded = spaces.load(space, smoke=True)
    base = loaded.base.with_overrides({"train.steps": steps})
    loaded = dataclasses.replace(loaded, base=base, baselines=[], confirm=Confirm(0, 0))  # search
    uri = f"sqlite:///{tmp}/mlflow.db"
    opts = SweepOptions(name="bench", storage=f"{tmp}/runs", tracking_uri=uri, num_samples=trials,
                        num_workers=workers)  # fmt: skip
    t0 = time.perf_counter()
    run_sweep(loaded, opts, Tracker(uri), restore=False)
    wall = time.perf_counter() - t0
    client = MlflowClient(uri)
    exp_id = Tracker(uri).experiment("bench", None)
    runs = client.search_runs([exp_id], "tags.`recsys.kind` = 'trial'")
    metrics = [r.data.metrics for r in runs]
    return [phases(m) for m in metrics], wall, fits(metrics, "trial_fit_start", "trial_fit_end")


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows and key in rows[0] else float("nan")


def cells(split: list[dict[str, float]], name: str) -> list[Any]:
    """A part's medians: ours, its range (none), the floor's two kinds."""
    ours_s, bare, with_torchrec = (s.get(name, float("nan")) for s in split)
    return [ours_s, "-", bare, with_torchrec]


def run(trials: int, steps: int, space: str = "default", workers: int = 2) -> str:
    """``workers`` per trial, ours and the floor's: 2 (Ray Train) or 1 (ours trains in its Tune
    trial, ``recsys.train.inline``; the floor is still an empty Ray Train trial)."""
    with tempfile.TemporaryDirectory() as tmp:
        start_clock.enable(f"{tmp}/marks")  # (before Ray starts: its processes inherit it)
        t0 = time.perf_counter()
        connect("local")
        ray_start = time.perf_counter() - t0
        bare = floor(trials, torchrec=False, tmp=tmp, workers=workers)
        with_torchrec = floor(trials, torchrec=True, tmp=tmp, workers=workers)
        per_trial, sweep_wall, our_fits = ours(trials, steps, space, tmp, workers)
        marks = start_clock.read(f"{tmp}/marks")
    split = [start_clock.medians(marks, f) for f in
             (our_fits, fits(bare, "t_fit_start", "t_fit_end"),
              fits(with_torchrec, "t_fit_start", "t_fit_end"))]  # fmt: skip
    rows: list[list[Any]] = [["Ray start (once)", ray_start, "-", "-", "-"]]
    for p in PHASES:
        vals = [t[p] for t in per_trial]
        rows.append(
            [
                f"per trial: {p}",
                statistics.median(vals),
                f"{min(vals):.1f}-{max(vals):.1f}",
                _median(bare, p),
                _median(with_torchrec, p),
            ]
        )
    rows.append(
        [
            "per trial: imports (floor)",
            "-",
            "-",
            _median(bare, "imports"),
            _median(with_torchrec, "imports"),
        ]
    )
    for name, _, _ in start_clock.PARTS:  # as the controller sees them
        rows.append([f"per trial, controller's view: {name}", *cells(split, name)])
    train_total = sum(t["train"] for t in per_trial)
    rows.append(["sweep wall time (ours)", sweep_wall, "-", "-", "-"])
    rows.append(
        [
            "share of sweep wall time in training steps",
            f"{100 * train_total / sweep_wall:.1f}%",
            "-",
            "-",
            "-",
        ]
    )
    ours_s = [t["overhead"] for t in per_trial]
    floor_s = [t["wall"] for t in with_torchrec if "wall" in t]
    r = Interval.ratio(ours_s, floor_s)
    head = (
        f"{len(per_trial)} trials of the `{space}` smoke config at {steps} steps, {workers} "
        f"worker(s){' (trained in their Tune trials)' if workers == 1 else ''}; the floor: "
        f"{trials} empty {workers}-worker Ray Train trials (Tune trials, same resources, Tune's "
        "actors reused as ours). "
        f"**Ours / floor (mean per-trial overhead / the mean empty trial with TorchRec): "
        f"{r.mean:.3f}x, 95% interval {r.low:.3f}..{r.high:.3f}** (ours, s: "
        f"{', '.join(f'{v:.2f}' for v in ours_s)}; the floor's, s: "
        f"{', '.join(f'{v:.2f}' for v in floor_s)}): "
        f"{goals.trial_overhead(ours_s, floor_s)} (goal {goals.TRIAL_OVERHEAD}x)\n\n"
    )
    header = ["what", "ours, seconds (median)", "ours range", "floor: torch", "floor: + TorchRec"]
    return head + table(header, rows)
