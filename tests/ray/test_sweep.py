"""The default space's smoke sweep through the command line (a local Ray of its own), run once per
tracking backend (a SQLite store, a tracking server over PostgreSQL) with a ``recsys-train``
beside it (a local Ray of its own), and read back by one test per concern: the sweep's console
(short, no noise), the training beside it (neither console shows the other's instance), the
search's runs in MLflow (read with ``MlflowClient``), the smoke variant's baseline (lr) marked as
a reference, the MLflow server's REST API listing the runs, and the printed link followed in a
browser (headless Chromium, ``tests/browser.py``: the MLflow UI shows the trials)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
    "\x1b[",  # terminal colour codes (Ray's worker prefixes) in a console that is a pipe
    "the solver converged",  # a worker's own ending line: the driver's says how a trial ended
    "); stopped early",
    "Ray deduplicates logs",  # Ray's note on repeated worker lines
]


@dataclass
class Smoke:
    """One smoke sweep and the training beside it, as the tests read them."""

    uri: str  # where the sweep tracked
    sweep_out: str  # the sweep's console: stdout, then stderr
    sweep_stdout: str
    beside_code: int  # the training beside it: exit code and console
    beside_out: str
    client: MlflowClient
    experiment_id: str
    runs: list[Any]  # every run of the sweep's experiment

    def kind(self, kind: str) -> list[Any]:
        return [r for r in self.runs if r.data.tags.get("recsys.kind") == kind]


@pytest.fixture(scope="module")
def smoke(module_tracking_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    """The smoke sweep (named t2) through the command line, and a ``recsys-train`` started just
    before it and running beside it; run once per tracking backend, shared by this file's tests.
    Fails (every test of the backend errors, with the sweep's last output) if the sweep does."""
    uri, tmp = module_tracking_uri, tmp_path_factory.mktemp("smoke")
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
           "--name", "t2", "--storage", str(tmp / "runs"), "--tracking-uri", uri,
           "--num-workers", "1", "--cpus-per-worker", "1.5"]  # fmt: skip
    train = [sys.executable, os.path.join(ROOT, "experiments", "train.py"), "--num-workers", "1",
             "--cpus-per-worker", "0.5", "--storage", str(tmp / "beside"),
             "--set", "train.steps=60", "--set", "train.checkpoint_every=20"]  # fmt: skip
    # both inherit a dead local Ray's dashboard address, as from an earlier connect in a parent
    # (this test process's other Ray tests): each must use its own
    stale = "http://127.0.0.1:9"
    env = {**os.environ, "RAY_API_SERVER_ADDRESS": stale, "RECSYS_LOCAL_RAY_API_SERVER": stale}
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "cwd": tmp}
    beside = subprocess.Popen(train, env=env, **pipe)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    beside_out = beside.communicate(timeout=600)[0]
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t2")
    assert exp is not None, out[-3000:]
    return Smoke(uri, out, done.stdout, beside.returncode, beside_out, client,
                 exp.experiment_id, client.search_runs([exp.experiment_id]))  # fmt: skip


def test_the_sweeps_console_is_short_and_has_no_noise(smoke):
    """Ray's start, the phases, one line as each trial (and the baseline) starts and ends, the
    table against the baseline, where to look: nothing else (no library noise)."""
    out = smoke.sweep_out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= LINES_FIXED + LINES_PER_TRIAL * (1 + 1), out
    assert [n for n in NOISE if n in out] == [], out
    assert sum("trial " in line and "started:" in line for line in lines) == 1
    assert sum("baseline " in line and "started:" in line for line in lines) == 1
    table = out[out.index("best trials") : out.index("against the baselines")]
    assert "lr (ref)" in table and "worker_s" in table
    assert "beats lr (trial" in out or "does NOT beat lr (trial" in out
    last = smoke.sweep_stdout.strip().splitlines()[-1]
    runs = f"/#/experiments/{smoke.experiment_id}/runs?workflowType=machine_learning"
    if smoke.uri.startswith("http"):  # a tracking server: the sweep's view of its runs there
        assert last == f"compare the runs: {smoke.uri}{runs}&viewStateShareKey=recsys"
    else:  # the command that serves the store, then the view on it
        assert last == (
            f"compare the runs: mlflow ui --backend-store-uri {smoke.uri} --host 127.0.0.1 "
            f"--port 5000, then open http://127.0.0.1:5000{runs}&viewStateShareKey=recsys"
        )


def test_a_training_beside_the_sweep_runs_on_its_own_ray(smoke):
    """The ``recsys-train`` that ran beside the sweep finished, and its console is as clean (no
    other Ray instance found, no library noise); the sweep's is checked above."""
    assert smoke.beside_code == 0, smoke.beside_out[-3000:]
    assert [n for n in NOISE if n in smoke.beside_out] == [], smoke.beside_out


