"""MLflow bookkeeping: idempotent logging, re-attachment, and tracking-server outages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tag, Tracker
from tests.distributed.harness import free_port
from tests.servers import MlflowServer


def report(step: int, auc: float) -> dict:
    return {"step": step, "val_auc": auc, "loss_history": [(step - 5, 0.5), (step, 0.4)]}


def test_reattach_and_idempotent_logging(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    parent = t.parent_run(exp, "s")
    run = t.trial_run(exp, parent, "s", "trial_1", {"a": "1"})
    t.log_report(run, report(10, 0.6))
    # a restarted trial re-attaches (new Tracker, as after a driver restart) and replays step 10
    t2 = Tracker(uri)
    assert t2.parent_run(exp, "s") == parent
    assert t2.trial_run(exp, parent, "s", "trial_1", {"a": "1"}) == run
    t2.log_report(run, report(10, 0.6))
    t2.log_report(run, report(20, 0.7))
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run, "loss")] == [5, 10, 15, 20]
    assert [m.step for m in client.get_metric_history(run, "val_auc")] == [10, 20]
    assert len(client.search_runs([exp])) == 2


def test_a_run_made_without_its_params_gets_them_when_found_again(tmp_path):
    """A trial's run created, then the store went away before its params were logged: the retried
    opening finds that run (no second one) and logs the params it lacks."""
    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    parent = t.parent_run(exp, "s")
    run = t.trial_run(exp, parent, "s", "trial_1", {})  # as far as the creation got
    assert Tracker(uri).trial_run(exp, parent, "s", "trial_1", {"a": "1", "b": "2"}) == run
    assert MlflowClient(uri).get_run(run).data.params == {"a": "1", "b": "2"}
    assert len(MlflowClient(uri).search_runs([exp])) == 2


def test_a_run_trained_again_has_no_status_until_it_ends_again(tmp_path):
    """A halved reference's point paused at a rung (status ``stopped``), then trained on in the
    next round: its run, reopened, shows no outcome while it trains."""
    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, "p", "s", "s-baselines-fm-0", {})
    t.set_tags(run, {Tag.STATUS: "stopped"})
    t.finish(run)
    assert Tracker(uri).trial_run(exp, "p", "s", "s-baselines-fm-0", {}) == run
    found = MlflowClient(uri).get_run(run)
    assert found.info.status == "RUNNING" and Tag.STATUS not in found.data.tags


def test_a_resume_note_becomes_a_tag_of_the_trial_run(tmp_path):
    from recsys.tracking.report import MlflowReportCallback

    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})
    callback = MlflowReportCallback(uri, run)
    callback.after_report(None, [{**report(10, 0.6), "resume_note": "resumed on 3 of 2"}], None)
    callback.after_report(None, [report(20, 0.7)], None)
    data = MlflowClient(uri).get_run(run).data
    assert data.tags["recsys.resume_note"] == "resumed on 3 of 2"
    assert "resume_note" not in data.metrics and data.metrics["val_auc"] == 0.7


def test_the_tracker_opened_early_is_the_one_the_reports_use_after_a_pickle(tmp_path):
    """Ray pickles the callbacks list into Train's controller as one: the early opening
    (``OpenTrackerEarly``) must open the tracker of the very callback that logs the reports."""
    import cloudpickle

    from recsys.tracking.report import MlflowReportCallback, OpenTrackerEarly, report_callbacks

    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})
    callback, early = cloudpickle.loads(cloudpickle.dumps(report_callbacks(uri, run)))
    assert isinstance(callback, MlflowReportCallback) and isinstance(early, OpenTrackerEarly)
    assert early.callback is callback
    early.after_controller_start(None)
    assert callback._opening is not None  # opening in a thread, before any report
    callback._opening.join()
    opened = callback._tracker
    assert opened is not None
    callback.after_report(None, [report(10, 0.6)], None)
    assert callback.tracker() is opened
    assert MlflowClient(uri).get_run(run).data.metrics["val_auc"] == 0.6
    # a callback with an open tracker pickles without it (a thread or a store cannot travel)
    again = cloudpickle.loads(cloudpickle.dumps(callback))
    assert again._tracker is None and again.run_id == run


def test_an_early_opening_that_fails_raises_at_the_first_report_without_a_second_wait(
    tmp_path, monkeypatch
):
    from recsys.tracking import tracker
    from recsys.tracking.report import MlflowReportCallback

    opened = []

    def down(self, uri, keep=None):
        opened.append(uri)
        raise ConnectionError(f"{uri}: store down")

    monkeypatch.setattr(tracker.Tracker, "__init__", down)
    callback = MlflowReportCallback(f"sqlite:///{tmp_path}/m.db", "run")
    callback.open_early()
    with pytest.raises(ConnectionError, match="store down"):
        callback.after_report(None, [report(10, 0.6)], None)
    assert len(opened) == 1  # the early opening's error, not a second opening's wait


def test_a_runs_constants_are_logged_when_they_change_not_every_report(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})
    sizes = {"emb_bytes": 4096.0, "emb_bytes_rank0": 2048.0}
    t.log_report(run, {**report(10, 0.6), **sizes})
    Tracker(uri).log_report(run, {**report(20, 0.7), **sizes})  # another process, as in Train
    t.log_report(run, {**report(30, 0.7), **sizes, "emb_bytes_rank0": 1024.0})  # resharded
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run, "emb_bytes")] == [10]
    assert [m.value for m in client.get_metric_history(run, "emb_bytes_rank0")] == [2048, 1024]
    assert [m.step for m in client.get_metric_history(run, "val_auc")] == [10, 20, 30]


def test_unreachable_store_is_a_clear_error_before_launch():
    port = free_port()
    t0 = time.time()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port} is unreachable"):
        Tracker(f"http://127.0.0.1:{port}").check_reachable()
    assert time.time() - t0 < 30  # no minutes of retries


def test_refused_credentials_are_named_before_launch():
    """A server that answers 401 (a tracking server behind auth, wrong or no credentials)."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.send_response(401)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"You are not authenticated.")

        do_GET = do_POST = _refuse

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ConnectionError, match=f"{uri} refused the credentials"):
            Tracker(uri).check_reachable()
    finally:
        server.shutdown()


