"""The sweep driver's MLflow writes for its trials (``recsys.tune.driver_log``): in order, in a
thread of their own, so that Tune's loop never waits for the store."""

from __future__ import annotations

import os
import pickle
import re
import threading
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tracker
from recsys.tracking.tune_reports import CHECKPOINT_URI, REPORT_KEYS, RUN_ID
from recsys.tune import driver_log
from recsys.tune.driver_log import TrialLog
from recsys.tune.trial import TrialSpec


def report(step: int, auc: float) -> dict:
    return {"step": step, "val_auc": auc, "loss_history": [(step - 5, 0.5), (step, 0.4)]}


def a_run(tmp_path) -> tuple[str, str, str]:
    """A sweep's store with one trial's run: (its URI, the experiment, the run)."""
    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    return uri, exp, t.trial_run(exp, t.parent_run(exp, "s"), "s", "trial_1", {})


def a_log(tmp_path, uri: str, exp: str) -> TrialLog:
    return TrialLog(TrialSpec("s", {}, str(tmp_path), uri, exp, "", 1, False, 1.0, 0), steps=20)


def result(run: str, step: int, auc: float) -> dict:
    """The Tune result of a training's report, as ``ReportToTune`` hands it on."""
    keys = ",".join(report(step, auc))
    return {**report(step, auc), RUN_ID: run, REPORT_KEYS: keys, CHECKPOINT_URI: f"c{step}"}


TRIAL = SimpleNamespace(trial_id="trial_1", config={"params": {}})  # (as a Tune trial)


def history(uri: str, run: str, key: str = "val_auc") -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run, key)]


def test_a_sweeps_reports_reach_mlflow_from_the_driver_as_tune_got_them(tmp_path):
    """In a sweep, Train's controller only adds the run, the report's keys and its checkpoint's
    URI to each report it hands Tune (``ReportToTune``); the driver logs them (``TrialLog``,
    pickled as Tune keeps its callbacks), without the keys Tune adds, and skips a result no
    training reported (a refused trial's)."""
    import pyarrow.fs

    from recsys.tracking.tune_reports import ReportToTune

    uri, exp, run = a_run(tmp_path)
    sent: list[dict] = []
    callback = ReportToTune.__new__(ReportToTune)  # (its __init__ needs a Tune session)
    callback.run_id, callback._training_actor_item_queue = run, SimpleNamespace(put=sent.append)
    checkpoint = SimpleNamespace(filesystem=pyarrow.fs.LocalFileSystem(), path=f"{tmp_path}/c10")
    callback.after_report(
        None, [{**report(10, 0.6), "resume_note": "resumed on 3 of 2"}], checkpoint
    )
    callback.after_report(None, [report(20, 0.7)], None)
    driver = pickle.loads(pickle.dumps(a_log(tmp_path, uri, exp)))
    tunes = {"training_iteration": 1, "time_total_s": 3.0, "timestamp": 17, "pid": 5, "done": 0}
    for sent_result in sent:
        driver.on_trial_result(0, [], TRIAL, {**sent_result, **tunes})
    driver.on_trial_result(0, [], TRIAL, {"infeasible": 1.0, "step": 0, **tunes})
    driver.on_experiment_end([])
    data = MlflowClient(uri).get_run(run).data
    assert data.metrics["val_auc"] == 0.7 and not set(data.metrics) & set(tunes)
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert [s for s, _ in history(uri, run, "loss")] == [5, 10, 15, 20]
    assert data.tags["checkpoint.last"] == f"{tmp_path}/c10"
    assert data.tags["recsys.resume_note"] == "resumed on 3 of 2"
    assert not driver.writer.running()  # the experiment's end ends the thread


def test_tunes_loop_never_waits_for_the_store_and_a_trials_end_waits_for_its_reports(
    tmp_path, monkeypatch
):
    """A store that does not answer holds the driver's thread, not Tune's loop: each result is
    only queued. The trial's end returns once its reports are logged, in order."""
    uri, exp, run = a_run(tmp_path)
    driver = a_log(tmp_path, uri, exp)
    answer, asked = threading.Event(), threading.Event()
    log_report = Tracker.log_report

    def slow(self, run_id, metrics):
        asked.set()
        assert answer.wait(60), "the test never let the store answer"
        log_report(self, run_id, metrics)

    monkeypatch.setattr(Tracker, "log_report", slow)
    for step, auc in [(10, 0.6), (20, 0.7)]:
        driver.on_trial_result(0, [], TRIAL, result(run, step, auc))
    assert asked.wait(30)  # the thread is in the store ...
    assert driver.writer.pending() == 2 and history(uri, run) == []  # ... and the loop went on
    ended = threading.Thread(target=driver.on_trial_complete, args=(0, [], TRIAL))
    ended.start()
    ended.join(0.5)
    assert ended.is_alive()  # the trial's end waits for its reports
    answer.set()
    ended.join(30)
    assert not ended.is_alive() and driver.writer.pending() == 0
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]


