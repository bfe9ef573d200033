"""Sweeps decide by each trial's best validation report: ranking, tables, MLflow, checkpoints,
export; early stopping, and ASHA's stops with one trial at a time; two objectives with Optuna;
configurations over budget never launched."""

from __future__ import annotations

import math
import os
import textwrap
import threading
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from recsys.tracking.tracker import Tracker
from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = """
base: debug
overrides:
  data.synthetic.num_samples: {rows}
  embeddings.num_embeddings: [50, 200, 1000, 3000]
  embeddings.dim: 8
  model.bottom_mlp: [16]
  model.top_mlp: [16]
  train.steps: {steps}
  train.batch_size: 64
  train.checkpoint_every: 10
  train.log_every: 10
  optim.lr: {lr}
  optim.embedding_lr: {lr}
"""

# at this learning rate the validation NE is best early and rises after (deterministic: step 10
# with the counter-based table init; step 20 before it)
EARLY_PEAK = (
    TINY.format(rows=3000, steps=80, lr=0.3)
    + """
space:
  train.patience: {grid: [0, 3]}
metric: val_ne
mode: min
"""
)

# three trials one at a time under ASHA, its one rung at step 50: the second, at a learning rate
# that leaves the model at its start, trails the first there and is stopped (150 steps before its
# end, so that Tune's stop lands before its training could finish); the third, the first's
# configuration again, scores what the first did (no cut) and runs in the stopped trial's slot
ONE_SLOT = (
    TINY.format(rows=2000, steps=200, lr=0.1).replace(
        "checkpoint_every: 10", "checkpoint_every: 50"
    )
    + """
space:
  optim.lr: {grid: [0.1, 1.0e-6, 0.1]}
"""
)

TRADE_OFF = (
    TINY.format(rows=2000, steps=20, lr=0.05)
    + """
space:
  embeddings.dim: {choice: [8, 16, 64]}
  embeddings.qr.threshold: {choice: [null, 500]}
metric: [val_auc, emb_bytes]
mode: [max, min]
constraints: {emb_bytes_max: 300000}
"""
)


def dominates(a: dict, b: dict) -> bool:
    """Row ``a`` beats row ``b`` on TRADE_OFF's objectives: a best validation AUC at least as
    high (``max``) with at most as many embedding bytes (``min``), and strictly better in one."""
    auc_a, auc_b = float(a["best_val_auc"]), float(b["best_val_auc"])
    bytes_a, bytes_b = float(a["emb_bytes"]), float(b["emb_bytes"])
    return auc_a >= auc_b and bytes_a <= bytes_b and (auc_a > auc_b or bytes_a < bytes_b)


def has_both_objectives(row: dict) -> bool:
    values = (row["best_val_auc"], row["emb_bytes"])
    return all(v is not None and not math.isnan(float(v)) for v in values)


def sweep(tmp_path, body: str, name: str, uri: str | None = None, **opts):
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    space = spaces.load(str(path))
    uri = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    o = SweepOptions(name=name, storage=str(tmp_path / "runs"), tracking_uri=uri, **opts)
    return space, uri, o, run_sweep(space, o, Tracker(uri), restore=False)


