"""What a sweep's driver writes to MLflow for its trials, in a thread of its own.

Every report of a trial's training reaches the driver as a Tune result (``ReportToTune``); the
driver logs it to the trial's MLflow run (``recsys.tracking.report.log_report``). A trial that
ASHA stopped is ended by Tune with its actor, before its own bookkeeping: the driver records it
(``stopped``) from what Ray Train persisted. Both are writes of one queue, done in order by one
thread (``recsys.tracking.writer.Writer``), so that Tune's loop never waits for the store: a
store that answers slowly, or is down (each write is then tried again until it answers), delays
no trial's next result. A trial's end waits (up to ``END_WAIT_S``) for that trial's own writes,
so that Tune's experiment state never records as ended a trial whose reports are not logged yet
(a driver killed then would lose them: a resumed sweep restores only unfinished trials, which
``backfill`` their reports). The experiment's end waits for all of them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ray.tune import Callback

from recsys.runtime import storage
from recsys.tracking.report import log_report
from recsys.tracking.store import WAIT_ENV
from recsys.tracking.tracker import Tag, Tracker
from recsys.tracking.tune_reports import tune_report
from recsys.tracking.writer import Writer
from recsys.tune import trial
from recsys.tune.results import STOPPED
from recsys.tune.state import unlogged_dir
from recsys.tune.trial import TrialSpec, finish_trial, log_missing, train_result

log = logging.getLogger(__name__)

END_WAIT_S = 60.0  # how long a trial's end waits for its own reports to be logged


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

    def __getstate__(self) -> dict[str, Any]:  # (Tune pickles its callbacks with the Tuner)
        keep = ("uri", "keep", "experiment_id", "mode", "steps", "train_storage", "reports",
                "stopped")  # fmt: skip
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    # Tune's callbacks, in its loop: they queue, and only a trial's end waits

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        report = tune_report(result) if self.reports else None
        if report is not None:
            name = f"a report of trial {trial.trial_id}"
            self.writer.add(name, lambda: self._report(trial.trial_id, *report))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial.trial_id, stopped=self.stopped)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial.trial_id, stopped=False)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        wait = float(os.environ.get(WAIT_ENV, "600"))
        if not self.writer.wait(timeout=wait):
            log.warning(
                "MLflow %s: %d report(s) or end(s) of this sweep's trials not logged after %.0f "
                "s; their metrics and checkpoints are in Ray Train's runs under %s",
                self.uri, self.writer.pending(), wait, self.train_storage,
            )  # fmt: skip
        self.writer.close()

    def _ended(self, trial_id: str, stopped: bool) -> None:
        seq = self.writer.add(f"the end of trial {trial_id}", lambda: self._end(trial_id, stopped))
        if not self.writer.wait(seq, END_WAIT_S):
            log.warning(
                "MLflow %s: trial %s ended with its reports not all logged yet (%d write(s) "
                "wait in the driver); the sweep goes on", self.uri, trial_id,
                self.writer.pending(),
            )  # fmt: skip

    # the writes, in the writer's thread

    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = Tracker(self.uri, keep=self.keep)
        return self._tracker

    def _report(self, trial_id: str, run: str, report: dict[str, Any], checkpoint: str) -> None:
        self._runs[trial_id] = run
        log_report(self.tracker(), run, report, checkpoint)

    def _end(self, trial_id: str, stopped: bool) -> None:
        """The trial's metrics MLflow has not taken yet sent (raising if it does not take them:
        tried again, or dropped), then, ``stopped``, the trial recorded if Tune ended it."""
        if (run := self._runs.get(trial_id)) is not None:
            self.tracker().flush(run, raising=True)
            del self._runs[trial_id]
        if stopped:
            record_stopped(self.tracker(), self.experiment_id, self.train_storage, trial_id,
                           self.mode, self.steps)  # fmt: skip


def record_stopped(
    tracker: Tracker, experiment_id: str, train_storage: str, trial_id: str, mode: str, steps: int
) -> None:
    """Record a trial that Tune ended before it finished itself (ASHA's decision), from its Train
    run's persisted reports and checkpoints, as the trial would have; nothing if it recorded
    itself."""
    run = tracker.find_trial_run(experiment_id, trial_id)
    if run is None or Tag.STATUS in run.data.tags:  # it recorded itself
        return
    try:
        result = train_result(storage.join(train_storage, f"trial_{trial_id}"))
    except RuntimeError:  # stopped before its first checkpoint
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
        super().__setstate__({"keep": None, **state, "reports": True, "stopped": True})


class LogTrialReports(TrialLog):
    """... and this one, which then writes nothing (``FinishStoppedTrials`` does)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        missing = {"experiment_id": "", "mode": "max", "steps": 0, "train_storage": ""}
        super().__setstate__({**missing, **state, "reports": False, "stopped": False})


# where a Tuner state pickled before looks them up (every driver imports this module before it
# restores a Tuner)
trial.LogTrialReports = LogTrialReports  # type: ignore[attr-defined]
trial.FinishStoppedTrials = FinishStoppedTrials  # type: ignore[attr-defined]
