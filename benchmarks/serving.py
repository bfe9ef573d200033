"""The served endpoint: an exported INT8 model (the debug config's 8 tables, trained briefly on
generated rows) behind ``mlflow models serve`` (one server process), called by one HTTP client
with 1 and 256 raw rows per request; requests per second and p50 / p99 latency, next to the same
MLflow model's ``predict`` in process on the same rows (the server's overhead as a ratio)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np

from benchmarks.common import init_world1, table


def exported_model(root: str) -> tuple[str, str, Any]:
    """Train the debug config 200 steps, export it to INT8 and register it in a SQLite store
    under ``root``: (store URI, model URI, raw example rows)."""
    from recsys.config_registry import debug
    from recsys.distributed.env import current
    from recsys.serving.export import export
    from recsys.serving.mlflow_model import log_served_model, serving_example
    from recsys.tracking.tracker import Tracker
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    init_world1()
    cfg = debug().with_overrides({"train.eval_every": 0, "train.checkpoint_every": 200})
    reporter = LocalReporter(os.path.join(root, "run"), 0)
    Trainer(cfg, current(use_gpu=False), reporter, log=lambda s: None).train()
    out = os.path.join(root, "export")
    export(cfg, reporter.completed()[-1], out, "int8")
    uri = f"sqlite:///{root}/mlflow.db"
    tracker = Tracker(uri)
    run_id = tracker.client.create_run(tracker.experiment("serving")).info.run_id
    example = serving_example(os.path.join(out, "prepared"))
    log_served_model(tracker, run_id, out, example, registered_name="bench")
    return uri, "models:/bench/1", example


def rows_of(example: Any, n: int) -> Any:
    """``n`` rows: the example's, repeated."""
    import pandas as pd

    return pd.concat([example] * (n // len(example) + 1), ignore_index=True).head(n)


def serve(uri: str, model: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager",
           "local", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": path}  # it starts `uvicorn` by name
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("mlflow models serve did not start within 300 s")


def latencies(call: Any, n: int) -> list[float]:
    call()  # warm
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def run(requests: int) -> str:
    import mlflow

    root = tempfile.mkdtemp(prefix="serving-bench-")
    proc = None
    try:
        uri, model, example = exported_model(root)
        mlflow.set_tracking_uri(uri)
        local = mlflow.pyfunc.load_model(model)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = serve(uri, model, port)
        results = []
        for n in (1, 256):
            frame = rows_of(example, n)
            body = '{"dataframe_split": ' + frame.to_json(orient="split", index=False) + "}"
            url = f"http://127.0.0.1:{port}/invocations"
            headers = {"Content-Type": "application/json"}
            request = urllib.request.Request(url, body.encode(), headers)

            def http(request: Any = request) -> None:
                with urllib.request.urlopen(request, timeout=60) as r:
                    json.loads(r.read())

            served = latencies(http, requests)
            inproc = latencies(lambda frame=frame: local.predict(frame), requests)
            results.append((n, served, inproc))
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for n, served, inproc in results:
        p50, p99 = (float(np.percentile(served, q)) * 1000 for q in (50, 99))
        i50, i99 = (float(np.percentile(inproc, q)) * 1000 for q in (50, 99))
        rows.append([n, f"{len(served) / sum(served):.1f}", f"{p50:.1f}", f"{p99:.1f}",
                     f"{i50:.1f}", f"{i99:.1f}", f"{p50 / i50:.2f}x"])  # fmt: skip
    head = (
        f"`mlflow models serve` (one process) and one sequential HTTP client, {requests} "
        "requests per size after one warm-up; in process: the same MLflow model's predict"
    )
    return head + "\n\n" + table(
        ["rows/request", "requests/s", "p50 ms", "p99 ms", "in-process p50 ms",
         "in-process p99 ms", "served / in-process (p50)"], rows,
    )  # fmt: skip