OPEN = """
import sys
from recsys.tracking import tracker as tracking
if sys.argv[2] == "sql":  # as for a postgresql:// URI: no SQLite pre-check
    tracking.open_store = lambda uri: None
tracking.Tracker(sys.argv[1]).check_reachable()
"""


def check_names_old_store(uri: str, how: str, current: str) -> float:
    """Open ``uri`` (set back to MLflow 2.x's revision 0584bdc529eb) in a new process, ``how`` as
    in ``OPEN``: the error names the revisions and `mlflow db upgrade`. Returns its seconds."""
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-c", OPEN, uri, how], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0, done.stderr[-2000:]
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(f"ConnectionError: MLflow store {uri} was made by an older")
    assert f"mlflow db upgrade {uri}" in message and "does not migrate" in message
    assert f"schema revision 0584bdc529eb, this MLflow expects {current}" in message
    return time.time() - t0


def test_a_store_older_than_this_mlflow_is_named_and_left_as_it_is(tmp_path):
    """An SQLite store whose schema revision is older than the installed MLflow's (as one made by
    an older MLflow): a clear error naming `mlflow db upgrade`, within seconds (not the retries
    for a migration in flight), and the store is not migrated. The check of any SQL store URI
    (``check_reachable``) names it the same way. (Each in a new process: MLflow caches a store
    it has checked.)"""
    import sqlite3

    db = tmp_path / "m.db"
    uri = f"sqlite:///{db}"
    MlflowClient(uri).search_experiments()
    con = sqlite3.connect(db)
    (current,) = con.execute("select version_num from alembic_version").fetchone()
    con.execute("update alembic_version set version_num = '0584bdc529eb'")  # MLflow 2.x's
    con.commit()
    con.close()
    for how in ("sqlite", "sql"):
        assert check_names_old_store(uri, how, current) < 30
    con = sqlite3.connect(db)
    assert con.execute("select version_num from alembic_version").fetchone() == ("0584bdc529eb",)
    con.close()


def test_a_postgresql_store_older_than_this_mlflow_is_named_and_left_as_it_is(postgres):
    """The same for a ``postgresql://`` store (a real PostgreSQL, its schema revision set back to
    MLflow 2.x's): named with `mlflow db upgrade`, and left as it is."""
    name = f"old{os.getpid()}"
    uri = postgres.database(name)
    ((current,),) = postgres.sql("select version_num from alembic_version", name)
    postgres.sql("update alembic_version set version_num = '0584bdc529eb'", name)
    check_names_old_store(uri, "sql", current)
    assert postgres.sql("select version_num from alembic_version", name) == [("0584bdc529eb",)]


