"""How a training's reports reach MLflow without Train's controller importing MLflow.

In a sweep, every report already travels from Train's controller to the trial's Tune session
(Ray's ``TuneReportCallback``) and on to the sweep's driver, which has MLflow loaded and its store
open. ``recsys.tracking.tune_reports.ReportToTune`` adds to each report the MLflow run it belongs
to, the keys of the report itself (Tune adds its own) and its checkpoint's URI; the driver
logs it there (``log_report``, from ``recsys.tune.driver_log``, in a thread of its own). Train's
controller, a new process for every trial, then never imports MLflow: on 2 cores its 0.9 s import
and its SQL store's 0.8-1.0 s ran beside the workers' start and slowed it.

A Train run outside Tune (a retrain) logs from the controller (``MlflowReportCallback``), which
imports MLflow and opens the store in a thread as the controller starts (``OpenTrackerEarly``):
done at the first report, that took about 1.1 s during which the controller took no report.

Kept in a module of its own that imports neither torch, TorchRec, MLflow nor Ray Tune: Ray
unpickles these callbacks in the controller, which imports their module (from
``recsys.tune.trial``, with the planner, the model code and torch, that cost about 5 s of CPU at
every trial's start).
"""

from __future__ import annotations

import threading
from typing import Any

from ray.train import UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback


def log_report(tracker: Any, run_id: str, report: dict[str, Any], checkpoint_uri: str) -> None:
    """Log one report of a training to ``run_id``: its metrics (``Tracker.log_report``), its
    checkpoint as the run's last (``checkpoint_uri``, "" for none) and its resume note."""
    from recsys.tracking.tracker import Tag

    tracker.log_report(run_id, report)
    tags = {}
    if checkpoint_uri:
        tags[Tag.LAST_CHECKPOINT] = checkpoint_uri
    if report.get("resume_note"):
        tags[Tag.RESUME_NOTE] = str(report["resume_note"])
    if tags:
        tracker.set_tags(run_id, tags)


class MlflowReportCallback(UserCallback):  # type: ignore[misc]
    """Logs each registered report of a Train run to an MLflow run, from Train's controller (a
    Train run outside Tune; in a sweep: ``ReportToTune``)."""

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri, self.run_id = uri, run_id
        self._tracker: Any = None
        self._opening: threading.Thread | None = None
        self._failed: Exception | None = None

    def open_early(self) -> None:
        """Import MLflow and open the store in a thread (once); the first report joins it."""
        if self._opening is None and self._tracker is None:
            self._opening = threading.Thread(target=self._open, name="open-tracker", daemon=True)
            self._opening.start()

    def _open(self) -> None:
        from recsys.tracking.tracker import Tracker

        try:
            self._tracker = Tracker(self.uri)
        except Exception as e:  # raised by the first report (not opened twice: ``tracker``)
            self._failed = e

    def tracker(self) -> Any:
        """The open tracker: the early opening's, once it ended (its error raised here: opening
        a store already waits out an outage, ``open_store``), else opened now."""
        from recsys.tracking.tracker import Tracker

        if self._opening is not None:
            self._opening.join()
            self._opening = None
            if self._failed is not None:
                failed, self._failed = self._failed, None
                raise failed
        if self._tracker is None:
            self._tracker = Tracker(self.uri)
        return self._tracker

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "run_id": self.run_id, "_tracker": None, "_opening": None,
                "_failed": None}  # fmt: skip

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        from recsys.runtime.storage import as_uri

        uri = as_uri(checkpoint.filesystem, checkpoint.path) if checkpoint is not None else ""
        log_report(self.tracker(), self.run_id, metrics[0], uri)


class OpenTrackerEarly(ControllerCallback):  # type: ignore[misc]
    """Opens ``callback``'s tracker as the controller starts (``MlflowReportCallback.
    open_early``), beside the worker group's start rather than at the first report."""

    def __init__(self, callback: MlflowReportCallback) -> None:
        self.callback = callback

    def after_controller_start(self, train_run_context: Any) -> None:
        self.callback.open_early()


def report_callbacks(uri: str, run_id: str) -> list[Any]:
    """The callbacks that log a Train run's reports to the MLflow run ``run_id``: a
    ``RunConfig(callbacks=...)`` list (pickled as one: the two share the callback)."""
    callback = MlflowReportCallback(uri, run_id)
    return [callback, OpenTrackerEarly(callback)]
