"""``--system-metrics``: the host's first worker logs MLflow's system metrics into the trial's run
as ``system/node<k>/...``; the other workers of the host log none."""

from __future__ import annotations

import time

import torch
from mlflow import MlflowClient

from recsys.distributed.env import WorkerEnv
from recsys.train.system_metrics import node_monitor


def env(rank: int, local_rank: int) -> WorkerEnv:
    return WorkerEnv(rank, 4, local_rank, 2, torch.device("cpu"))


def test_the_first_worker_of_each_host_logs_its_system_metrics(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e")).info.run_id
    settings = {"tracking_uri": uri, "run_id": run, "interval_s": 0.2}
    with node_monitor(settings, env(2, 0)), node_monitor(settings, env(3, 1)):
        time.sleep(1.5)
    with node_monitor(None, env(0, 0)):  # off
        time.sleep(0.5)
    logged = client.get_run(run).data.metrics
    assert "system/node1/cpu_utilization_percentage" in logged  # rank 2 of 2 per host: host 1
    assert "system/node1/system_memory_usage_megabytes" in logged
    assert {k.split("/")[1] for k in logged} == {"node1"}  # rank 3 (local 1) and the off one: none
    history = client.get_metric_history(run, "system/node1/cpu_utilization_percentage")
    assert len(history) >= 3 and all(0 <= m.value <= 100 for m in history)


def test_a_block_shorter_than_the_interval_logs_one_sample_at_its_end(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e")).info.run_id
    settings = {"tracking_uri": uri, "run_id": run, "interval_s": 30.0}
    t0 = time.perf_counter()
    with node_monitor(settings, env(0, 0)):
        pass
    assert time.perf_counter() - t0 < 20  # (the monitor's thread does not wait out its interval)
    history = client.get_metric_history(run, "system/node0/cpu_utilization_percentage")
    assert len(history) == 1 and 0 <= history[0].value <= 100
