"""What a sweep leaves for the MLflow UI (``Tracker.show_sweep``), on a store made by hand: its
experiment marked as model training, its saved view of the runs (filter, order, columns, charts)
and the link that opens it, and its run's one-line description. The real UI, in a browser, is
checked on a real sweep in tests/ray/test_sweep.py."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tags import Tag
from recsys.tracking.tracker import MODEL_TRAINING, Tracker
from recsys.tracking.view import compare_line, runs_link, searched_axes, ui_address

SEARCHED = [  # (trial id, searched values, best_val_auc)
    ("t_0", {"model.interaction": "dot", "optim.lr": 0.01, "qr.threshold": None, "dim": 8}, 0.71),
    ("t_1", {"model.interaction": "dcn", "optim.lr": 0.02, "qr.threshold": 1000, "dim": 16}, 0.74),
    ("t_2", {"model.interaction": "cat", "optim.lr": 0.05, "qr.threshold": None, "dim": 16}, 0.72),
]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (creating one takes seconds): each test its own sweeps."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('view')}/m.db"
    Tracker(uri)
    return uri


def sweep_store(uri: str, name: str) -> tuple[Tracker, str, str]:
    """A finished sweep as the sweep leaves it: its run (metric, mode, best trial, lead over the
    baseline), three trials, a baseline, two seed runs of the best trial with their mean."""
    t = Tracker(uri)
    exp = t.experiment(name)
    parent = t.parent_run(exp, name)
    t.set_tags(parent, {Tag.METRIC: "val_auc", Tag.MODE: "max", Tag.BEST_TRIAL: "t_1"})
    t.log_values(parent, {"best_val_auc": 0.74, "lead_over_lr": 0.03})
    runs = {}
    for trial, searched, auc in SEARCHED:
        params = {k: str(v) for k, v in searched.items()}
        runs[trial] = run = t.trial_run(exp, parent, name, trial, params)
        t.set_tags(run, {Tag.SEARCHED: json.dumps(searched), Tag.STATUS: "finished"})
        t.log_values(run, {"best_val_auc": auc})
    base = t.trial_run(exp, parent, name, "b_0", {"model.arch": "lr"}, kind="baseline")
    t.log_values(base, {"best_val_auc": 0.70})
    for seed in (1, 2):
        run = t.trial_run(exp, runs["t_1"], name, f"c_{seed}", {}, kind="confirm",
                          tags={Tag.CONFIRMS: "t_1"})  # fmt: skip
        t.log_values(run, {"best_val_auc": 0.73})
    t.log_values(runs["t_1"], {"confirmed_mean_val_auc": 0.73})
    refit = t.trial_run(exp, parent, name, "t_1.refit", {}, kind="refit")  # its own rows: 0.99
    t.log_values(refit, {"best_val_auc": 0.99})
    return t, exp, parent


def test_show_sweep_marks_the_experiment_saves_its_view_and_describes_its_run(uri):
    t, exp, parent = sweep_store(uri, "s")
    link = t.show_sweep("s")
    assert link == (
        f"http://127.0.0.1:5000/#/experiments/{exp}/runs?workflowType=machine_learning"
        "&viewStateShareKey=recsys"
    )
    client = MlflowClient(uri)
    tags = client.get_experiment(exp).tags
    assert tags[Tag.EXPERIMENT_KIND] == MODEL_TRAINING == "custom_model_development"
    saved = json.loads(tags["mlflow.sharedViewState.recsys"])  # the UI's saved-view envelope
    assert saved["name"] == "s: its runs by best_val_auc"
    assert isinstance(saved["createdAt"], int) and isinstance(saved["state"], str)
    view = json.loads(saved["state"])
    # the trials and baselines, best first: the filter is one MLflow's search accepts
    kind = "tags.`recsys.kind`"
    assert view["searchFilter"] == (
        f"{kind} != 'sweep:s' and {kind} != 'confirm' and {kind} != 'refit'"
    )
    shown = client.search_runs([exp], view["searchFilter"], order_by=["metrics.best_val_auc DESC"])
    assert [r.info.run_name for r in shown] == ["t_1", "t_2", "t_0", "b_0"]
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`best_val_auc`", False)
    assert view["selectedColumns"] == [
        "metrics.`best_val_auc`", "metrics.`confirmed_mean_val_auc`",
        "params.`model.interaction`", "params.`optim.lr`", "params.`qr.threshold`",
        "params.`dim`", "tags.`recsys.status`",
    ]  # fmt: skip
    parallel, *scatters = view["compareRunCharts"]
    # a parameter mixing None and numbers is left out of the parallel coordinates
    assert parallel["type"] == "PARALLEL" and parallel["selectedMetrics"] == ["best_val_auc"]
    assert parallel["selectedParams"] == ["model.interaction", "optim.lr", "dim"]
    assert [(c["type"], c["xaxis"]["key"], c["yaxis"]["key"]) for c in scatters] == [
        ("SCATTER", "optim.lr", "best_val_auc"), ("SCATTER", "dim", "best_val_auc"),
    ]  # fmt: skip
    sections = {s["uuid"] for s in view["compareRunSections"]}
    assert {c["metricSectionId"] for c in view["compareRunCharts"]} <= sections
    note = client.get_run(parent).data.tags[Tag.NOTE]
    assert note == (
        "Sweep s: 3 trials (3 finished), baseline lr, 2 seed-check runs; scored by best_val_auc "
        "(max). Won: trial t_1, best_val_auc 0.7400 (confirmed mean 0.7300 over 2 seeds), with "
        "model.interaction=dcn optim.lr=0.02 qr.threshold=1000 dim=16; lead over lr +0.0300."
    )
    t.set_tags(parent, {f"{Tag.VERDICT}.lr": "ties: lead +0.0300, the best's 95% CI [...]"})
    t.show_sweep("s")
    note = client.get_run(parent).data.tags[Tag.NOTE]
    assert note.endswith("; lead over lr +0.0300 (a tie: inside the seed noise).")
    t.set_tags(parent, {Tag.WINNER_KIND: "reference", Tag.WINNER: "lr (a reference, trial r_0)"})
    t.show_sweep("s")  # a reference beat every trial: the note says which model is best
    note = client.get_run(parent).data.tags[Tag.NOTE]
    assert "(max). Best of the search: trial t_1, best_val_auc 0.7400" in note
    assert note.endswith(
        "(a tie: inside the seed noise). The best model is lr (a reference, trial r_0): no "
        "search trial beats it."
    )


def test_a_kind_given_by_hand_is_kept_and_a_missing_one_added(uri):
    client = MlflowClient(uri)
    old = client.create_experiment("old")  # an experiment made before: no kind
    mine = client.create_experiment("mine", tags={Tag.EXPERIMENT_KIND: "genai_development"})
    t = Tracker(uri)
    assert t.experiment("old") == old and t.experiment("mine") == mine
    assert client.get_experiment(old).tags[Tag.EXPERIMENT_KIND] == MODEL_TRAINING
    assert client.get_experiment(mine).tags[Tag.EXPERIMENT_KIND] == "genai_development"


def test_a_sweep_that_won_nothing_says_so_and_lower_is_better_sorts_ascending(uri):
    t = Tracker(uri)
    exp = t.experiment("lost")
    parent = t.parent_run(exp, "lost")
    t.set_tags(parent, {Tag.METRIC: "val_log_loss", Tag.MODE: "min"})
    run = t.trial_run(exp, parent, "lost", "t_9", {"optim.lr": "0.1"})
    t.set_tags(run, {Tag.SEARCHED: json.dumps({"optim.lr": 0.1}), Tag.STATUS: "diverged"})
    t.show_sweep("lost")
    client = MlflowClient(uri)
    view = json.loads(json.loads(client.get_experiment(exp).tags[Tag.VIEW + "recsys"])["state"])
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`best_val_log_loss`", True)
    assert [c["type"] for c in view["compareRunCharts"]] == ["PARALLEL"]  # one lr: no scatter
    assert client.get_run(parent).data.tags[Tag.NOTE] == (
        "Sweep lost: 1 trial (1 diverged); scored by best_val_log_loss (min). No trial won: none "
        "finished."
    )


def test_the_link_and_the_last_line_by_store():
    assert ui_address("http://mlflow:5000/") == "http://mlflow:5000"
    assert ui_address("sqlite:////x/m.db") == ui_address("postgresql://h/db")
    link = runs_link("http://mlflow:5000", "7", charts=True)
    assert link.endswith("/#/experiments/7/runs?workflowType=machine_learning"
                         "&viewStateShareKey=recsys&compareRunsMode=CHART")  # fmt: skip
    assert compare_line("http://mlflow:5000", link) == f"compare the runs: {link}"
    assert compare_line("sqlite:////x/m.db", "L") == (
        "compare the runs: mlflow ui --backend-store-uri sqlite:////x/m.db --host 127.0.0.1 "
        "--port 5000, then open L"
    )


def test_searched_axes():
    params, parallel, numeric = searched_axes([s for _, s, _ in SEARCHED])
    assert params == ["model.interaction", "optim.lr", "qr.threshold", "dim"]
    assert parallel == ["model.interaction", "optim.lr", "dim"]
    assert numeric == ["optim.lr", "dim"]  # most values first
    assert searched_axes([{"a": True}, {"a": False}]) == (["a"], ["a"], [])  # booleans: no axis


def test_the_description_names_each_reference_once_with_its_trials(uri):
    t, exp, parent = sweep_store(uri, "refs")
    for i in (1, 2):
        run = t.trial_run(exp, parent, "refs", f"b_fm{i}", {"model.arch": "fm"}, kind="baseline")
        t.log_values(run, {"best_val_auc": 0.69})
    t.show_sweep("refs")
    note = MlflowClient(uri).get_run(parent).data.tags[Tag.NOTE]
    assert "3 trials (3 finished), baselines fm (best of 2), lr, 2 seed-check runs;" in note
