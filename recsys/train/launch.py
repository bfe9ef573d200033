"""One training outside a sweep (``recsys-train``, a refit, a retrain's trainings): on Ray Train,
or, for one CPU worker on a file system, in a Ray task of its own.

A sweep's one-worker trials train in their Tune trials (``recsys.train.inline``). A training that
no Tune trial holds gets the same saving from a Ray task: it reserves the worker's CPUs on the
cluster, trains there with ``inline.train`` (the same ``Trainer`` over a one-rank group, its
checkpoints where Ray Train's worker writes them, resumed from the newest with its report), and
skips the Ray Train controller and worker group that would cost it about 8.5 s on 2 cores
(BENCHMARKS.md, the overhead rows). Ray usually keeps the task's process for the next task, so a
retrain's later trainings find torch and TorchRec imported.

The task streams each report back (a generator task); the caller's process logs it to MLflow, as
a sweep's driver logs its trials' reports, so a store only the caller's machine reaches (the
default SQLite file) serves a task on any node, and the training never waits on MLflow. Before
each attempt, the reports of checkpoints that MLflow lacks (a process that died between a
checkpoint and its report's logging) are logged first.

A failed attempt is tried again from its last checkpoint up to ``max_failures`` times (negative:
without limit), as Ray Train restarts its workers (a lost node, a killed process, an error of the
training), once some node can hold the worker (``wait_for_fit`` up to ``RECSYS_NODE_WAIT_S``);
an error of the input (``ConfigError``, ``DataError``) or a cancelled task is raised at once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from recsys.config import ExperimentConfig
from recsys.runtime import storage
from recsys.train import inline
from recsys.train.ray_trainer import Resources, make_trainer

ReportTo = tuple[str, str]  # (an MLflow tracking URI, the run each report is logged to)
REPORT, END = "report", "end"  # what the task yields: (REPORT, metrics, folder), (END, last, "")


def make_run(
    cfg: ExperimentConfig,
    resources: Resources,
    *,
    name: str,
    storage_path: str,
    max_failures: int = 0,
    report_to: ReportTo | None = None,
    log: Any = print,
    tracker: Any = None,
) -> Any:
    """The run of ``cfg`` named ``name`` under ``storage_path`` (re-running one resumes it): an
    ``InlineRun`` where ``inline.fits`` (one CPU worker, a file system), else Ray Train's
    ``TorchTrainer`` (``make_trainer``). Either has ``fit()``, which returns the run's
    ``ray.train.Result``. ``report_to``: the MLflow run each report is logged to (``tracker``:
    the caller's open ``Tracker`` of that store, for a task's reports). Ray Train's coordinator
    actor is started (and waited for) only for a Ray Train run (``start_train_coordinator``)."""
    if inline.fits(resources.num_workers, resources.use_gpu, storage_path):
        return InlineRun(cfg, resources, name, storage_path, max_failures, report_to, log,
                         tracker)  # fmt: skip
    from recsys.runtime.cluster import start_train_coordinator
    from recsys.tracking.report import report_callbacks

    start_train_coordinator()
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
        max_failures: attempts tried again after a failure that is not the input's (negative:
            without limit).
        report_to: the MLflow run each report is logged to, or None.
        log: where a retried failure is said.
        tracker: the caller's open ``Tracker`` of ``report_to``'s store, which logs the reports
            (None: one opened here); a caller that ends the run with it flushes what MLflow
            did not take yet.
    """

    cfg: ExperimentConfig
    resources: Resources
    name: str
    storage_path: str
    max_failures: int = 0
    report_to: ReportTo | None = None
    log: Any = print
    tracker: Any = None

    def fit(self) -> Any:
        """Train (resumed from the newest reported checkpoint); the run's ``ray.train.Result``."""
        root = storage.join(self.storage_path, self.name)
        logger = ReportLogger(self.report_to, self.tracker) if self.report_to else None
        failures = 0
        while True:
            if logger is not None:
                logger.missed(root)
            try:
                return inline.result(root, self.attempt(root, logger))
            except Exception as e:
                if (cause := not_retried(e)) is not None:
                    raise cause from None
                failures += 1
                if 0 <= self.max_failures < failures:
                    raise
                limit = self.max_failures if self.max_failures >= 0 else "no limit"
                self.log(f"training {self.name} failed ({failure_line(e)}); trying again from "
                         f"its last checkpoint ({failures} of {limit})")  # fmt: skip
                self.wait_for_room()

    def attempt(self, root: str, logger: ReportLogger | None) -> dict[str, Any] | None:
        """One attempt in a Ray task, each report it streams logged by ``logger``; its last
        report (None: it reported nothing). The task is cancelled on any error here but its
        own (the caller's interrupt, MLflow's), so that no attempt trains on beside the next.
        A task that raised has ended and is not cancelled: its force-kill could reach its worker
        after the next attempt's task had been handed that same worker (Ray reuses a worker's
        lease for the next task of its kind), and end that attempt instead
        (``WorkerCrashedError``)."""
        import ray
        from ray.exceptions import RayTaskError

        cpus = self.resources.cpus_per_worker
        task = ray.remote(train_task).options(
            num_cpus=cpus, max_retries=0, num_returns="streaming", name=f"train {self.name}"
        )
        stream: Any = task.remote(self.cfg.to_dict(), root, cpus, self.resources.node_workers)
        try:
            for ref in stream:
                kind, metrics, folder = ray.get(ref)
                if kind == END:
                    return metrics  # type: ignore[no-any-return]
                if logger is not None:
                    logger.log(metrics, folder)
        except RayTaskError:  # the task's own error: it has ended
            raise
        except BaseException:  # an interrupt, MLflow's error: none trains on
            with contextlib.suppress(Exception):  # (a task that ended: nothing to cancel)
                ray.cancel(stream, force=True)
            raise
        raise RuntimeError(f"training {self.name}: its task ended without its last report")

    def wait_for_room(self) -> None:
        """Wait (``RECSYS_NODE_WAIT_S``) until an alive node can hold the worker, else refuse
        (``ConfigError``, with the time waited)."""
        from recsys.runtime.cluster import wait_for_fit
        from recsys.train.nodes import node_wait_s

        wait_for_fit(1, self.resources.cpus_per_worker, 0.0, 0.0, node_wait_s())


