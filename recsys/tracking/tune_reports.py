"""The report callback of a sweep's trials: Ray's ``TuneReportCallback``, each report also naming
its MLflow run, its own keys and its checkpoint's URI, for the sweep's driver to log
(``recsys.tracking.report``). A module of its own: it imports Ray Tune, which a Train run outside
Tune (a retrain, whose controller unpickles ``recsys.tracking.report``) does not need; like that
module it imports neither torch, TorchRec nor MLflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback

RUN_ID = "mlflow_run_id"  # in a training's Tune results: the MLflow run its reports go to
REPORT_KEYS = "report_keys"  # ... the keys of the report itself, comma-joined (Tune adds its own)
CHECKPOINT_URI = "checkpoint_uri"  # ... the report's checkpoint as a URI (none: no key)


class ReportToTune(TuneReportCallback):  # type: ignore[misc]
    """Ray's ``TuneReportCallback`` (each report to the trial's Tune session), each report also
    carrying its MLflow run (``RUN_ID``), its own keys (``REPORT_KEYS``) and its checkpoint's URI
    (``CHECKPOINT_URI``), for the driver to log (``tune_report``). Built in the trial's session."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        from recsys.runtime.storage import as_uri

        report = metrics[0]
        extra = {RUN_ID: self.run_id, REPORT_KEYS: ",".join(report)}
        if checkpoint is not None:
            extra[CHECKPOINT_URI] = as_uri(checkpoint.filesystem, checkpoint.path)
        super().after_report(run_context, [{**report, **extra}], checkpoint)


def to_tune(run_id: str) -> Callable[[dict[str, Any], str], None]:
    """Where a run trained in its Tune trial (``recsys.train.inline``) sends each report (and
    its checkpoint's folder, "" for none): to the trial's Tune session, with the keys
    ``ReportToTune`` adds and the ``checkpoint_path`` Ray's callback adds."""
    from ray import tune

    def send(report: dict[str, Any], folder: str) -> None:
        extra = {RUN_ID: run_id, REPORT_KEYS: ",".join(report)}
        if folder:
            extra[CHECKPOINT_URI] = extra[CHECKPOINT_PATH_KEY] = folder  # (a local folder)
        tune.report({**report, **extra})

    return send


def tune_report(result: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """A Tune result's training report, as ``ReportToTune`` sent it: (its MLflow run, the report
    without Tune's keys, its checkpoint's URI or ""); None for a result no training reported (a
    trial refused before any worker started)."""
    if RUN_ID not in result:
        return None
    keys = [k for k in str(result.get(REPORT_KEYS, "")).split(",") if k in result]
    return str(result[RUN_ID]), {k: result[k] for k in keys}, str(result.get(CHECKPOINT_URI, ""))
