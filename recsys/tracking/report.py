"""The Ray Train callback that logs a trial's reports to MLflow, from Train's controller process.

Kept in a module of its own that imports neither torch nor TorchRec: Ray unpickles the callback in
the controller, which imports its module. From ``recsys.tune.trial`` (the planner, the model code,
torch) that cost about 5 s of CPU at every trial's start, on the cores its workers were starting
on.

MLflow itself is imported, and the store opened, in a thread of the controller while the worker
group starts (``OpenTrackerEarly``): done at the first report, that took about 1.1 s, during which
the controller took no report, so a worker's next report waited for it (the queue between them
holds one).
"""

from __future__ import annotations

import threading
from typing import Any

from ray.train import UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback


class MlflowReportCallback(UserCallback):  # type: ignore[misc]
    """Logs each registered report of a Train run to the trial's MLflow run."""

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
        from recsys.tracking.tracker import Tag

        self.tracker().log_report(self.run_id, metrics[0])
        tags = {}
        if checkpoint is not None:
            tags[Tag.LAST_CHECKPOINT] = as_uri(checkpoint.filesystem, checkpoint.path)
        if metrics[0].get("resume_note"):
            tags[Tag.RESUME_NOTE] = str(metrics[0]["resume_note"])
        if tags:
            self.tracker().set_tags(self.run_id, tags)


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
