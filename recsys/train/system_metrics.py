"""A trial's system metrics in its MLflow run (``recsys-sweep --system-metrics S``, off by
default): MLflow's own monitor (CPU and memory, disk, network; GPU utilisation and memory where
NVML sees a GPU), one per host the trial's workers run on, started by the host's first worker
(``LOCAL_RANK`` 0), a sample every ``S`` seconds (one, at the end, where training took less),
logged as ``system/node<k>/<metric>`` (``k``: the host's place among the trial's hosts). A
restarted worker group (a lost node) goes on from the run's last logged step. A failure to monitor
is MLflow's warning, never the training's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from recsys.distributed.env import WorkerEnv


@contextlib.contextmanager
def node_monitor(settings: dict[str, Any] | None, env: WorkerEnv) -> Iterator[None]:
    """Monitor this host while the block runs, if ``settings`` (``tracking_uri``, ``run_id``,
    ``interval_s``) are given and this worker is its host's first."""
    if not settings or env.local_rank != 0:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(
        settings["run_id"],
        sampling_interval=float(settings["interval_s"]),
        node_id=f"node{env.rank // max(1, env.local_world_size)}",
        tracking_uri=settings["tracking_uri"],
        resume_logging=True,
    )
    first = monitor._logging_step  # (resume_logging: the step after the run's last)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
        if monitor._logging_step == first:
            sample_once(monitor)


def sample_once(monitor: Any) -> None:
    """One sample, logged now: MLflow's monitor logs none for a block shorter than its interval
    (its thread takes a sample, waits one interval, and stops there without logging it). That
    sample is dropped first: its CPU share covers almost no time (psutil measures a thread's
    first call from nothing), and it would be averaged into this one."""
    import logging

    try:
        for m in monitor.monitors:
            m.clear_metrics()
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as e:  # a failure to monitor is a warning, never the training's
        logging.getLogger(__name__).warning("system metrics: the one sample failed: %s", e)