@pytest.mark.slow
def test_server_outage_buffers_and_retries(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    server = MlflowServer(f"sqlite:///{tmp_path}/m.db", tmp_path / "artifacts").start()
    uri = server.uri
    t = Tracker(uri)
    exp = t.experiment("s", None)
    parent = t.parent_run(exp, "s")
    run = t.trial_run(exp, parent, "s", "trial_1", {})
    t.log_report(run, report(10, 0.6))
    server.stop()
    t.log_report(run, report(20, 0.7))  # the server is gone: no exception, kept for retry
    assert "unreachable" in caplog.text and t._pending[run]
    # a trial that starts while the server is down waits for it instead of failing
    back = threading.Timer(3.0, server.start)
    back.start()
    try:
        second = t.trial_run(exp, parent, "s", "trial_2", {"a": "1"})
        assert "recsys.trial_id=trial_2 waits for it (up to 600 s)" in caplog.text
        assert MlflowClient(uri).get_run(second).data.params == {"a": "1"}
        t.log_report(run, report(30, 0.8))  # back: the kept metrics go out with the new ones
        url = f"{uri}/api/2.0/mlflow/metrics/get-history?run_id={run}&metric_key=val_auc"
        history = json.load(urllib.request.urlopen(url, timeout=10))["metrics"]
        assert sorted(m["step"] for m in history) == [10, 20, 30]
    finally:
        back.join()
        server.stop()


def test_diverged_trial_is_recorded_as_such(tmp_path):
    from types import SimpleNamespace

    from recsys.config import ExperimentConfig
    from recsys.tune.results import trial_frame
    from recsys.tune.space import SearchSpace
    from recsys.tune.trial import finish_trial

    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})
    metrics = {"step": 4, "diverged": 1.0, "val_auc": float("nan"), "loss_history": [(4, 1e9)]}
    result = SimpleNamespace(
        metrics=metrics,
        checkpoint=None,
        best_checkpoints=[],
        error=None,
        config={"params": {}},
        metrics_dataframe=None,
    )
    finish_trial(t, run, result, "max", 10)
    got = MlflowClient(uri).get_run(run)
    assert got.data.tags["recsys.status"] == "diverged" and got.info.status == "FAILED"
    space = SearchSpace(name="s", source="s.yaml", base=ExperimentConfig(), dimensions=[])
    (row,) = trial_frame([result], space).to_dict("records")
    assert row["status"] == "diverged" and not row["pareto"]


def test_backfill_logs_reports_mlflow_missed(tmp_path, monkeypatch):
    """The driver died after Ray Train registered the step-20 report but before MLflow got it:
    the restored trial logs it before training on, so the step axis has no gap."""
    from types import SimpleNamespace

    from recsys.train import results
    from recsys.tune import trial

    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    run = t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})
    t.log_report(run, report(10, 0.6))
    persisted = [(None, report(10, 0.6)), (None, report(20, 0.7))]
    fake = SimpleNamespace(from_path=lambda path: SimpleNamespace(best_checkpoints=persisted))
    monkeypatch.setattr(results, "TrainResult", fake)
    assert trial.backfill(Tracker(uri), run, str(tmp_path / "train" / "trial_1")) == 1
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run, "loss")]
    assert steps == [5, 10, 15, 20]
    monkeypatch.setattr(results, "TrainResult", SimpleNamespace(from_path=_no_run))
    assert trial.backfill(Tracker(uri), run, str(tmp_path / "none")) == 0


def _no_run(path):
    raise RuntimeError(f"Experiment folder {path} doesn't exist.")


def test_a_store_whose_creation_raced_is_retried_and_says_so(tmp_path, monkeypatch, caplog):
    import mlflow.store.db.utils as db_utils
    import sqlalchemy

    real, calls = db_utils._initialize_tables, []

    def racing(engine):  # as when another process was migrating the same fresh file
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("ALTER TABLE", {}, "duplicate column name: step")
        return real(engine)

    monkeypatch.setattr(db_utils, "_initialize_tables", racing)
    uri = f"sqlite:///{tmp_path}/fresh.db"
    t = Tracker(uri)
    assert len(calls) == 2 and "raced another process" in caplog.text
    exp = t.experiment("works", None)
    assert MlflowClient(uri).get_experiment(exp).name == "works"


def _open_and_use(uri: str, name: str, barrier) -> str:
    barrier.wait()  # every process opens the fresh store at the same moment
    t = Tracker(uri)
    run = t.trial_run(t.experiment(name, None), "p", "s", name, {})
    t.log_report(run, report(10, 0.6))
    return run


def test_processes_opening_one_fresh_store_at_once_all_get_a_working_store(tmp_path):
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path}/shared.db"
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        runs = pool.starmap(_open_and_use, [(uri, f"e{i}", barrier) for i in range(4)])
    client = MlflowClient(uri)
    assert sorted(e.name for e in client.search_experiments()) == [
        "Default",
        "e0",
        "e1",
        "e2",
        "e3",
    ]
    for run in runs:
        assert [m.step for m in client.get_metric_history(run, "val_auc")] == [10]