def test_early_peak_is_ranked_tabled_kept_and_exported_by_its_best_report(
    ray_2_cpus, tmp_path, tracking_uri
):
    from recsys.tune.publish import best_trial, export_best

    # beside ASHA: both trials are the same run until patience stops one, so ASHA keeps both
    _, uri, _, table = sweep(
        tmp_path, EARLY_PEAK, "peak", tracking_uri, num_samples=1, scheduler="asha"
    )
    rows = {r["params"]["train.patience"]: r for r in table}
    full, stopped = rows[0], rows[3]
    assert full["status"] == "finished" and stopped["status"] == "early_stopped"
    peak = int(full["best_step"])
    assert 10 <= peak <= 40  # early: well before the last step (80)
    for row in (full, stopped):  # both peaked at the same step, the same run until then
        assert row["best_step"] == peak
        assert row["val_ne"] == row["best_val_ne"]  # the table shows the best report, not the last
        assert row["checkpoint"].endswith(f"step_{peak:08d}")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("peak")
    runs = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'trial'")
    by_status = {r.data.tags["recsys.status"]: r for r in runs}
    assert set(by_status) == {"finished", "early_stopped"}
    for run in runs:
        ne = client.get_metric_history(run.info.run_id, "val_ne")
        assert min(m.value for m in ne) == pytest.approx(run.data.metrics["best_val_ne"])
        assert ne[-1].value > run.data.metrics["best_val_ne"]  # the last report is worse
        assert run.data.metrics["best_step"] == peak
        best = run.data.tags["checkpoint.best"]  # kept by Ray Train: the lowest-NE checkpoint
        assert best.endswith(f"step_{peak:08d}") and os.path.isdir(best)
    steps = [m.step for m in client.get_metric_history(by_status["early_stopped"].info.run_id,
                                                       "val_ne")]  # fmt: skip
    assert steps == list(range(10, peak + 40, 10))  # 3 reports without improvement: stop
    parent = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'sweep:peak'")[0]
    assert parent.data.tags["recsys.mode"] == "min"
    assert parent.data.metrics["best_val_ne"] == pytest.approx(full["best_val_ne"])
    assert "auc_vs_memory.png" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    run_id, ckpt, _ = best_trial(Tracker(uri), "peak")  # the lowest best NE, its best checkpoint
    assert ckpt.endswith(f"step_{peak:08d}")
    exported_run, report, _ = export_best(uri, "peak", str(tmp_path / "export"))
    assert exported_run == run_id and report.rows > 0
    check_refit(uri, tmp_path, run_id, peak)


def check_refit(uri: str, tmp_path, trial_run: str, peak: int) -> None:
    """``recsys-export --refit``'s work: the best trial trained again on training + validation
    rows for the epochs of its peak, in an MLflow run of its own, exported from its last step."""
    from recsys.train.ray_trainer import Resources
    from recsys.tune.publish import best_trial
    from recsys.tune.refit import refit_best

    client, lines = MlflowClient(uri), []
    trial = client.get_run(trial_run)
    at_peak = [m.value for m in client.get_metric_history(trial_run, "epochs_done")
               if m.step == peak]  # fmt: skip
    out = str(tmp_path / "refit-export")
    run_id, report, model = refit_best(
        uri, "peak", str(tmp_path / "runs"), Resources(2, False, 1.0), out, log=lines.append
    )
    refit = client.get_run(run_id)
    tags, metrics = refit.data.tags, refit.data.metrics
    sweep_run = trial.data.tags["mlflow.parentRunId"]
    assert tags["recsys.kind"] == "refit" and tags["mlflow.parentRunId"] == sweep_run
    assert client.get_run(sweep_run).info.status == "FINISHED"  # left as the sweep left it
    assert refit.info.status == "FINISHED"
    assert tags["recsys.refit_of"] == trial.data.tags["recsys.trial_id"]
    assert tags["recsys.refit_rows"] == "training + validation: 2,700 rows (2,400 + 300)"
    assert refit.data.params["data.refit"] == "True"
    # the epochs of the trial's peak, over 2,700 rows: its last step covers them
    assert metrics["epochs_done"] == pytest.approx(at_peak[0], abs=2 * 64 / 2700 + 1e-9)
    assert metrics["test_auc"] > 0.5 and "export_auc" in metrics
    assert not [k for k in metrics if k.startswith(("val_", "best_"))]  # on rows it trained on
    assert tags["checkpoint.best"] == tags["checkpoint.last"]
    assert tags["checkpoint.last"].endswith(f"step_{int(metrics['step']):08d}")
    assert report.path.startswith(out) and model.startswith("models:/")
    assert [i.dataset.name for i in refit.inputs.dataset_inputs] == ["synthetic"]
    assert lines[0].startswith(f"refitting trial {tags['recsys.refit_of']} (run {trial_run}) on")
    assert lines[1].startswith("refitted: test AUC ")
    assert best_trial(Tracker(uri), "peak")[0] == trial_run  # a refit is never ranked
    # again: the same run, its training finished (nothing trained), exported again
    again, _, _ = refit_best(
        uri, "peak", str(tmp_path / "runs"), Resources(2, False, 1.0), out, log=lines.append
    )
    assert again == run_id and lines[3] == lines[1]  # the same test AUC, from its run
    assert client.get_run(run_id).data.metrics["step"] == metrics["step"]


