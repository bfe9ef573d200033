"""A 2-trial sweep on a local 2-CPU Ray, read back from MLflow with ``MlflowClient``."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, check_resume, run_sweep
from recsys.tune.tracking import Tracker
from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_two_trial_sweep_lands_in_mlflow(ray_2_cpus, tmp_path):
    space = spaces.load(write_space(tmp_path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(name="t2", storage=str(tmp_path / "runs"), tracking_uri=uri, num_samples=1)
    assert not check_resume(space, opts)
    table = run_sweep(space, opts, Tracker(uri), restore=False)
    assert len(table) == 2 and all(r["status"] == "ok" for r in table)  # grid of 2 x 1 sample

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t2")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("recsys.kind") == "sweep:t2"]
    trials = [r for r in runs if r.data.tags.get("recsys.kind") == "trial"]
    assert len(parents) == 1 and len(trials) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "auc_vs_memory.png", "best_config.yaml", "search_space.yaml"} <= artifacts
    # embedding precision is a sweep dimension; the bytes follow the dtype
    assert {r.data.params["embeddings.dtype"] for r in trials} == {"fp32", "fp16"}
    for r in trials:
        width = {"fp32": 4, "fp16": 2}[r.data.params["embeddings.dtype"]]
        assert r.data.metrics["emb_bytes"] == r.data.metrics["emb_params"] * width
    for run in trials:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "embeddings.qr.threshold" in run.data.params and "optim.lr" in run.data.params
        loss = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in loss] == [5, 10, 15, 20]
        auc = client.get_metric_history(run.info.run_id, "val_auc")
        assert [m.step for m in auc] == [10, 20] and 0.0 < auc[-1].value < 1.0
        for key in ("val_log_loss", "val_ne", "val_calibration", "samples_per_s", "emb_bytes"):
            assert key in run.data.metrics, key
        assert run.data.metrics["emb_bytes_full"] >= run.data.metrics["emb_bytes"]
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"sharding_plan.json", "checkpoint_best"} <= names
        assert run.data.tags["checkpoint.last"].endswith("step_00000020")

    # the MLflow UI server, on loopback, lists the sweep's runs over its REST API
    assert_server_lists_runs(uri, exp.experiment_id, {r.info.run_id for r in runs})


def assert_server_lists_runs(uri: str, experiment_id: str, run_ids: set[str]) -> None:
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.distributed.harness import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri]
    server = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.time() + 90
        while True:
            try:
                body = json.dumps({"experiment_ids": [experiment_id]}).encode()
                req = urllib.request.Request(
                    f"{base}/runs/search", body, {"Content-Type": "application/json"}
                )
                listed = json.load(urllib.request.urlopen(req, timeout=5))["runs"]
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "mlflow server down"
                time.sleep(1)
        assert {r["info"]["run_id"] for r in listed} == run_ids
    finally:
        server.terminate()
        server.wait(timeout=30)
