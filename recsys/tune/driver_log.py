"""What a sweep's driver writes to MLflow for its trials, in a thread of its own.

Every report of a trial's training reaches the driver as a Tune result (``ReportToTune``); the
driver logs it to the trial's MLflow run (``recsys.tracking.report.log_report``). A trial that
ASHA stopped is ended by Tune with its actor, before its own bookkeeping: the driver records it
(``stopped``) from what Ray Train persisted. These are writes of one queue, done in order by one
thread (``recsys.tracking.writer.Writer``), so that Tune's loop does not wait for the store at
each result: while the store is down they wait in the driver, tried again until it answers.

A trial's end waits for the writes queued before it (up to ``END_WAIT_S``; not while the store
is unreachable). Tune's experiment state may then record as ended a trial whose writes still
wait; a resumed sweep restores (and ``backfill``s) only unfinished trials, so at its first step
the driver checks each trial that ended before: the reports its run lacks are logged from Ray
Train's, and a stopped trial not recorded is recorded. The experiment's end waits for every
write, up to ``RECSYS_TRACKING_WAIT_S``, then gives up on what is left with a warning.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from ray.tune import Callback

from recsys.runtime import storage
from recsys.tracking.report import log_report
from recsys.tracking.store import WAIT_ENV, short, unreachable
from recsys.tracking.tracker import Tag, Tracker
from recsys.tracking.tune_reports import tune_report
from recsys.tracking.writer import Writer
from recsys.train.results import train_result
from recsys.tune import trial
from recsys.tune.results import STOPPED, point_of
from recsys.tune.search import INFEASIBLE
from recsys.tune.state import unlogged_dir
from recsys.tune.trial import TrialSpec, finish_trial, log_missing

log = logging.getLogger(__name__)

END_WAIT_S = 60.0  # how long a trial's end waits for the writes queued before it
SAY_WAIT_S = 5.0  # the experiment's end says it waits for MLflow after this long


class TrialLog(Callback):  # type: ignore[misc]
    """The driver's MLflow writes for a phase's trials (its Tuner's callback): their reports as
    Tune gets them, their metrics flushed as they end, the trials ASHA stopped recorded, in
    order by a ``Writer``'s thread. ``reports`` and ``stopped`` choose what this callback
    writes (both, but where a resumed sweep's Tuner state names the callbacks of before)."""

    def __init__(
        self, spec: TrialSpec, steps: int, reports: bool = True, stopped: bool = True
    ) -> None:
        self.uri, self.keep = spec.tracking_uri, unlogged_dir(spec.storage, spec.sweep)
        self.experiment_id, self.mode, self.steps = spec.experiment_id, spec.mode, steps
        self.train_storage = storage.join(spec.storage, spec.sweep, "train")
        self.reports, self.stopped = reports, stopped
        self._start()

    def _start(self) -> None:
        self.writer = Writer(self.uri, "report(s) or end(s) of this sweep's trials")
        self._tracker: Tracker | None = None  # (the writer's thread's)
        self._runs: dict[str, str] = {}  # trial id -> its MLflow run (the writer's thread's)
        self._checked = False  # the trials a resumed experiment found ended: checked

    def __getstate__(self) -> dict[str, Any]:  # (Tune pickles its callbacks with the Tuner)
        keep = ("uri", "keep", "experiment_id", "mode", "steps", "train_storage", "reports",
                "stopped")  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    # Tune's callbacks, in its loop: they queue, and only the ends wait

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if not self._checked:
            self._check_ended(trials)

    def _check_ended(self, trials: list) -> None:
        """Once per experiment (at its first step, or at its end for one restored finished):
        the trials an earlier driver saw end (``TERMINATED``; an errored one is run again, and
        backfills itself) checked for what that driver, killed, may not have written."""
        self._checked = True
        ended = {run_key(t): (t.last_result or {}).get("step", 0) for t in trials
                 if t.status == "TERMINATED"}  # fmt: skip
        if ended and (self.reports or self.stopped):
            name = f"the check of {len(ended)} trial(s) ended before this resume"
            self.writer.add(name, functools.partial(self._check_all, ended))

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        report = tune_report(result) if self.reports else None
        if report is not None:
            key = run_key(trial)
            self.writer.add(f"a report of trial {key}", lambda: self._report(key, *report))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(run_key(trial), stopped=self.stopped)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(run_key(trial), stopped=False)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if not self._checked:  # (restored finished: no step ran)
            self._check_ended(trials)
        self.writer.add("the metrics of the trials not ended", self._flush_all)
        wait = float(os.environ.get(WAIT_ENV, "600"))
        said = min(SAY_WAIT_S, wait)
        if not self.writer.wait(timeout=said):
            log.warning("MLflow %s: waiting up to %.0f s more for %d %s", self.uri, wait - said,
                        self.writer.pending(), self.writer.what)  # fmt: skip
            if not self.writer.wait(timeout=wait - said):
                log.warning(
                    "MLflow %s: %d %s not logged after %.0f s, given up; their metrics and "
                    "checkpoints are in Ray Train's runs under %s", self.uri,
                    self.writer.abandon(), self.writer.what, wait, self.train_storage,
                )  # fmt: skip
        self.writer.close()

    def _ended(self, trial_id: str, stopped: bool) -> None:
        seq = self.writer.add(f"the end of trial {trial_id}", lambda: self._end(trial_id))
        if stopped:
            name = f"the record of stopped trial {trial_id}"
            seq = self.writer.add(name, lambda: self._record(trial_id))
        if not self.writer.wait(seq, END_WAIT_S, settle=True) and not self.writer.failing():
            log.warning("MLflow %s: trial %s ended with %d %s not written yet after %.0f s; "
                        "the sweep goes on", self.uri, trial_id, self.writer.pending(),
                        self.writer.what, END_WAIT_S)  # fmt: skip

    # the writes, in the writer's thread

    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = Tracker(self.uri, keep=self.keep, strict=True)
        return self._tracker

    def _report(self, trial_id: str, run: str, report: dict[str, Any], checkpoint: str) -> None:
        self._runs[trial_id] = run
        try:
            log_report(self.tracker(), run, report, checkpoint)
        except Exception as e:
            if not unreachable(e):  # refused: dropped (``Writer``) with what it left kept
                self.tracker().discard(run)
            raise

    def _record(self, trial_id: str) -> None:
        record_stopped(self.tracker(), self.experiment_id, self.train_storage, trial_id,
                       self.mode, self.steps)  # fmt: skip

    def _check_all(self, ended: dict[str, Any]) -> None:
        """``ended``: trial id -> the last step Tune got. A trial whose run has its status, its
        end and that step is complete; any other, where it has a run, is checked."""
        runs = self.tracker().trial_runs(self.experiment_id)
        for trial_id, step in ended.items():
            run = runs.get(trial_id)
            if run is None:
                continue
            done = Tag.STATUS in run.data.tags and run.info.status != "RUNNING"
            if done and run.data.metrics.get("step", 0) >= (step or 0):
                continue
            self._check(trial_id, run)

    def _check(self, trial_id: str, run: Any) -> None:
        """The reports of an ended trial that its ``run`` (as the search found it) lacks logged
        (``log_missing``), and the trial recorded if it was stopped and its record was not
        written (``record_run``, with that run and Train result: neither read twice)."""
        result = persisted(self.train_storage, trial_id)
        if result is not None and self.reports:
            log_missing(self.tracker(), run.info.run_id, result)
        if self.stopped:
            record_run(self.tracker(), run, result, self.mode, self.steps)

    def _end(self, trial_id: str) -> None:
        """Send the trial's metrics MLflow has not taken yet."""
        if (run := self._runs.get(trial_id)) is not None:
            self._flush(trial_id, run)

    def _flush_all(self) -> None:
        for trial_id, run in list(self._runs.items()):
            self._flush(trial_id, run)

    def _flush(self, trial_id: str, run: str) -> None:
        """A run's kept metrics sent (raising while the store is unreachable: tried again), or
        dropped with a warning where MLflow refuses them (a run deleted in its UI)."""
        try:
            self.tracker().flush(run)
        except Exception as e:
            if unreachable(e):
                raise
            log.warning("MLflow %s refused %d metric(s) of trial %s (%s): dropped", self.uri,
                        self.tracker().discard(run), trial_id, short(e))  # fmt: skip
        del self._runs[trial_id]


def run_key(trial: Any) -> str:
    """The id of a Tune trial's MLflow run and training: its grid point's over successive
    halving's rounds, else its own (``point_of``)."""
    return point_of((trial.config or {}).get("params", {}), trial.trial_id)


def record_stopped(
    tracker: Tracker, experiment_id: str, train_storage: str, trial_id: str, mode: str, steps: int
) -> None:
    """Record a trial that Tune ended before it finished itself (ASHA's decision), from its Train
    run's persisted reports and checkpoints, as the trial would have; nothing if it recorded
    itself. Tried again after a failure, it ends a run whose status it already wrote."""
    run = tracker.find_trial_run(experiment_id, trial_id)
    if run is None:
        return
    result = None if Tag.STATUS in run.data.tags else persisted(train_storage, trial_id)
    record_run(tracker, run, result, mode, steps)


def persisted(train_storage: str, trial_id: str) -> Any:
    """The trial's Train run as Ray Train persisted it; None where it has none (refused, or
    stopped before its first checkpoint)."""
    try:
        return train_result(storage.join(train_storage, f"trial_{trial_id}"))
    except RuntimeError:
        return None


def record_run(tracker: Tracker, run: Any, result: Any, mode: str, steps: int) -> None:
    """``record_stopped`` of a trial's MLflow ``run`` (as found) and Train ``result`` (None:
    none persisted; not read where the run has its status)."""
    if (status := run.data.tags.get(Tag.STATUS)) is not None:  # recorded (by itself, or here)
        if run.info.status == "RUNNING":  # as ``finish_trial`` and the lines below end it
            checkpointed = Tag.LAST_CHECKPOINT in run.data.tags
            ends = {"diverged": "FAILED", INFEASIBLE: "KILLED"}
            ends[STOPPED] = "FINISHED" if checkpointed else "KILLED"
            tracker.finish(run.info.run_id, ends.get(status, "FINISHED"))
        return
    if result is None:  # stopped before its first checkpoint
        tracker.set_tags(run.info.run_id, {Tag.STATUS: STOPPED})
        tracker.finish(run.info.run_id, "KILLED")
        return
    # reports Train registered after Tune's decision, which the driver never got
    log_missing(tracker, run.info.run_id, result)
    finish_trial(tracker, run.info.run_id, result, mode, steps)


def driver_callbacks(spec: TrialSpec, steps: int) -> list[Callback]:
    """The Tune callbacks every phase's driver runs for its trials (``TrialLog``)."""
    return [TrialLog(spec, steps)]


class FinishStoppedTrials(TrialLog):
    """A Tuner state pickled before ``TrialLog`` has this callback (with ``LogTrialReports``
    since the reports went through the driver; before that, alone): it writes both."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        sweep = os.path.dirname(str(state.get("train_storage", "")))  # <storage>/<sweep>
        keep = unlogged_dir(os.path.dirname(sweep), os.path.basename(sweep))
        super().__setstate__({"keep": keep, **state, "reports": True, "stopped": True})


class LogTrialReports(TrialLog):
    """... and this one, which then writes nothing (``FinishStoppedTrials`` does)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        missing = {"experiment_id": "", "mode": "max", "steps": 0, "train_storage": ""}
        super().__setstate__({**missing, **state, "reports": False, "stopped": False})


# where a Tuner state pickled before looks them up (every driver imports this module before it
# restores a Tuner)
trial.LogTrialReports = LogTrialReports  # type: ignore[attr-defined]
trial.FinishStoppedTrials = FinishStoppedTrials  # type: ignore[attr-defined]
