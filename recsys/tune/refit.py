"""Refit a sweep's winner before it serves: its configuration trained again on the training and the
validation rows together (``data.refit``), for as many epochs as its own run had trained when it
peaked, then exported from that run's last checkpoint.

A model that serves the period after its data learns most from the most recent rows, and a sweep
holds the most recent ones (validation) out to choose. Once the choice is made, they are training
rows like any other. The budget is the trial's epochs at its best report (``epochs_done`` at
``best_step``): epochs, not steps, so it scales with the rows added. There is nothing left to
validate on, so the refit runs to its budget (no patience) and its test split is its only
held-out score.

The refit is an MLflow run of its own in the sweep (``recsys.kind = refit``, under the sweep's
run): its config, its data input (the rows it saw), its test metrics, its export and the served
model, with ``recsys.refit_of`` naming the trial and ``recsys.refit_rows`` the rows. It is never
ranked as a trial. Running ``--refit`` again finds that run and its training run (the storage
folder ``<storage>/<sweep>/refit-<trial>``), which resumes or, when finished, trains nothing.

    run_id, report, uri = refit_best(tracking_uri, "default", "runs", Resources(2, False, 1.0),
                                     "runs/default/export")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from recsys.config import ExperimentConfig
from recsys.data.dataset import run_paths, split_rows, with_budget
from recsys.runtime.cluster import WorkerOptions
from recsys.runtime.storage import join as storage_join
from recsys.serving.export import ExportReport
from recsys.serving.mlflow_model import crown, export_to_run
from recsys.tracking import inputs
from recsys.tracking.tracker import Tag, Tracker, flat_params
from recsys.train.launch import make_run
from recsys.train.ray_trainer import Resources
from recsys.train.reporting import read_report
from recsys.train.results import last_checkpoint
from recsys.tune.publish import best_trial
from recsys.tune.state import read_saved

EPOCHS_DONE = "epochs_done"
REFIT = "refit"  # the refit run's recsys.kind


@dataclass(frozen=True)
class Refit:
    """What a refit trains: the trial it refits, its config, and the rows."""

    trial_run: str
    trial: str
    cfg: ExperimentConfig
    epochs: float
    train_rows: int
    val_rows: int

    @property
    def rows_note(self) -> str:
        return (
            f"training + validation: {self.train_rows + self.val_rows:,} rows "
            f"({self.train_rows:,} + {self.val_rows:,})"
        )


def peak_epochs(tracker: Tracker, run_id: str) -> float:
    """The epochs trial run ``run_id`` had trained at its best report: its ``epochs_done`` at
    its ``best_step``."""
    run = tracker.client.get_run(run_id)
    if "best_step" not in run.data.metrics:
        raise ValueError(f"run {run_id} has no best_step: no report of it was scored")
    best = int(run.data.metrics["best_step"])
    at = [m.value for m in tracker.client.get_metric_history(run_id, EPOCHS_DONE) if m.step == best]
    if not at:
        raise ValueError(f"run {run_id} recorded no {EPOCHS_DONE} at its best step {best}")
    return float(at[-1])


def refit_config(cfg: ExperimentConfig, epochs: float, scale: float = 1.0) -> ExperimentConfig:
    """``cfg`` trained on its training and validation rows for ``epochs`` (of those rows), to
    the end (no patience); its learning-rate schedule's steps (warmup, decay start, decay)
    stretched by ``scale``, the rows' growth, as its steps are. A solved model (``train.solver:
    lbfgs``, a reference that won) is solved again on those rows, to convergence."""
    if cfg.train.solver == "lbfgs":  # solved: to convergence again, on the rows it now has
        return cfg.with_overrides({"data.refit": True, "train.patience": 0})
    if epochs <= 0:
        raise ValueError(f"a refit needs the epochs of its trial's peak, got {epochs}")
    return cfg.with_overrides({"data.refit": True, "train.epochs": epochs, "train.patience": 0,
                               **stretched(cfg, scale)})  # fmt: skip


def stretched(cfg: ExperimentConfig, scale: float) -> dict[str, int]:
    """Overrides of ``cfg``'s learning-rate schedule's steps (warmup, decay start, decay) times
    ``scale``."""
    o = cfg.optim
    return {
        "optim.warmup_steps": round(o.warmup_steps * scale),
        "optim.decay_start_step": round(o.decay_start_step * scale),
        "optim.decay_steps": round(o.decay_steps * scale),
    }


def plan_refit(tracker: Tracker, sweep: str, max_emb_bytes: float | None = None) -> Refit:
    """The refit of ``sweep``'s best trial (``recsys.tune.publish.best_trial``)."""
    run_id, _, cfg = best_trial(tracker, sweep, max_emb_bytes)
    trial = tracker.client.get_run(run_id).data.tags.get(Tag.TRIAL, run_id)
    epochs = 0.0 if cfg.train.solver == "lbfgs" else peak_epochs(tracker, run_id)
    train, val = split_rows(cfg)
    if val == 0:
        raise ValueError(f"sweep {sweep!r}: its data has no validation rows to refit on")
    return Refit(
        run_id, trial, refit_config(cfg, epochs, (train + val) / train), epochs, train, val
    )