def test_trial_status_names_how_a_trial_ended():
    from recsys.tune.results import trial_status

    assert trial_status({"step": 100}, 100) == "finished"
    assert trial_status({"step": 40}, 100) == "stopped"  # ASHA ended it at a rung
    assert trial_status({"step": 40, "early_stopped": 1.0}, 100) == "early_stopped"
    assert trial_status({"step": 4, "diverged": 1.0}, 100) == "diverged"
    assert trial_status({"step": 0, "infeasible": 1.0}, 100) == "infeasible"


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_an_artifact_a_full_disk_refuses_is_kept_and_named(tmp_path, monkeypatch, caplog):
    """The artifact store's disk is full: no exception, the text and the file are kept under
    the sweep's folder, and the warning names where and the command that logs them later."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    keep = tmp_path / "unlogged"
    t = Tracker(f"sqlite:///{tmp_path}/m.db", keep=str(keep))
    exp = t.experiment("s")
    run = t.parent_run(exp, "s")
    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", _disk_full)
    monkeypatch.setattr(LocalArtifactRepository, "log_artifacts", _disk_full)
    t.log_text(run, "trial,val_auc\n1,0.8\n", "trials.csv")
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"\x89PNG...")
    t.log_file(run, str(plot), "plots")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    t.log_folder(run, str(ckpt), "checkpoint_best")
    assert (keep / run / "trials.csv").read_text() == "trial,val_auc\n1,0.8\n"
    assert (keep / run / "plots" / "plot.png").read_bytes() == b"\x89PNG..."
    later = f"mlflow artifacts log-artifacts --run-id {run} --local-dir {keep / run}"
    assert caplog.text.count(later) == 2 and "No space left on device" in caplog.text
    assert f"it stays at {ckpt}" in caplog.text  # a checkpoint is not copied: it is on disk
    assert MlflowClient(t.uri).list_artifacts(run) == []


def test_a_local_artifact_root_without_space_is_refused_before_launch(tmp_path, monkeypatch):
    from collections import namedtuple

    from recsys.tracking import tracker as tracking

    t = Tracker(f"sqlite:///{tmp_path}/m.db")
    t.check_artifact_space("s")  # this machine's disk has room
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(tracking.shutil, "disk_usage", lambda p: usage(1, 1, 10 * 2**20))
    root = tmp_path / "mlartifacts" / "s"
    with pytest.raises(ConnectionError, match=f"artifact root {root} has 10 MiB free"):
        t.check_artifact_space("s")


def test_reading_a_finished_train_run_leaves_out_rays_snapshot_note(monkeypatch, caplog):
    """Ray's checkpoint manager says at INFO that it found the run's snapshot, with advice for a
    new training job; reading a finished trial's result (each trial ASHA stops) leaves that out,
    keeps Ray's warnings, and restores the logger's level."""
    import logging
    from types import SimpleNamespace

    from recsys.train import results

    log = logging.getLogger(results.RAY_SNAPSHOT_LOGGER)

    def from_path(path):
        log.info("A run snapshot was found in storage folder at: %s", path)
        log.warning("a warning about %s", path)
        return SimpleNamespace(best_checkpoints=[])

    monkeypatch.setattr(results, "TrainResult", SimpleNamespace(from_path=from_path))
    monkeypatch.setattr(logging.getLogger("ray"), "propagate", True)  # (caplog: the root)
    before = log.level
    with caplog.at_level(logging.INFO):
        results.train_result("/tmp/nowhere/trial_1")
    messages = [r.getMessage() for r in caplog.records if r.name == results.RAY_SNAPSHOT_LOGGER]
    # (a handler another test left on Ray's loggers may show a record twice: kinds, not copies)
    assert set(messages) == {"a warning about /tmp/nowhere/trial_1"} and log.level == before


def test_a_port_that_holds_401_or_403_is_not_a_refusal_of_credentials():
    """An unreachable store whose port holds "403" (e.g. 40395) is unreachable, not a store that
    refused the credentials; an HTTP 401 or 403 is."""
    from recsys.tracking.store import refused_credentials

    uri = "http://127.0.0.1:40395"
    down = (f"API request to {uri}/api/2.0/mlflow/experiments/search failed with exception "
            "HTTPConnectionPool(host='127.0.0.1', port=40395): Max retries exceeded (Caused by "
            "NewConnectionError: [Errno 111] Connection refused)")  # fmt: skip
    assert not refused_credentials(down, uri)
    assert not refused_credentials("http://10.0.0.1:4013/x unreachable", "http://10.0.0.2:9")
    said = "API request to endpoint /api/2.0/mlflow/experiments/search failed with error code "
    assert refused_credentials(said + "403 != 200. Response body: 'Forbidden'", uri)
    assert refused_credentials(said + "401 != 200", uri)
    assert refused_credentials("RESOURCE: UNAUTHENTICATED", uri)
