"""One training outside a sweep (``recsys-train``, a refit, a retrain's trainings): on Ray Train,
or, for one CPU worker on a file system, in a Ray task of its own.

A sweep's one-worker trials train in their Tune trials (``recsys.train.inline``). A training that
no Tune trial holds gets the same saving from a Ray task: it reserves the worker's CPUs on the
cluster, trains there with ``inline.train`` (the same ``Trainer`` over a one-rank group, its
checkpoints where Ray Train's worker writes them, resumed from the newest with its report), and
skips the Ray Train controller and worker group that would cost it about 8.5 s on 2 cores
(BENCHMARKS.md, the overhead rows). Ray keeps the task's process for the next task, so a
retrain's next training finds torch and TorchRec imported.

A failed attempt is tried again from its last checkpoint up to ``max_failures`` times, as Ray
Train restarts its workers (a lost node, a killed process, an error of the training), except for
an error of the input (``ConfigError``, ``DataError``), which no retry mends: it is raised at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recsys.config import ExperimentConfig
from recsys.runtime import storage
from recsys.train import inline
from recsys.train.ray_trainer import Resources, make_trainer

ReportTo = tuple[str, str]  # (an MLflow tracking URI, the run each report is logged to)


def make_run(
    cfg: ExperimentConfig,
    resources: Resources,
    *,
    name: str,
    storage_path: str,
    max_failures: int = 0,
    report_to: ReportTo | None = None,
    log: Any = print,
) -> Any:
    """The run of ``cfg`` named ``name`` under ``storage_path`` (re-running one resumes it): an
    ``InlineRun`` where ``inline.fits`` (one CPU worker, a file system), else Ray Train's
    ``TorchTrainer`` (``make_trainer``). Either has ``fit()``, which returns the run's
    ``ray.train.Result``. ``report_to``: the MLflow run each report is logged to."""
    if inline.fits(resources.num_workers, resources.use_gpu, storage_path):
        return InlineRun(cfg, resources, name, storage_path, max_failures, report_to, log)
    from recsys.tracking.report import report_callbacks

    callbacks = report_callbacks(*report_to) if report_to else None
    return make_trainer(cfg, resources, name=name, storage_path=storage_path,
                        max_failures=max_failures, callbacks=callbacks)  # fmt: skip


@dataclass
class InlineRun:
    """A run of one CPU worker trained in a Ray task (``train_task``) with the worker's CPUs.

    Attributes:
        cfg: the run's configuration.
        resources: its one worker's (``cpus_per_worker``, ``node_workers``).
        name: its folder under ``storage_path`` (as Ray Train's run name).
        storage_path: a file system path every node sees.
        max_failures: attempts tried again after a failure that is not the input's.
        report_to: the MLflow run each report is logged to, or None.
        log: where a retried failure is said.
    """

    cfg: ExperimentConfig
    resources: Resources
    name: str
    storage_path: str
    max_failures: int = 0
    report_to: ReportTo | None = None
    log: Any = print

    def fit(self) -> Any:
        """Train (resumed from the newest reported checkpoint); the run's ``ray.train.Result``."""
        root = storage.join(self.storage_path, self.name)
        failures = 0
        while True:
            try:
                last = self.attempt(root)
                return inline.result(root, last)
            except Exception as e:
                cause = input_error(e)
                if cause is not None:
                    raise cause from None
                failures += 1
                if failures > self.max_failures:
                    raise
                self.log(f"training {self.name} failed ({failure_line(e)}); trying again from "
                         f"its last checkpoint ({failures} of {self.max_failures})")  # fmt: skip

    def attempt(self, root: str) -> dict[str, Any] | None:
        """One attempt in a Ray task; its last report (None: it reported nothing). Cancelled
        with the caller's interrupt."""
        import ray

        cpus = self.resources.cpus_per_worker
        task = ray.remote(train_task).options(
            num_cpus=cpus, max_retries=0, retry_exceptions=False, name=f"train {self.name}"
        )
        ref = task.remote(self.cfg.to_dict(), root, cpus, self.resources.node_workers,
                          self.report_to)  # fmt: skip
        try:
            return ray.get(ref)  # type: ignore[no-any-return]
        except KeyboardInterrupt:
            ray.cancel(ref, force=True)
            raise


def train_task(
    experiment: dict[str, Any], root: str, cpus: float, node_workers: int,
    report_to: ReportTo | None,
) -> dict[str, Any] | None:  # fmt: skip
    """The Ray task: ``inline.train`` of the configuration ``experiment`` (a dict) under ``root``,
    each report logged to ``report_to``'s MLflow run; the last report."""
    cfg = ExperimentConfig.from_dict(experiment)
    send = mlflow_sender(report_to) if report_to else (lambda metrics, folder: None)
    result = inline.train(cfg, root, send, cpus, node_workers=node_workers)
    return dict(result.metrics) if result.metrics else None


def mlflow_sender(report_to: ReportTo) -> inline.Send:
    """Logs each report to an MLflow run (``recsys.tracking.report.log_report``), the store
    opened at the first."""
    uri, run_id = report_to
    opened: list[Any] = []

    def send(metrics: dict[str, Any], folder: str) -> None:
        from recsys.tracking.report import log_report
        from recsys.tracking.tracker import Tracker

        if not opened:
            opened.append(Tracker(uri))
        log_report(opened[0], run_id, metrics, folder)

    return send


def input_error(e: BaseException) -> BaseException | None:
    """The ``ConfigError`` or ``DataError`` that ``e`` (a task's error as ``ray.get`` raises it)
    carries, or None."""
    from recsys.configlib import ConfigError
    from recsys.data.errors import DataError

    cause = getattr(e, "cause", None) or e
    return cause if isinstance(cause, (ConfigError, DataError)) else None


def failure_line(e: BaseException) -> str:
    """A failed attempt in a line: the error's type and its message's last line."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"
