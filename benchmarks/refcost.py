"""What successive halving saves on the references, and what it costs them: each reference (LR
and FM) of the shipped own-data space (``search_spaces/clicklogs.yaml``, by its rules) searched
on a log two ways, by the product's own code (``recsys.tune.baselines.search_reference``, its
trials through ``recsys.tune.trial`` into MLflow, as ``recsys-sweep`` runs them):

- **successive halving**: as a sweep with ``--scheduler asha`` runs it: its grid in rounds, every
  point to the first rung, the best third on from their checkpoints to the next (reduction factor
  3, rungs on its own budget), the best point trained to its end kept, its edges walked (each
  step to its end);
- **full grid**: as a sweep with ``--scheduler fifo`` (the default) runs it: every point of the
  grid trained to its end, the same rules otherwise (the same best-of, the same edges walked).

On two logs prepared as ``benchmarks.quality`` prepares them (the product's own preparation):
``planted`` (``recsys.demo.planted``, one task, scored by ``val_auc``) and ``demo``
(``recsys.demo.clicklogs`` through the ``clicklogs`` schema, two tasks, ``val_auc/mean``).

Reported per log and reference: the chosen score each way (the reference's best validation
score, as the sweep reports it: ``done_line``), their difference (halving's minus the full
grid's, signed so that above 0 is better), the trial-seconds each way (the wall seconds of the
reference's Tune trials, from each one's function start to its end: its MLflow run, its data
and model, its training, its checkpoints and the best one's upload; ``trial_s``, one a round,
summed; not the start of its process) and their ratio; also the trainings' own loop seconds
(each point's ``wall_s``, summed) and the reference's wall time.

Goals (``benchmarks.goals``, issue 59): the reference's score under halving within 0.002 of the
full grid's (``halving_score``; better is within), and its trial-seconds at most 0.40x the full
grid's (``halving_cost``).

    .venv/bin/python -m benchmarks refcost [--rows N] [--demo-rows N] [--smoke]
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from typing import Any

from benchmarks.common import table
from benchmarks.goals import HALVING_COST, HALVING_GAP, halving_cost, halving_score, shown
from benchmarks.logs import Log

WAYS = ("asha", "fifo")  # the sweep's scheduler: halving the references, and FIFO (to the end)
NAMES = {"asha": "successive halving", "fifo": "full grid"}


@dataclasses.dataclass
class Way:
    """One reference searched one way: its chosen score and point, and what it cost."""

    score: float  # the chosen point's best validation score (the sweep's objective)
    chosen: str  # its grid values (``Reference.describe``) and the walk's summary
    trials: int  # trainings: the grid's and the walk's
    stopped: int  # stopped at a rung
    seconds: float  # trial-seconds: each round's ``trial_s`` of each run, summed
    loop_s: float  # the trainings' own loop seconds (``wall_s`` of their last report), summed
    wall: float  # the reference's search, first trial's start to last trial's end


def references(log: Log, tmp: str, scheduler: str, workers: int, concurrent: int
               ) -> tuple[dict[str, Way], str]:  # fmt: skip
    """Every reference of ``log``'s space searched as a sweep with ``--scheduler scheduler``
    searches it (on the connected Ray; its own MLflow experiment and sweep folder); returns each
    arch's ``Way`` and the objective's mode."""
    from mlflow.tracking import MlflowClient

    from recsys.runtime.cluster import alive_nodes
    from recsys.tracking.tracker import Tracker
    from recsys.tune import space as spaces
    from recsys.tune.baselines import Run, best_trained, search_reference
    from recsys.tune.results import STOPPED
    from recsys.tune.state import SweepOptions
    from recsys.tune.sweep import budgeted, legacy_tune_output, machine_spec
    from recsys.tune.trial import TrialSpec

    name = f"{log.name}-{scheduler}"
    uri = f"sqlite:///{os.path.join(tmp, 'mlflow.db')}"
    opts = SweepOptions(name=name, storage=os.path.join(tmp, "runs"), tracking_uri=uri,
                        num_workers=workers, cpus_per_worker=0.9, max_concurrent=concurrent,
                        scheduler=scheduler)  # fmt: skip
    space = budgeted(spaces.load(log.space, data=log.prepared), workers)
    tracker = Tracker(uri)
    experiment_id = tracker.experiment(name)
    parent = tracker.parent_run(experiment_id, name)
    spec = TrialSpec(  # as recsys.tune.sweep.run_sweep makes it
        sweep=name, base=space.base.to_dict(), storage=opts.storage, tracking_uri=uri,
        experiment_id=experiment_id, parent_run_id=parent, num_workers=workers, use_gpu=False,
        cpus_per_worker=opts.cpus_per_worker, max_failures=opts.max_failures,
        metric=space.metric, mode=space.mode, constraints=space.constraints,
        machine=machine_spec(opts, alive_nodes()),
    )  # fmt: skip
    run = Run(space, opts, spec, restore=False)
    run.register()
    key = space.objectives[0].key
    client = MlflowClient(uri)
    out = {}
    with legacy_tune_output():
        for arch in space.baselines:
            ref = space.references[arch]
            print(f"{log.name}: {arch} reference, {NAMES[scheduler]}", flush=True)
            frame, walk = search_reference(run, ref)
            best = best_trained(frame, space)
            runs = client.search_runs(
                [experiment_id], "tags.`recsys.kind` = 'baseline'", max_results=1000
            )
            mine = [r for r in runs if r.data.params.get("model.arch") == arch]
            if unended := [r.info.run_id for r in mine if not r.info.end_time]:
                raise RuntimeError(f"{log.name} {arch}: MLflow runs with no end: {unended}")
            ends = [r.info.end_time for r in mine]
            rounds = [m.value for r in mine
                      for m in client.get_metric_history(r.info.run_id, "trial_s")]  # fmt: skip
            params = dict(best["params"]) if best is not None else {}
            chosen = ref.describe(params) if best is not None else "none trained to its end"
            if summary := walk.summary(params or None):
                chosen += f"; {summary}"
            out[arch] = Way(
                score=float(best[key]) if best is not None else math.nan,
                chosen=chosen,
                trials=len(frame),
                stopped=int((frame["status"] == STOPPED).sum()),
                seconds=sum(rounds),
                loop_s=float(frame["wall_s"].sum()),
                wall=(max(ends) - min(r.info.start_time for r in mine)) / 1000,
            )  # fmt: skip
    tracker.finish(parent)
    return out, space.mode


def better(asha: float, full: float, mode: str) -> float:
    """Halving's score minus the full grid's, signed so that above 0 is halving's better."""
    return asha - full if mode == "max" else full - asha