def test_two_objective_optuna_sweep_returns_a_pareto_set_and_never_launches_over_budget(
    ray_2_cpus, tmp_path
):
    space, uri, _, table = sweep(
        tmp_path, TRADE_OFF, "trade", num_samples=4, search="optuna", seed=4, num_workers=1
    )
    assert [o.key for o in space.objectives] == ["best_val_auc", "emb_bytes"]
    over = [r for r in table if r["status"] == "infeasible"]
    fine = [r for r in table if r["status"] == "finished"]
    assert over and len(fine) >= 2, [(r["params"], r["status"]) for r in table]
    for r in over:  # refused in the trial's driver: no Train run, no worker
        assert r["emb_bytes"] > 300000 and "emb_bytes_max" in r["status_detail"]
        assert not os.path.exists(tmp_path / "runs" / "trade" / "train" / f"trial_{r['trial']}")
    assert [o.mode for o in space.objectives] == ["max", "min"]  # what `dominates` assumes
    # the front, checked from its definition (not with the product's own non_dominated): among
    # the search's scored trials, no row beats a row on the front, and every row off the front
    # is beaten by a row on it
    front = [r for r in table if r["pareto"]]
    assert front and all(r["status"] == "finished" for r in front)
    scored = [r for r in table if r["role"] == "trial" and has_both_objectives(r)]
    assert {r["trial"] for r in front} | {r["trial"] for r in fine} <= {r["trial"] for r in scored}
    for r in scored:
        if r["pareto"]:
            beaten_by = [o["trial"] for o in scored if dominates(o, r)]
            assert beaten_by == [], f"trial {r['trial']} is on the front, yet {beaten_by} beat it"
        else:
            assert any(dominates(f, r) for f in front), (
                f"trial {r['trial']} is off the front, yet no row on it beats it: {scored}"
            )
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("trade")
    statuses = [
        r.data.tags["recsys.status"]
        for r in client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'trial'")
    ]
    assert statuses.count("infeasible") == len(over)


def test_under_asha_a_stopped_trial_is_followed_in_its_slot_and_finished_trials_end_themselves(
    ray_2_cpus, tmp_path
):
    """One trial at a time under ASHA: the trial after a stopped one starts in the same slot
    and runs to its end (Tune must not hand it the stopped trial's actor, still inside
    ``fit()``: the sweep then hung, so the sweep runs in a thread that may take 420 s); a trial
    that reaches the last step is not stopped there by ASHA but finishes itself: its MLflow run
    ended by the trial after ``fit()`` returned (Tune had killed it, and Ray Train's controller
    with it, while Train still finished it)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["sweep"] = sweep(
                tmp_path, ONE_SLOT, "slot", num_samples=1, scheduler="asha", max_concurrent=1,
                num_workers=1, cpus_per_worker=0.9,
            )  # fmt: skip
        except BaseException as e:  # raised below, in the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=420)
    assert not thread.is_alive(), "the sweep hung: a trial after a stopped one never ran"
    if "error" in outcome:
        raise outcome["error"]
    _, uri, _, table = outcome["sweep"]
    rows = sorted(table, key=lambda r: r["trial"])  # grid order
    assert [r["status"] for r in rows] == ["finished", "stopped", "finished"]
    assert [int(r["best_step"]) for r in rows[1:2]] == [50]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("slot").experiment_id
    runs = client.search_runs([exp], "tags.`recsys.kind` = 'trial'")
    first, weak, last = sorted(runs, key=lambda r: r.data.tags["recsys.trial_id"])
    assert float(weak.data.params["optim.lr"]) == 1.0e-6
    assert weak.data.tags["recsys.status"] == "stopped"
    for run_ in (first, last):  # ended by the trial itself, after fit() returned
        assert run_.data.tags["recsys.status"] == "finished" and run_.info.status == "FINISHED"
        assert "trial_fit_end" in run_.data.metrics
        assert run_.data.tags["checkpoint.last"].endswith("step_00000200")