def checked_refit(
    tracking_uri: str, sweep: str, resources: Resources, max_emb_mb: float | None = None
) -> Refit:
    """The refit of ``sweep``'s best trial (``plan_refit``), its config as ``resources``' workers
    train it, with every refusal they could make made here first
    (``recsys.distributed.preflight.check``): before Ray starts."""
    from dataclasses import replace

    from recsys.distributed import preflight

    budget = max_emb_mb * 2**20 if max_emb_mb is not None else None
    refit = plan_refit(Tracker(tracking_uri), sweep, budget)
    device = "cuda" if resources.use_gpu else "cpu"
    return replace(refit, cfg=preflight.check(refit.cfg, device, resources.num_workers))


def train_refit(
    refit: Refit, resources: Resources, storage: str, sweep: str, name: str = ""
) -> tuple[str, dict[str, Any]]:
    """Train the refit on Ray (``recsys.train.launch``; Ray connected), in
    ``<storage>/<sweep>/<name>`` (default ``refit-<trial>``); its last checkpoint and last
    report."""
    from recsys.runtime.shared_storage import check_nodes_see

    folder = storage_join(storage, sweep)
    check_nodes_see(*run_paths(folder, refit.cfg.data))  # one node's own disk: refused
    trainer = make_run(
        refit.cfg, resources, name=name or f"refit-{refit.trial}", storage_path=folder,
        max_failures=2,
    )  # fmt: skip
    result = trainer.fit()
    try:
        return last_checkpoint(result, storage_join(folder, name or f"refit-{refit.trial}"))
    except RuntimeError:
        raise ValueError(f"the refit of trial {refit.trial} left no checkpoint") from None


def refit_best(
    tracking_uri: str,
    sweep: str,
    storage: str,
    resources: Resources,
    out_dir: str,
    dtype: str = "int8",
    register: str | None = None,
    max_emb_mb: float | None = None,
    log: Callable[[str], None] = print,
    refit: Refit | None = None,
) -> tuple[str, ExportReport, str]:
    """Refit ``sweep``'s best trial (Ray connected), record the refit in an MLflow run of its
    own and export it from its last checkpoint (``register``: as ``export_best`` registers).
    ``refit``: as ``checked_refit`` planned it before Ray started (else planned here).
    The refit's run id, the export's report and the MLflow model's URI."""
    tracker = Tracker(tracking_uri)
    refit = refit or checked_refit(tracking_uri, sweep, resources, max_emb_mb)
    budget = ("solved to convergence" if refit.cfg.train.solver == "lbfgs"
              else f"{refit.epochs:.3g} epochs (where it peaked)")  # fmt: skip
    log(f"refitting trial {refit.trial} (run {refit.trial_run}) on {refit.rows_note}, {budget}")
    run_id = open_refit_run(tracker, sweep, refit, resources.num_workers)
    try:
        checkpoint = train_into(tracker, run_id, refit, resources, storage, sweep)
        log(test_line(tracker, refit, run_id))
        report, uri = export_to_run(
            tracker, run_id, checkpoint, refit.cfg, out_dir, dtype, register
        )
    except BaseException:
        tracker.finish(run_id, "FAILED")
        raise
    tracker.finish(run_id)
    if register:
        uri, line = crown(tracker, register, sweep, run_id)
        log(f"registered {register}: {line}")
    return run_id, report, uri