def log_part(log: Log, found: dict[str, dict[str, Way]], mode: str
             ) -> tuple[str, dict[str, float], dict[str, float]]:  # fmt: skip
    """The log's table and its cases' differences and ratios (keyed ``<log> <arch>``)."""
    rows, diffs, ratios = [], {}, {}
    for arch in found["asha"]:
        a, f = found["asha"][arch], found["fifo"][arch]
        d, ratio = better(a.score, f.score, mode), a.seconds / f.seconds
        case = f"the {log.name} {arch.upper()}"
        diffs[case], ratios[case] = d, ratio
        rows.append([
            arch, f"{a.trials} ({a.stopped} stopped at a rung)", f"{f.trials}",
            f"{a.score:.4f}", f"{f.score:.4f}", shown(d, halving_score_of),
            f"{a.seconds:.0f}", f"{f.seconds:.0f}", shown(ratio, halving_cost_of, 2, sign=False),
            f"{a.loop_s:.0f} / {f.loop_s:.0f}", f"{a.wall:.0f} / {f.wall:.0f}",
            a.chosen, f.chosen,
        ])  # fmt: skip
    header = ["reference", "trainings, halving", "full grid", f"chosen {log.metric}, halving",
              "full grid", "difference", "trial-s, halving", "full grid", "ratio",
              "loop s, halving / full", "wall s, halving / full", "chosen, halving",
              "chosen, full grid"]  # fmt: skip
    return table(header, rows), diffs, ratios


def halving_score_of(d: float) -> str:
    return halving_score({"": d})


def halving_cost_of(r: float) -> str:
    return halving_cost({"": r})


def run(rows: int, demo_rows: int, logs: list[str], workers: int = 1, concurrent: int = 2,
        smoke: bool = False) -> str:  # fmt: skip
    """Each log's references searched both ways; the tables and the goals' verdicts."""
    from benchmarks.quality import demo_log, planted_log
    from recsys.runtime.cluster import connect, start_train_coordinator

    if smoke:
        rows, demo_rows = min(rows, 3000), min(demo_rows, 3000)
    t0 = time.perf_counter()
    parts, diffs, ratios = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        connect(None)
        start_train_coordinator()
        try:
            for name in logs:
                log = planted_log(tmp, rows) if name == "planted" else demo_log(tmp, demo_rows)
                found: dict[str, dict[str, Way]] = {}
                mode = "max"
                for way in WAYS:
                    found[way], mode = references(log, tmp, way, workers, concurrent)
                part, d, r = log_part(log, found, mode)
                diffs.update(d)
                ratios.update(r)
                parts.append(f"**{log.name}** ({rows_of(log)}):\n\n{part}")
        finally:
            import ray

            ray.shutdown()
    minutes = (time.perf_counter() - t0) / 60
    verdicts = table(["goal", "figure", "verdict"], [
        [f"score under halving within {HALVING_GAP} of the full grid's (better is within)",
         ", ".join(f"{k} {shown(v, halving_score_of)}" for k, v in diffs.items()),
         halving_score(diffs)],
        [f"trial-seconds under halving at most {HALVING_COST:.2f}x the full grid's",
         ", ".join(f"{k} {shown(v, halving_cost_of, 2, sign=False)}x" for k, v in ratios.items()),
         halving_cost(ratios)],
    ])  # fmt: skip
    head = (f"Each reference of the shipped `clicklogs` space (its rules: LR solved over decades "
            f"of L2, FM by Adam for at most 6 epochs; edges walked), {workers} worker(s) per "
            f"trial, {concurrent} trials at a time, under successive halving and as the full grid; "
            f"{minutes:.1f} min in all.\n\n")  # fmt: skip
    return head + "\n\n".join(parts) + "\n\n" + verdicts


def rows_of(log: Log) -> str:
    """``60,000 training, 7,500 validation, 7,500 test rows`` from the prepared folder."""
    import json

    with open(os.path.join(log.prepared, "meta.json")) as f:
        n: dict[str, Any] = json.load(f)["rows"]
    return (f"{n['train']:,} training, {n['val']:,} validation, {n['test']:,} test rows; "
            f"scored by {log.metric}")  # fmt: skip
