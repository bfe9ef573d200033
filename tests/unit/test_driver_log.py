"""The sweep driver's MLflow writes for its trials (``recsys.tune.driver_log``): in order, in a
thread of their own, so that Tune's loop never waits for the store."""

from __future__ import annotations

import pickle
import re
import threading
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tracker
from recsys.tracking.tune_reports import CHECKPOINT_URI, REPORT_KEYS, RUN_ID
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


TRIAL = SimpleNamespace(trial_id="trial_1")


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


def test_a_report_the_store_could_not_take_is_logged_when_it_is_back_in_order(
    tmp_path, monkeypatch, caplog
):
    """MLflow unreachable at a report fails neither the report nor the sweep: a warning, and the
    report is tried again, then logged before the next, at its own step."""
    uri, exp, run = a_run(tmp_path)
    driver = a_log(tmp_path, uri, exp)
    down = [True]
    last_step = Tracker.last_step

    def flaky(self, run_id):
        if down.pop() if down else False:
            raise ConnectionError("store down")
        return last_step(self, run_id)

    monkeypatch.setattr(Tracker, "last_step", flaky)
    for step, auc in [(10, 0.6), (20, 0.7)]:
        driver.on_trial_result(0, [], TRIAL, result(run, step, auc))
    driver.on_trial_complete(0, [], TRIAL)
    assert re.search(r"unreachable \(store down\): \d report\(s\) or end\(s\) of this sweep's "
                     r"trials wait", caplog.text)  # fmt: skip
    assert "reachable again after" in caplog.text
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert MlflowClient(uri).get_run(run).data.tags["checkpoint.last"] == "c20"


def test_the_metrics_of_a_run_mlflow_refuses_are_dropped_at_its_end_and_the_next_logged(
    tmp_path, caplog
):
    """The metrics of a run MLflow no longer takes (deleted in its UI) are not tried forever in
    front of the others: dropped as the trial ends, named in a warning."""
    uri, exp, run = a_run(tmp_path)
    gone = Tracker(uri).trial_run(exp, "", "s", "trial_2", {})
    MlflowClient(uri).delete_run(gone)
    driver = a_log(tmp_path, uri, exp)
    other = SimpleNamespace(trial_id="trial_2")
    driver.on_trial_result(0, [], other, result(gone, 10, 0.5))
    driver.on_trial_complete(0, [], other)
    driver.on_trial_result(0, [], TRIAL, result(run, 10, 0.6))
    driver.on_experiment_end([])
    assert "refused the end of trial trial_2" in caplog.text
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
        callback.on_trial_complete(0, [], TRIAL)  # (its Train run: none, so not recorded)
        callback.on_experiment_end([])
    assert history(uri, run) == [(10, 0.6), (20, 0.7)]
    assert [s for s, _ in history(uri, run, "loss")] == [5, 10, 15, 20]