def train_into(
    tracker: Tracker, run_id: str, refit: Refit, resources: Resources, storage: str, sweep: str,
    name: str = "",
) -> str:  # fmt: skip
    """Train the refit (``train_refit``; ``name``: its run's folder) and log into its MLflow run
    ``run_id`` the report it trained now (``held_out``), its seconds (``refit_s``) and its
    checkpoint, which it returns. A refit killed after its last report resumes with nothing
    left to train and reports no test score: its report is then read from its checkpoint."""
    t0, before = time.time(), tracker.last_step(run_id)
    checkpoint, metrics = train_refit(refit, resources, storage, sweep, name)
    if not any(k.startswith("test_") for k in metrics):
        metrics = {**metrics, **read_report(checkpoint)}
    if int(metrics.get("step", 0)) > before:  # trained now (a finished refit trains nothing)
        tracker.log_report(run_id, held_out(metrics))
        tracker.log_values(run_id, {"refit_s": time.time() - t0})
    tracker.set_tags(run_id, {Tag.BEST_CHECKPOINT: checkpoint, Tag.LAST_CHECKPOINT: checkpoint})
    return checkpoint


def held_out(metrics: dict[str, Any]) -> dict[str, Any]:
    """A refit's report without its validation scores (``val_*``, ``best_*``: measured on rows
    it trained on, they would read as held-out scores beside the trials')."""
    return {k: v for k, v in metrics.items() if not k.startswith(("val_", "best_", "ckpt_"))}


def open_refit_run(tracker: Tracker, sweep: str, refit: Refit, workers: int, name: str = "") -> str:
    """The refit's MLflow run beside its trial, under the sweep's run (found again by a second
    ``--refit``; ``name``: the run's, default ``<trial> refit``): its config (params with the
    steps its ``workers`` train, and ``config.yaml``), the trial it refits, its rows, its data
    input."""
    trial = tracker.client.get_run(refit.trial_run)
    experiment_id = trial.info.experiment_id
    parent = trial.data.tags.get(Tag.PARENT) or refit.trial_run
    shown = with_budget(refit.cfg, refit.train_rows + refit.val_rows, workers)
    run_id = tracker.trial_run(
        experiment_id, parent, sweep, f"{refit.trial}.refit", flat_params(shown.to_dict()),
        kind=REFIT, name=name or f"{refit.trial} refit",
        tags={Tag.REFIT_OF: refit.trial, Tag.REFIT_ROWS: refit.rows_note},
    )  # fmt: skip
    tracker.log_text(run_id, yaml.safe_dump(refit.cfg.to_dict()), "config.yaml")
    tracker.log_dataset(run_id, lambda: inputs.describe(refit.cfg.data))
    return run_id


def test_line(tracker: Tracker, refit: Refit, run_id: str) -> str:
    """The refit's test AUC (as its run holds it) beside its trial's (that run's last report)."""
    mine = tracker.client.get_run(run_id).data.metrics.get("test_auc")
    if mine is None:
        return "refitted (its data has no test rows: no held-out score)"
    line = f"refitted: test AUC {mine:.4f}"
    trial = tracker.client.get_run(refit.trial_run).data.metrics.get("test_auc")
    if trial is not None:
        line += f" (trial {refit.trial} on its training rows only: {trial:.4f})"
    return line


def saved_workers(storage: str, sweep: str) -> Resources | None:
    """The workers ``sweep``'s trials ran on (its ``sweep.json``), or None without one."""
    saved = read_saved(storage, sweep)
    if saved is None:
        return None
    options, default = saved.get("options", {}), WorkerOptions()
    return Resources(
        int(options.get("num_workers", default.num_workers)),
        bool(options.get("use_gpu", default.use_gpu)),
        float(options.get("cpus_per_worker", default.cpus_per_worker)),
    )
