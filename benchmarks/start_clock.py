"""A Ray Train run's start and end, as its controller sees them: a callback that notes when each
part ended and writes every run's marks to a folder, for the overhead benchmark.

Ray Train makes the callbacks named in ``RAY_TRAIN_CALLBACKS`` first in every run's list, before
its own backend setup (the process group), so the marks split a run the same way for the floor's
empty trials and for ours, with nothing changed in either: ``enable`` sets that variable and
``RECSYS_START_CLOCK_DIR`` before the benchmark starts its local Ray, whose processes inherit
them. The controller imports this module; at module level it imports only the standard library
and Ray Train's callback classes.

Marks (``time.time()`` in the controller; one file per run, ``<run name>.json``):

- ``controller``: the controller actor runs (its process started, Ray Train imported);
- ``group_begin``: it starts a worker group;
- ``workers``: the worker actors are up (placement group ready, processes started);
- ``context``: their train contexts are set, before Ray's backend setup;
- ``launched``: the process group is made (``TorchConfig``'s backend) and the train function
  launched on every worker;
- ``last_report``: the latest report the controller took;
- ``shutdown_begin``, ``shutdown_end``: the worker group is shut down.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)

DIR_ENV = "RECSYS_START_CLOCK_DIR"
CALLBACKS_ENV = "RAY_TRAIN_CALLBACKS"
NAME = "benchmarks.start_clock.StartClock"

# a run's parts: (name, from mark, to mark); "" is the trial's fit() call (its start or return)
PARTS = [
    ("fit() to its controller running", "", "controller"),
    ("the controller to its worker group's start", "controller", "group_begin"),
    ("the worker actors (placement, processes)", "group_begin", "workers"),
    ("their train contexts", "workers", "context"),
    ("the process group, the function launched", "context", "launched"),
    ("the last report to the group's shutdown", "last_report", "shutdown_begin"),
    ("the group's shutdown", "shutdown_begin", "shutdown_end"),
    ("the shutdown to fit()'s return", "shutdown_end", ""),
]


class StartClock(ControllerCallback, WorkerGroupCallback, ReportCallback):
    """Notes the time of each part of a run (the module's docstring lists them)."""

    def __init__(self) -> None:
        self.folder = os.environ.get(DIR_ENV, "")
        self.marks: dict[str, float] = {}
        self.name = ""

    def _mark(self, key: str, again: bool = False) -> None:
        if again or key not in self.marks:
            self.marks[key] = time.time()

    def after_controller_start(self, train_run_context: Any) -> None:
        self._mark("controller")
        self.name = train_run_context.get_run_config().name

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        self._mark("group_begin")

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        self._mark("workers")
        return {}

    def after_worker_group_start(self, worker_group: Any) -> None:
        self._mark("context")

    def after_worker_group_training_start(self, worker_group: Any) -> None:
        self._mark("launched")

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self._mark("last_report", again=True)

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        self._mark("shutdown_begin")

    def after_worker_group_shutdown(self, worker_group_context: Any) -> None:
        self._mark("shutdown_end")
        if self.folder and self.name:
            os.makedirs(self.folder, exist_ok=True)
            with open(os.path.join(self.folder, f"{self.name}.json"), "w") as f:
                json.dump(self.marks, f)


def enable(folder: str) -> None:
    """Every Ray Train run of a Ray started after this (by this process) writes its marks to
    ``folder``."""
    os.environ[DIR_ENV] = folder
    named = [n for n in os.environ.get(CALLBACKS_ENV, "").split(",") if n.strip()]
    if NAME not in named:
        os.environ[CALLBACKS_ENV] = ",".join([*named, NAME])


def read(folder: str) -> list[dict[str, float]]:
    """Every run's marks in ``folder``."""
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                out.append(json.load(f))
    return out


def parts(marks: dict[str, float], fit: tuple[float, float]) -> dict[str, float]:
    """A run's ``PARTS`` in seconds, from its marks and its trial's ``fit`` (start, return)."""
    at = {**marks, "": fit[0]}
    return {name: (at[b] if b else fit[1]) - at[a] for name, a, b in PARTS
            if (not a or a in at) and (not b or b in at)}  # fmt: skip


def medians(runs: list[dict[str, float]], fits: list[tuple[float, float]]) -> dict[str, float]:
    """The median of each part over the ``fits`` (start, return) of a kind of trial: each fit's
    run is the one whose controller came up during it; a fit without one is left out."""
    found = []
    for fit in fits:
        run = next((m for m in runs if fit[0] <= m.get("controller", -1.0) <= fit[1]), None)
        if run is not None:
            found.append(parts(run, fit))
    return {name: statistics.median(p[name] for p in found if name in p)
            for name, _, _ in PARTS if any(name in p for p in found)}  # fmt: skip
