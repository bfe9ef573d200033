"""The Ray Train callback that logs a trial's reports to MLflow, from Train's controller process.

Kept in a module of its own that imports neither torch nor TorchRec: Ray unpickles the callback in
the controller, which imports its module. From ``recsys.tune.trial`` (the planner, the model code,
torch) that cost about 5 s of CPU at every trial's start, on the cores its workers were starting
on. MLflow itself is imported at the first report.
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback


class MlflowReportCallback(UserCallback):  # type: ignore[misc]
    """Logs each registered report of a Train run to the trial's MLflow run."""

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri, self.run_id = uri, run_id
        self._tracker: Any = None

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        from recsys.runtime.storage import as_uri
        from recsys.tracking.tracker import Tag, Tracker

        if self._tracker is None:
            self._tracker = Tracker(self.uri)
        self._tracker.log_report(self.run_id, metrics[0])
        tags = {}
        if checkpoint is not None:
            tags[Tag.LAST_CHECKPOINT] = as_uri(checkpoint.filesystem, checkpoint.path)
        if metrics[0].get("resume_note"):
            tags[Tag.RESUME_NOTE] = str(metrics[0]["resume_note"])
        if tags:
            self._tracker.set_tags(self.run_id, tags)
