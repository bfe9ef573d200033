"""Orchestration overhead: a sweep of short trials on a local Ray, its wall time split into Ray
start, per-trial worker-group start (processes, imports, process group), setup (data, planning,
sharding), training, evaluation, checkpointing and teardown; and the share of the sweep's wall time
spent in training steps. Timestamps come from the trials' MLflow runs."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from typing import Any

from mlflow.tracking import MlflowClient

from benchmarks.common import table
from recsys.cluster import connect
from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep
from recsys.tune.tracking import Tracker

PHASES = ["worker start", "setup", "train", "eval", "checkpoint", "teardown", "overhead"]


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


def run(trials: int, steps: int, space: str = "default") -> str:
    t0 = time.perf_counter()
    connect(None)
    ray_start = time.perf_counter() - t0
    loaded = spaces.load(space, smoke=True)
    loaded = dataclasses.replace(loaded, base=loaded.base.with_overrides({"train.steps": steps}))
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        opts = SweepOptions(
            name="bench", storage=f"{tmp}/runs", tracking_uri=uri, num_samples=trials
        )
        t0 = time.perf_counter()
        run_sweep(loaded, opts, Tracker(uri), restore=False)
        wall = time.perf_counter() - t0
        client = MlflowClient(uri)
        exp_id = Tracker(uri).experiment("bench", None)
        runs = client.search_runs([exp_id], "tags.`recsys.kind` = 'trial'")
        per_trial = [phases(r.data.metrics) for r in runs]
    rows: list[list[Any]] = [["Ray start (once)", ray_start, "-"]]
    for p in [*PHASES, "wall"]:
        vals = [t[p] for t in per_trial]
        rows.append(
            [f"per trial: {p}", statistics.median(vals), f"{min(vals):.1f}-{max(vals):.1f}"]
        )
    train_total = sum(t["train"] for t in per_trial)
    rows.append(["sweep wall time", wall, "-"])
    rows.append(
        ["share of sweep wall time in training steps", f"{100 * train_total / wall:.1f}%", "-"]
    )
    head = f"{len(per_trial)} trials of the `{space}` smoke config at {steps} steps, 2 workers\n\n"
    return head + table(["what", "seconds (median)", "range"], rows)
