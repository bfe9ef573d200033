"""``mlflow models serve`` of exported INT8 models (Criteo-shaped on generated rows, and own data
with multi-hot and weighted lists; by version, and by the alias ``@champion``), called over HTTP
as a client would, with raw rows as ``dataframe_split`` JSON: the scores equal the MLflow model's
in process; a bad request gets HTTP 400 whose message names the column (and the row, where one
row is the problem), and the server goes on serving."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest

from tests.distributed.common import (
    export_config,
    export_rank,
    own_data_cfg,
    own_data_rank,
    raw_test_rows,
)
from tests.distributed.harness import run_ranks
from tests.servers import MlflowServer

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def serve_command(model_uri: str) -> list[str]:
    """The README's serving command (host and port replaced by the fixture's)."""
    return ["mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
            "--host", "127.0.0.1", "--port", "5001"]  # fmt: skip


def post(url: str, rows: pd.DataFrame, dates: str = "iso") -> tuple[int, dict]:
    """POST ``rows`` to ``url``'s ``/invocations`` as ``dataframe_split`` JSON, timestamps as
    ISO 8601 strings (``dates="epoch"``: as pandas' numbers): (status, body)."""
    split = rows.to_json(orient="split", index=False, date_format=dates)
    body = '{"dataframe_split": ' + split + "}"
    request = urllib.request.Request(
        f"{url}/invocations", body.encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scores(body: dict, tasks: list[str]) -> np.ndarray:
    return np.array([[row[t] for t in tasks] for row in body["predictions"]])


def logged(out: str, tmp_path, name: str) -> str:
    """The export in ``out`` logged and registered in a SQLite store; the store's URI."""
    from recsys.serving.mlflow_model import log_served_model, serving_example
    from recsys.tracking.tracker import Tracker

    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = Tracker(uri)
    run_id = tracker.client.create_run(tracker.experiment("e")).info.run_id
    example = serving_example(os.path.join(out, "prepared"))
    log_served_model(tracker, run_id, out, example, registered_name=name)
    return uri


def check_endpoint(monkeypatch, uri: str, model: str, rows: pd.DataFrame, bad: list) -> None:
    """Serve ``model`` (``models:/NAME/1`` or ``models:/NAME@ALIAS``) and call it: ``rows``
    score as in process; each ``(rows, words)`` of ``bad`` gets a 400 whose message holds every
    word; then ``rows`` again."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    want = mlflow.pyfunc.load_model(model).predict(rows)
    server = MlflowServer(command=serve_command(model)).start(timeout=300)
    try:
        status, body = post(server.uri, rows)
        assert status == 200, body
        tasks = list(want.columns)
        np.testing.assert_allclose(scores(body, tasks), want.to_numpy(), rtol=0, atol=1e-6)
        for frame, words, *dates in bad:
            status, body = post(server.uri, frame, *dates)
            assert status == 400, body
            message = body["message"]
            assert all(w in message for w in words), (words, message[-2000:])
        status, body = post(server.uri, rows.head(1))  # still serving
        assert status == 200 and len(body["predictions"]) == 1
    finally:
        server.stop()


@pytest.mark.extended  # (the server's path: the own-data case below)
def test_criteo_shaped_model_served_over_http(tmp_path, monkeypatch):
    from recsys.serving.export import export
    from recsys.serving.mlflow_model import serving_example

    run_ranks(export_rank, str(tmp_path / "ckpt"), world_size=2)
    out = str(tmp_path / "out")
    export(export_config(), str(tmp_path / "ckpt" / "step_00000030"), out, "int8")
    uri = logged(out, tmp_path, "criteo-shaped")
    rows = serving_example(os.path.join(out, "prepared"))
    text = rows.astype({"I1": object})
    text.loc[2, "I1"] = "many"  # text in a numeric column: MLflow's schema check names it
    bad = [(rows.drop(columns=["cat_3"]), ["cat_3"]), (text, ["I1"])]
    check_endpoint(monkeypatch, uri, "models:/criteo-shaped/1", rows, bad)


def test_own_data_model_served_over_http(demo_prepared, tmp_path, monkeypatch):
    from recsys.serving.export import export

    run_ranks(own_data_rank, demo_prepared, str(tmp_path / "ckpt"))
    out = str(tmp_path / "out")
    export(own_data_cfg(demo_prepared), str(tmp_path / "ckpt" / "step_00000030"), out, "int8")
    uri = logged(out, tmp_path, "own-data")
    rows = raw_test_rows(demo_prepared).drop(columns=["click", "like"]).head(40)
    rows = rows.reset_index(drop=True)
    weights = rows["history_weights"]
    row = next(i for i, w in enumerate(weights) if w is not None and len(w) > 0)
    extra = rows.copy()  # one weight more than the row's history: types MLflow's schema takes
    extra.at[row, "history_weights"] = [*(float(w) for w in weights[row]), 1.0]
    bad = [(extra, [f"column 'history_weights', row {row}", "as many weights as history"]),
           (rows.drop(columns=["user_id"]), ["user_id"]),
           # timestamps as epoch milliseconds: MLflow reads them as nanoseconds (1970)
           (rows, ["column 'event_ts', row 0", "ISO 8601"], "epoch")]  # fmt: skip
    from mlflow import MlflowClient

    MlflowClient(uri).set_registered_model_alias("own-data", "champion", "1")  # served by alias
    check_endpoint(monkeypatch, uri, "models:/own-data@champion", rows, bad)
