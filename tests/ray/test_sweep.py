"""The default space's smoke sweep through the command line (a local Ray of its own): its whole
console output, and everything read back from MLflow with ``MlflowClient``: the search's trials
and the smoke variant's baseline (lr) marked as a reference; with a SQLite store and with a
tracking server over PostgreSQL. A ``recsys-train`` runs beside it
with a local Ray of its own: neither console shows the other's instance."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# fixed lines (Ray's start, the sweep's and phases' headers, the table's header, the summary, where
# to look) + per trial (and baseline) a start line, an end line and a table row
LINES_FIXED, LINES_PER_TRIAL = 18, 3
NOISE = [
    "Failed to query",  # Train's PlacementGroupCleaner without the State API
    "Sharding spec not found",  # TorchRec on data-parallel tables
    "PreemptionWatcher",
    "Configuration for experiment",  # Tune's boxes
    "│",
    "autograd kernel was not registered",
    "step 10/",  # per-step loss lines of the workers
    "multiple active Ray instances",  # Ray tools that found the other process's Ray
    "Traceback",
    "View run",  # MLflow's link per ended run, printed by a tracking server's client
]


def test_default_smoke_sweep_console_and_mlflow(tmp_path, tracking_uri):
    uri = tracking_uri
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
           "--name", "t2", "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
           "--num-workers", "1", "--cpus-per-worker", "1.5"]  # fmt: skip
    train = [sys.executable, os.path.join(ROOT, "experiments", "train.py"), "--num-workers", "1",
             "--cpus-per-worker", "0.5", "--storage", str(tmp_path / "beside"),
             "--set", "train.steps=60", "--set", "train.checkpoint_every=20"]  # fmt: skip
    # both inherit a dead local Ray's dashboard address, as from an earlier connect in a parent
    # (this test process's other Ray tests): each must use its own
    stale = "http://127.0.0.1:9"
    env = {**os.environ, "RAY_API_SERVER_ADDRESS": stale, "RECSYS_LOCAL_RAY_API_SERVER": stale}
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "cwd": tmp_path}
    beside = subprocess.Popen(train, env=env, **pipe)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    beside_out = beside.communicate(timeout=600)[0]
    assert beside.returncode == 0, beside_out[-3000:]
    assert [n for n in NOISE if n in beside_out] == [], beside_out
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= LINES_FIXED + LINES_PER_TRIAL * (1 + 1), out
    assert [n for n in NOISE if n in out] == [], out
    assert sum("trial " in line and "started:" in line for line in lines) == 1
    assert sum("baseline " in line and "started:" in line for line in lines) == 1
    table = out[out.index("best trials") : out.index("against the baselines")]
    assert "lr (ref)" in table and "worker_s" in table
    assert "beats lr (trial" in out or "does NOT beat lr (trial" in out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t2")
    last = done.stdout.strip().splitlines()[-1]
    if uri.startswith("http"):  # a tracking server: its page of the sweep's experiment
        assert last == f"compare the runs: {uri}/#/experiments/{exp.experiment_id}"
    else:
        assert last.startswith("compare the runs: mlflow ui --backend-store-uri " + uri)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("recsys.kind") == "sweep:t2"]
    trials = [r for r in runs if r.data.tags.get("recsys.kind") == "trial"]
    assert len(parents) == 1 and len(trials) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "auc_vs_memory.png", "best_config.yaml", "search_space.yaml"} <= artifacts
    assert parent.data.tags["recsys.metric"] == "val_auc" and "best_val_auc" in parent.data.metrics
    check_baselines(client, runs, parent, tmp_path)
    for r in trials:  # embedding precision is a sweep dimension; the bytes follow the dtype
        width = {"fp32": 4, "fp16": 2}[r.data.params["embeddings.dtype"]]
        assert r.data.metrics["emb_bytes"] == r.data.metrics["emb_params"] * width
    for run in trials:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "embeddings.qr.threshold" in run.data.params and "optim.lr" in run.data.params
        loss = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in loss] == [20]
        auc = client.get_metric_history(run.info.run_id, "val_auc")
        assert [m.step for m in auc] == [10, 20] and 0.0 < auc[-1].value < 1.0
        best = run.data.metrics["best_val_auc"]  # the trial's score: its best report, with step
        assert best == max(m.value for m in auc)
        assert (
            run.data.metrics["best_step"] in (10, 20)
            and run.data.tags["recsys.status"] == "finished"
        )
        for key in ("val_log_loss", "val_ne", "val_calibration", "samples_per_s", "emb_bytes"):
            assert key in run.data.metrics, key
        assert run.data.metrics["emb_bytes_full"] >= run.data.metrics["emb_bytes"]
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"sharding_plan.json", "checkpoint_best"} <= names
        assert run.data.tags["checkpoint.last"].endswith("step_00000020")

    # the MLflow UI server, on loopback, lists the sweep's runs over its REST API
    assert_server_lists_runs(uri, exp.experiment_id, {r.info.run_id for r in runs}, tmp_path)


def check_baselines(client, runs, parent, tmp_path) -> None:
    """lr: one finished run under the sweep's run, marked in MLflow and trials.csv, its lead on
    the parent."""
    import pandas as pd

    baselines = {r.data.params["model.arch"]: r for r in runs
                 if r.data.tags.get("recsys.kind") == "baseline"}  # fmt: skip
    assert set(baselines) == {"lr"}
    for arch, run in baselines.items():
        assert run.info.status == "FINISHED" and run.info.run_name == f"{arch} (baseline)"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["recsys.status"] == "finished"
        lead = parent.data.metrics[f"lead_over_{arch}"]
        assert lead != 0.0 and abs(lead) < 1.0
    csv = pd.read_csv(client.download_artifacts(parent.info.run_id, "trials.csv", str(tmp_path)))
    assert sorted(csv["role"]) == ["baseline", "trial"]
    assert set(csv.loc[csv["role"] == "baseline", "arch"]) == {"lr"}
    assert (csv["worker_s"] > 0).all() and (csv["samples_seen"] == 20 * 64).all()


def assert_server_lists_runs(uri: str, experiment_id: str, run_ids: set[str], tmp_path) -> None:
    """The MLflow UI's REST API lists the sweep's runs: the tracking server's own, or a server
    started on loopback over the local store."""
    import json
    import urllib.request

    from tests.servers import MlflowServer

    server = None
    if not uri.startswith("http"):
        server = MlflowServer(uri, tmp_path / "served").start()
        uri = server.uri
    try:
        body = json.dumps({"experiment_ids": [experiment_id]}).encode()
        req = urllib.request.Request(
            f"{uri}/api/2.0/mlflow/runs/search", body, {"Content-Type": "application/json"}
        )
        listed = json.load(urllib.request.urlopen(req, timeout=30))["runs"]
        assert {r["info"]["run_id"] for r in listed} == run_ids
    finally:
        if server is not None:
            server.stop()