def test_the_sweep_and_its_trial_are_in_mlflow(smoke):
    """The sweep's run (its artifacts, metric and best score) and its one trial under it: params,
    loss and validation histories, the best report, cost figures, checkpoints."""
    client = smoke.client
    parents, trials = smoke.kind("sweep:t2"), smoke.kind("trial")
    assert len(parents) == 1 and len(trials) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    kind = client.get_experiment(smoke.experiment_id).tags.get("mlflow.experimentKind")
    assert kind == "custom_model_development"  # MLflow 3's model-training experiment
    (trial,) = trials  # the parent's description: what the sweep was, which trial won
    note = parent.data.tags["mlflow.note.content"]
    assert "\n" not in note and note.startswith("Sweep t2: 1 trial (1 finished), baseline lr;")
    best = trial.data.metrics["best_val_auc"]
    won = (
        "Best of the search" if parent.data.tags.get("recsys.winner_kind") == "reference" else "Won"
    )
    assert f"{won}: trial {trial.data.tags['recsys.trial_id']}, best_val_auc {best:.4f}" in note
    assert f"optim.lr={float(trial.data.params['optim.lr']):.4g}" in note
    assert f"lead over lr {parent.data.metrics['lead_over_lr']:+.4f}" in note
    (seen,) = client.get_run(trial.info.run_id).inputs.dataset_inputs  # the UI's Datasets
    assert seen.dataset.name == "synthetic" and seen.dataset.source_type == "generated"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "auc_vs_memory.png", "best_config.yaml", "search_space.yaml"} <= artifacts
    assert parent.data.tags["recsys.metric"] == "val_auc" and "best_val_auc" in parent.data.metrics
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


def test_the_baseline_is_a_marked_reference(smoke, tmp_path):
    (parent,) = smoke.kind("sweep:t2")
    check_baselines(smoke.client, smoke.runs, parent, tmp_path)


@pytest.fixture(scope="module")
def ui(smoke: Smoke) -> Iterator[tuple[str, str]]:
    """The MLflow UI that the sweep's last line names, and its link there: the tracking server,
    or the printed ``mlflow ui`` command run on a free port of 127.0.0.1 (the link's port
    changed to it)."""
    from tests.servers import MlflowServer

    last = smoke.sweep_stdout.strip().splitlines()[-1]
    link = last.rsplit(" ", 1)[-1]
    if smoke.uri.startswith("http"):
        yield smoke.uri, link
        return
    command = last.removeprefix("compare the runs: ").split(", then open ")[0].split()
    server = MlflowServer(command=command).start()
    try:
        yield server.uri, link.replace("http://127.0.0.1:5000", server.uri)
    finally:
        server.stop()


def test_the_mlflow_server_lists_the_runs_over_rest(smoke, ui):
    """The MLflow UI the sweep names, on loopback, lists the sweep's runs over its REST API."""
    import json
    import urllib.request

    body = json.dumps({"experiment_ids": [smoke.experiment_id]}).encode()
    req = urllib.request.Request(
        f"{ui[0]}/api/2.0/mlflow/runs/search", body, {"Content-Type": "application/json"}
    )
    listed = json.load(urllib.request.urlopen(req, timeout=30))["runs"]
    assert {r["info"]["run_id"] for r in listed} == {r.info.run_id for r in smoke.runs}


def test_the_printed_link_opens_the_trials_in_a_browser(smoke, ui, tmp_path):
    """The sweep's last line followed in headless Chromium, against a real MLflow UI (the
    tracking server, or the printed ``mlflow ui`` over the SQLite store, on a free port): the
    runs view on MLflow 3's model-training side, not its GenAI overview; the trial and the
    baseline as rows, by name, best first, without the sweep's own run; the score and every
    searched parameter as columns, with the values MLflow holds. The view's charts draw the
    score against the searched parameters (parallel coordinates)."""
    import json

    from tests import browser

    if why := browser.missing():
        pytest.skip(why)
    link = ui[1]
    (trial,), (baseline,) = smoke.kind("trial"), smoke.kind("baseline")
    score = "metrics.`best_val_auc`"
    with browser.Chromium(width=2200, height=900) as page:  # wide: every column drawn
        page.open(link)
        shown = browser.runs_table(page, score)
        page.screenshot(str(tmp_path / "runs.png"))
        page.open(link + "&compareRunsMode=CHART")
        labels = page.wait_for(
            "[...document.querySelectorAll('.parcoords text.label')].map(e => e.textContent)",
            what="the parallel coordinates",
        )
        page.screenshot(str(tmp_path / "charts.png"))
    assert shown["title"].startswith("Runs - "), shown["title"]  # (MLflow 3's: "Overview - ")
    rows = shown["rows"]
    assert set(rows) == {trial.info.run_id, baseline.info.run_id}, rows  # no parent row
    ranked = sorted([trial, baseline], key=lambda r: -r.data.metrics["best_val_auc"])
    assert [rows[r.info.run_id]["index"] for r in ranked] == [0, 1]
    assert shown["headers"][score] == "best_val_auc"
    searched = json.loads(trial.data.tags["recsys.searched"])
    assert "optim.lr" in searched and "model.interaction" in searched
    for run in (trial, baseline):
        row = rows[run.info.run_id]
        assert row["attributes.`Run Name`"].splitlines()[-1] == run.info.run_name
        assert float(row[score]) == pytest.approx(run.data.metrics["best_val_auc"], rel=1e-9)
        for key in searched:
            assert shown["headers"][f"params.`{key}`"] == key
            assert row[f"params.`{key}`"] == run.data.params[key], key
        assert row["tags.`recsys.status`"] == "finished"
    assert {"model.interaction", "optim.lr", "best_val_auc"} <= set(labels), labels


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
    assert (csv["worker_s"] > 0).all()
    trial, ref = (csv[csv["role"] == r].iloc[0] for r in ("trial", "baseline"))
    assert trial["samples_seen"] == 20 * 64  # 20 steps of 64 rows
    # the LR reference is solved: its 20 iterations each read the whole training split (its
    # first evaluation and its line search's), so a multiple of it and more than 20 passes
    assert ref["samples_seen"] % 4800 == 0 and ref["samples_seen"] >= 20 * 4800
