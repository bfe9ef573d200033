"""A trial's system metrics in its MLflow run (``recsys-sweep --system-metrics S``, off by
default): MLflow's own monitor (CPU and memory, disk, network; GPU utilisation and memory where
NVML sees a GPU), one per host the trial's workers run on, started by the host's first worker
(``LOCAL_RANK`` 0), a sample every ``S`` seconds, logged as ``system/node<k>/<metric>`` (``k``:
the host's place among the trial's hosts). A restarted worker group (a lost node) goes on from the
run's last logged step. A failure to monitor is MLflow's warning, never the training's."""

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
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