class ReportLogger:
    """Logs a run's reports to its MLflow run (``recsys.tracking.report.log_report``) from the
    caller's process, the store opened once."""

    def __init__(self, report_to: ReportTo, tracker: Any = None) -> None:
        from recsys.tracking.tracker import Tracker

        self.tracker, self.run_id = tracker or Tracker(report_to[0]), report_to[1]

    def log(self, metrics: dict[str, Any], folder: str) -> None:
        from recsys.tracking.report import log_report

        log_report(self.tracker, self.run_id, metrics, folder)

    def missed(self, root: str) -> None:
        """Log the reports of the run's checkpoints under ``root`` that MLflow lacks (those
        after its last step), oldest first."""
        from recsys.train.reporting import reported

        last = self.tracker.last_step(self.run_id)
        for folder, metrics in reported(root):
            if int(metrics.get("step", 0)) > last:
                self.log(metrics, folder)


def train_task(
    experiment: dict[str, Any], root: str, cpus: float, node_workers: int
) -> Iterator[tuple[str, Any, str]]:
    """The Ray task (a generator): ``inline.train`` of the configuration ``experiment`` (a dict)
    under ``root`` in a thread, each report yielded as it comes ``(REPORT, metrics, folder)``,
    then ``(END, the last report, "")``; the training's error raised."""
    cfg = ExperimentConfig.from_dict(experiment)
    reports: queue.Queue[tuple[dict[str, Any], str] | None] = queue.Queue()
    outcome: dict[str, Any] = {}

    def send(metrics: dict[str, Any], folder: str) -> None:
        reports.put((metrics, folder))

    def run() -> None:
        try:
            outcome["result"] = inline.train(cfg, root, send, cpus, node_workers=node_workers)
        except BaseException as e:  # raised by the task below
            outcome["error"] = e
        finally:
            reports.put(None)

    thread = threading.Thread(target=run, name="train", daemon=True)
    thread.start()
    while (item := reports.get()) is not None:
        yield REPORT, item[0], item[1]
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    metrics = outcome["result"].metrics
    yield END, dict(metrics) if metrics else None, ""


def not_retried(e: BaseException) -> BaseException | None:
    """What ``e`` (a task's error as ``ray.get`` raises it) carries that no retry mends: a
    ``ConfigError`` or ``DataError`` (as itself), or the task's cancellation; else None."""
    from ray.exceptions import TaskCancelledError

    from recsys.configlib import ConfigError
    from recsys.data.errors import DataError

    if isinstance(e, TaskCancelledError):
        return e
    cause = getattr(e, "cause", None) or e
    return cause if isinstance(cause, (ConfigError, DataError)) else None


def failure_line(e: BaseException) -> str:
    """A failed attempt in a line: the error's type and its message's line that says most (a
    task's error: the last, its exception's; Ray's own: the first, before its advice)."""
    cause = getattr(e, "cause", None)
    text = str(cause or e).strip().splitlines()
    line = (text[-1] if cause is not None else text[0]) if text else ""
    return f"{type(cause or e).__name__}: {line}"