def a_store_down(monkeypatch) -> threading.Event:
    """MLflow's writes fail as a server that went away makes them, until the event is set."""
    back = threading.Event()
    log_batch = MlflowClient.log_batch

    def down(self, *args, **kwargs):
        if not back.is_set():
            raise ConnectionError("Max retries exceeded (store down)")
        return log_batch(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", down)
    return back


def test_a_report_the_store_could_not_take_is_logged_when_it_is_back_in_order(
    tmp_path, monkeypatch, caplog
):
    """MLflow unreachable at a report fails neither the report nor the sweep: a warning, and the
    report is tried again, then logged before the next, at its own step, with its tags."""
    uri, exp, run = a_run(tmp_path)
    driver = a_log(tmp_path, uri, exp)
    back = a_store_down(monkeypatch)
    for step, auc in [(10, 0.6), (20, 0.7)]:
        driver.on_trial_result(0, [], TRIAL, result(run, step, auc))
    ended = threading.Thread(target=driver.on_trial_complete, args=(0, [], TRIAL))
    ended.start()
    ended.join(30)
    assert not ended.is_alive()  # the store is down: a trial's end does not wait for it
    assert driver.writer.failing() and history(uri, run) == []
    back.set()
    driver.on_experiment_end([])
    assert re.search(r"unreachable \(Max retries exceeded \(store down\)\): \d report\(s\) "
                     r"or end\(s\) of this sweep's trials wait", caplog.text)  # fmt: skip
    assert "reachable again after" in caplog.text
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert [s for s, _ in history(uri, run, "loss")] == [5, 10, 15, 20]
    assert MlflowClient(uri).get_run(run).data.tags["checkpoint.last"] == "c20"


def test_the_experiments_end_gives_up_on_a_store_that_stays_down(tmp_path, monkeypatch, caplog):
    """A phase's end waits for the store up to ``RECSYS_TRACKING_WAIT_S``, says so, then gives
    up on what is left, naming where Ray Train keeps it; its thread ends."""
    uri, exp, run = a_run(tmp_path)
    driver = a_log(tmp_path, uri, exp)
    a_store_down(monkeypatch)
    monkeypatch.setenv("RECSYS_TRACKING_WAIT_S", "3")
    monkeypatch.setattr(driver_log, "SAY_WAIT_S", 1.0)
    driver.on_trial_result(0, [], TRIAL, result(run, 10, 0.6))
    driver.on_experiment_end([])
    assert "waiting up to 2 s more for 2 report(s) or end(s)" in caplog.text
    assert "not logged after 3 s, given up" in caplog.text and str(tmp_path) in caplog.text
    assert driver.writer.pending() == 0 and not driver.writer.running()


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_stopped_trial_whose_record_failed_halfway_is_ended_when_tried_again(
    tmp_path, checkpointed
):
    """The driver wrote a stopped trial's status, then MLflow failed at its end: tried again, the
    record ends the run as its first try would have (``finish_trial``: FINISHED with a
    checkpoint; KILLED without), its status as it was."""
    from recsys.tune.driver_log import record_stopped

    uri, exp, run = a_run(tmp_path)
    t = Tracker(uri, strict=True)
    tags = {"recsys.status": "stopped", **({"checkpoint.last": "c10"} if checkpointed else {})}
    t.set_tags(run, tags)
    record_stopped(t, exp, str(tmp_path / "train"), "trial_1", "max", 20)
    got = MlflowClient(uri).get_run(run)
    assert got.info.status == ("FINISHED" if checkpointed else "KILLED")
    assert got.data.tags["recsys.status"] == "stopped"


def test_a_report_mlflow_refuses_is_dropped_with_a_warning_and_the_next_logged(tmp_path, caplog):
    """The report of a run MLflow no longer takes (deleted in its UI) is not tried forever in
    front of the others: dropped, named in a warning."""
    uri, exp, run = a_run(tmp_path)
    gone = Tracker(uri).trial_run(exp, "", "s", "trial_2", {})
    MlflowClient(uri).delete_run(gone)
    driver = a_log(tmp_path, uri, exp)
    other = SimpleNamespace(trial_id="trial_2", config={"params": {}})
    driver.on_trial_result(0, [], other, result(gone, 10, 0.5))
    driver.on_trial_complete(0, [], other)
    driver.on_trial_result(0, [], TRIAL, result(run, 10, 0.6))
    driver.on_experiment_end([])
    assert "could not write a report of trial trial_2" in caplog.text
    assert history(uri, run) == [(10, 0.6)]


def old_pickle(monkeypatch, name: str, state: dict) -> bytes:
    """How a Tuner state pickled before names the callback ``recsys.tune.trial.<name>``."""
    from recsys.tune import trial

    then = type(name, (), {"__module__": "recsys.tune.trial"})  # the class as it was
    then.__getstate__ = lambda self: state  # type: ignore[attr-defined]
    with monkeypatch.context() as m:
        m.setattr(trial, name, then)
        return pickle.dumps(then())


@pytest.mark.parametrize("names", [["LogTrialReports", "FinishStoppedTrials"],
                                   ["FinishStoppedTrials"]])  # fmt: skip
def test_the_callbacks_of_a_sweep_started_before_are_found_and_log_each_report_once(
    tmp_path, monkeypatch, names
):
    """A sweep's Tuner state pickled before the driver's writes moved names
    ``recsys.tune.trial.FinishStoppedTrials`` (and, since the reports went through the driver,
    ``LogTrialReports``), with their state then: a resume finds them, and they log the reports."""
    uri, exp, run = a_run(tmp_path)
    before = {
        "LogTrialReports": {"uri": uri, "keep": None, "_tracker": None, "_unlogged": [],
                            "_runs": {}},
        "FinishStoppedTrials": {"uri": uri, "experiment_id": exp, "mode": "max", "steps": 20,
                                "train_storage": str(tmp_path / "train")},
    }  # fmt: skip
    callbacks = [pickle.loads(old_pickle(monkeypatch, name, before[name])) for name in names]
    for step, auc in [(10, 0.6), (20, 0.7)]:
        for callback in callbacks:
            callback.on_trial_result(0, [], TRIAL, result(run, step, auc))
    for callback in callbacks:
        callback.on_trial_complete(0, [], TRIAL)  # (no Train run: then recorded as stopped)
        callback.on_experiment_end([])
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert [s for s, _ in history(uri, run, "loss")] == [5, 10, 15, 20]


@pytest.mark.parametrize("finished", [False, True])
def test_a_resume_writes_what_a_driver_killed_with_writes_queued_left_out(
    tmp_path, monkeypatch, finished
):
    """An earlier driver saw trial_1 finish and trial_2 stopped by ASHA, then was killed with their
    last writes queued (the store was down): Tune restores neither. At the resumed experiment's
    first step (``finished``: at its end, all its trials ended before) the driver logs trial_1's
    missing report from Ray Train's and records trial_2; trial_4, complete in MLflow, is not
    read again, and each other one is read once (its run found by the one search of the sweep's
    trial runs); a running trial is left to its own ``backfill``."""
    from recsys.train import results

    uri, exp, run = a_run(tmp_path)
    t = Tracker(uri)
    stopped = t.trial_run(exp, "", "s", "trial_2", {})
    running = t.trial_run(exp, "", "s", "trial_3", {})
    t.log_report(run, report(10, 0.6))
    t.set_tags(run, {"recsys.status": "finished"})
    t.finish(run)
    persisted = {
        "trial_1": [report(10, 0.6), report(20, 0.7)],
        "trial_2": [report(10, 0.55)],
        "trial_3": [report(10, 0.5)],
    }

    reads = []

    def from_path(path):
        assert not path.endswith("trial_4"), "a trial complete in MLflow was read again"
        reads.append(os.path.basename(path).removeprefix("trial_"))
        reports = persisted[os.path.basename(path).removeprefix("trial_")]
        return SimpleNamespace(
            best_checkpoints=[(None, r) for r in reports], metrics=reports[-1], checkpoint=None,
            get_best_checkpoint=lambda *args: None,
        )  # fmt: skip

    monkeypatch.setattr(results, "TrainResult", SimpleNamespace(from_path=from_path))
    driver = a_log(tmp_path, uri, exp)
    found_again = []
    monkeypatch.setattr(Tracker, "find_trial_run", lambda *a: found_again.append(a[2]))
    complete = t.trial_run(exp, "", "s", "trial_4", {})
    t.log_report(complete, report(20, 0.65))
    t.set_tags(complete, {"recsys.status": "finished"})
    t.finish(complete)

    def trial(name, status, step):  # (as a Tune trial)
        return SimpleNamespace(trial_id=name, config={}, status=status, last_result=step)

    trials = [
        trial("trial_1", "TERMINATED", {"step": 20}),
        trial("trial_2", "TERMINATED", {"step": 10}),
        trial("trial_4", "TERMINATED", {"step": 20}),
    ]
    if not finished:
        trials.append(trial("trial_3", "PENDING", {}))
        driver.on_step_begin(0, trials)
    driver.on_experiment_end(trials)
    assert sorted(reads) == ["trial_1", "trial_2"] and found_again == []
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert history(uri, stopped) == [(10, 0.55)]
    client = MlflowClient(uri)
    assert client.get_run(stopped).data.tags["recsys.status"] == "stopped"
    assert client.get_run(stopped).info.status == "FINISHED"
    assert history(uri, running) == [] and client.get_run(running).info.status == "RUNNING"
