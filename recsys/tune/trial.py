"""One sweep trial: a Tune function that checks its configuration, then builds and fits a
``TorchTrainer`` (Ray Train V2), or, for a trial of one CPU worker, trains in its own process
(``recsys.train.inline``: the same checkpoints and reports, without Ray Train's start).

Before any worker starts, the configuration must fit: the space's budget (``constraints``) and a
sharding plan for the trial's workers and their device memory (``recsys.tune.feasibility``); if
not, the trial reports ``infeasible`` with the numbers and ends. The Train run is named after the
trial id (a reference's grid point's id over halving's rounds: ``POINT``), so a restored trial, or
a point's next round, finds its own checkpoints and continues from the latest. Rank 0's
reports reach Tune as each checkpoint is registered (``ReportToTune``), and MLflow from the
sweep's driver as Tune gets them (``recsys.tune.driver_log``): Train's controller never imports
MLflow.
Every report carries the trial's score so far (``best_<metric>``), which Tune's searcher and
scheduler compare.

A trial that ASHA stops is ended by Tune with its actor, before the trial's own bookkeeping:
the sweep's driver then records it (``stopped``) from what its training persisted
(``recsys.tune.driver_log.record_stopped``, ``recsys.train.results``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import yaml
from ray import tune

from recsys.config import ExperimentConfig, TrainConfig
from recsys.data.dataset import train_rows, with_budget
from recsys.distributed import preflight
from recsys.distributed.sharding import Machine
from recsys.runtime import storage
from recsys.runtime.storage import as_uri
from recsys.tracking import inputs
from recsys.tracking.tracker import Tag, Tracker, flat_params
from recsys.tracking.tune_reports import ReportToTune, to_tune
from recsys.train import inline
from recsys.train.ray_trainer import Resources, make_trainer
from recsys.train.results import sharding_plan, train_result
from recsys.tune import feasibility
from recsys.tune.results import PAUSE, point_of, trial_status
from recsys.tune.search import INFEASIBLE
from recsys.tune.state import unlogged_dir


@dataclass(frozen=True)
class TrialSpec:
    """What every trial of a sweep shares (passed through Tune's config as a plain dict)."""

    sweep: str
    base: dict[str, Any]
    storage: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    max_failures: int
    metric: str = "val_auc"
    mode: str = "max"
    constraints: dict[str, float] | None = None
    # Machine fields, "local_world_size" and "node_workers" (``recsys.tune.sweep.machine_spec``)
    machine: dict[str, Any] | None = None
    role: str = "trial"  # the phase: "trial" (the search), "baseline" or "confirm"
    system_metrics: float = 0.0  # seconds between system metric samples in the run (0: none)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Tune keeps a finished trial's actor for the next trial of the same resources (its function
# runs again there, with the new config): this process imports torch, TorchRec, MLflow and our
# modules once per sweep phase rather than once per trial (seconds of CPU each, on the cores a
# trial's workers start on). A trial's state lives in ``_run``'s locals and its MLflow run.
REUSE_TRIAL_ACTORS = True


def reuse_actors(scheduler: Any = None, stop: Any = None) -> bool:
    """Whether a phase's Tuner may reuse its trials' actors (``REUSE_TRIAL_ACTORS``): only where
    nothing ends a running trial, that is with FIFO (``scheduler`` None or a
    ``FIFOScheduler``) and no stopper (``stop`` None). Tune keeps the actor of a trial that ASHA
    or a stopper ended without ending its function, still inside ``TorchTrainer.fit()``: the next
    trial's reset waits 2 s for that thread, gives up and fails the new trial
    (ray-project/ray#29268), while the stopped training runs on."""
    from ray.tune.schedulers import FIFOScheduler

    fifo = scheduler is None or type(scheduler) is FIFOScheduler
    return REUSE_TRIAL_ACTORS and fifo and stop is None


EPOCHS_DONE = "epochs_done"  # in every report: training samples so far over the split's rows


def asha(train: TrainConfig, grace_steps: int, **kwargs: Any) -> Any:
    """ASHA over a trial's budget (``train``: the base config's; ``kwargs``: its metric, mode,
    brackets, reduction factor): in ``epochs_done`` from one epoch (the whole
    budget if shorter) to ``train.epochs`` with a budget in epochs, else in steps from
    ``grace_steps`` to ``train.steps``.

    It never ends a trial at the maximum (``stop_last_trials=False``): a trial ends at its own
    last step, whose ``epochs_done`` may pass ``train.epochs`` a report early (an epoch of
    ``ceil(rows / global batch)`` steps reads a little more than the split). In steps too: Tune
    would stop a trial at its last report while Train still finishes it (the last checkpoint
    registered, the workers and their placement group shut down, the MLflow run ended), killing
    that work and leaving Ray Train's warning of a dead controller on the console."""
    from ray.tune.schedulers import ASHAScheduler

    if train.epochs > 0:
        in_epochs: dict[str, Any] = {"max_t": train.epochs, "grace_period": min(1.0, train.epochs)}
        return ASHAScheduler(  # (typed int, but any number: compared with the time attribute)
            time_attr=EPOCHS_DONE, stop_last_trials=False, **in_epochs, **kwargs
        )
    return ASHAScheduler(
        time_attr="step", max_t=train.steps, grace_period=min(grace_steps, train.steps),
        stop_last_trials=False, **kwargs,
    )  # fmt: skip


CONFIRMS = "_confirms"  # in a seed-check trial's params: the id of the trial it re-trains


def searched(params: dict[str, Any]) -> dict[str, Any]:
    """The config keys of a trial's params (without the phases' own, which start with ``_``)."""
    return {k: v for k, v in params.items() if not k.startswith("_")}


def trial_config(spec: TrialSpec, params: dict[str, Any]) -> ExperimentConfig:
    """The trial's config, from ``params`` without the keys that start with ``_`` (the phases'
    own), as workers of the sweep's device train it (``preflight.for_device``). In a sweep every
    report carries validation metrics (schedulers and searchers compare
    trials on them), so evaluation runs at every checkpoint; the sweep's metric scores the trial;
    the workers print no per-step lines (the sweep's table shows progress). A budget in epochs is
    made steps for the trial's workers (``with_budget``; its MLflow params show them), as its
    workers make it again (from the steps and samples done, on a resume)."""
    cfg = ExperimentConfig.from_dict(spec.base).with_overrides(searched(params))
    cfg = preflight.for_device(cfg, "cuda" if spec.use_gpu else "cpu")  # what the workers train
    if cfg.train.epochs > 0:
        cfg = with_budget(cfg, train_rows(cfg), spec.num_workers)
    every = cfg.train.checkpoint_every or cfg.train.steps
    return cfg.with_overrides(
        {
            "train.eval_every": every,
            "train.checkpoint_every": every,
            "train.monitor": spec.metric,
            "train.monitor_mode": spec.mode,
            "train.quiet": True,
            "train.pause_at": int(params.get(PAUSE, 0)),
        }
    )


def open_run(
    tracker: Tracker, spec: TrialSpec, trial_id: str, cfg: ExperimentConfig, params: dict[str, Any]
) -> str:
    """The trial's MLflow run, by its role: a search trial or a baseline under the sweep's run,
    a seed-check trial under the run of the trial it re-trains."""
    parent, tags, name = spec.parent_run_id, {}, ""
    if spec.role == "baseline":
        name = f"{cfg.model.arch} (baseline)"
    if spec.role == "confirm":
        origin = str(params[CONFIRMS])
        found = tracker.find_trial_run(spec.experiment_id, origin)
        parent = found.info.run_id if found is not None else parent
        tags = {Tag.CONFIRMS: origin}
        name = f"{origin} seed {cfg.train.seed}"
    run_id = tracker.trial_run(
        spec.experiment_id, parent, spec.sweep, trial_id, flat_params(cfg.to_dict()),
        kind=spec.role, name=name, tags=tags,
    )  # fmt: skip
    tracker.set_tags(run_id, {Tag.SEARCHED: json.dumps(searched(params), default=str)})
    tracker.log_dataset(run_id, lambda: inputs.describe(cfg.data))
    return run_id


def check_feasible(cfg: ExperimentConfig, spec: TrialSpec) -> feasibility.Verdict:
    constraints = spec.constraints or {}
    if spec.machine is None:
        return feasibility.check_budget(cfg, constraints)
    machine = Machine(spec.machine["device"], spec.machine["hbm"], spec.machine["ddr"])
    local = int(spec.machine["local_world_size"])
    return feasibility.check(cfg, constraints, machine, spec.num_workers, local)


def trial_resources(spec: TrialSpec) -> Resources:
    """The trial's workers, told how many workers may share their node's host memory."""
    share = int((spec.machine or {}).get("node_workers", 0))
    return Resources(spec.num_workers, spec.use_gpu, spec.cpus_per_worker, node_workers=share)


def refuse(tracker: Tracker, run_id: str, verdict: feasibility.Verdict, metric: str) -> None:
    """Record an infeasible trial (no worker was started) in MLflow and Tune: its sizes, and no
    score (every report carries the keys the searcher and scheduler read)."""
    tracker.log_values(run_id, verdict.numbers)
    tracker.set_tags(run_id, {Tag.STATUS: INFEASIBLE, Tag.STATUS_DETAIL: verdict.reason})
    tracker.finish(run_id, "KILLED")
    report = {INFEASIBLE: 1.0, "step": 0, "status_detail": verdict.reason, **verdict.numbers}
    tune.report({**report, f"best_{metric}": math.nan, "best_step": 0.0})


def run_trial(config: dict[str, Any], spec: dict[str, Any]) -> None:
    """The Tune trainable: ``config = {"params": {dotted: value}}``; ``spec``: a TrialSpec dict."""
    spec_ = TrialSpec(**spec)
    _run(spec_, dict(config["params"]))


def _run(spec: TrialSpec, params: dict[str, Any]) -> None:
    opened = time.time()
    cfg = trial_config(spec, params)
    whole = cfg.with_overrides({"train.pause_at": 0})  # the run's config, not this round's
    trial_id = point_of(params, tune.get_context().get_trial_id())
    tracker = Tracker(spec.tracking_uri, keep=unlogged_dir(spec.storage, spec.sweep))
    run_id = open_run(tracker, spec, trial_id, whole, params)
    tracker.log_text(run_id, yaml.safe_dump(whole.to_dict()), "config.yaml")
    verdict = check_feasible(cfg, spec)
    if not verdict.ok:
        return refuse(tracker, run_id, verdict, spec.metric)
    train_storage = storage.join(spec.storage, spec.sweep, "train")
    backfill(tracker, run_id, storage.join(train_storage, f"trial_{trial_id}"))
    fit_start = time.time()
    try:
        result = fit(spec, cfg, trial_id, run_id, train_storage)
    except Exception:
        tracker.finish(run_id, "FAILED")
        raise
    tracker.log_values(run_id, {"trial_fit_start": fit_start, "trial_fit_end": time.time()})
    finish_trial(tracker, run_id, result, cfg.train.monitor_mode, cfg.train.steps, opened)


def trains_inline(spec: TrialSpec) -> bool:
    """Whether the spec's trials train in their Tune trial, without Ray Train
    (``recsys.train.inline``): where they have one CPU worker and a file system's storage."""
    train_storage = storage.join(spec.storage, spec.sweep, "train")
    return inline.fits(spec.num_workers, spec.use_gpu, train_storage)


def trial_failures(spec: TrialSpec) -> Any:
    """Tune's ``FailureConfig`` of a phase's trials: a trial that trains inline is tried again
    up to ``max_failures`` times, from its latest checkpoint (as Ray Train restarts its
    workers: a lost node, a failed worker); one on Ray Train is not (Ray Train does it)."""
    return tune.FailureConfig(max_failures=spec.max_failures if trains_inline(spec) else 0)


def trial_cpus(spec: TrialSpec, driver_cpus: float) -> float:
    """The CPUs of a trial's Tune actor: its driver's, and its worker's where it trains inline."""
    return driver_cpus + (spec.cpus_per_worker if trains_inline(spec) else 0.0)


def fit(
    spec: TrialSpec, cfg: ExperimentConfig, trial_id: str, run_id: str, train_storage: str
) -> Any:
    """Train the trial (resumed from its Train run's latest checkpoint): in this process where it
    trains inline (``trains_inline``), else on Ray Train; its ``ray.train.Result``."""
    name = f"trial_{trial_id}"
    if trains_inline(spec):
        root = storage.join(train_storage, name)
        send = to_tune(run_id)  # (as ``ReportToTune`` sends a Ray Train worker's)
        return inline.train(
            cfg, root, send, spec.cpus_per_worker, system_metrics(spec, run_id),
            node_workers=trial_resources(spec).node_workers,
        )  # fmt: skip
    trainer = make_trainer(
        cfg,
        trial_resources(spec),
        name=name,
        storage_path=train_storage,
        max_failures=spec.max_failures,
        callbacks=[ReportToTune(run_id)],  # MLflow from the driver: ``driver_log``
        system_metrics=system_metrics(spec, run_id),
    )
    return trainer.fit()


def system_metrics(spec: TrialSpec, run_id: str) -> dict[str, Any] | None:
    """Where the trial's workers log their hosts' system metrics (None: off)."""
    if not spec.system_metrics:
        return None
    return {"tracking_uri": spec.tracking_uri, "run_id": run_id, "interval_s": spec.system_metrics}


def backfill(tracker: Tracker, run_id: str, train_run: str) -> int:
    """Log the reports that Ray Train persisted but MLflow never got (the sweep driver died between
    the checkpoint's registration and its logging), so the restored trial leaves no gap in its
    step axis. Returns how many reports were logged."""
    try:
        result = train_result(train_run)
    except RuntimeError:  # a trial that never checkpointed
        return 0
    return log_missing(tracker, run_id, result)


def log_missing(tracker: Tracker, run_id: str, result: Any) -> int:
    """Log the reports of a Train run's persisted ``result`` that ``run_id`` lacks (those after
    its last step); how many."""
    reports = sorted((m for _, m in result.best_checkpoints or []), key=lambda m: m.get("step", 0))
    last = tracker.last_step(run_id)
    missing = [m for m in reports if m.get("step", 0) > last]
    for metrics in missing:
        tracker.log_report(run_id, metrics)
    return len(missing)


def finish_trial(
    tracker: Tracker, run_id: str, result: Any, mode: str, steps: int, opened: float = 0.0
) -> None:
    """Artifacts and status at the end of a trial: the sharding plan, pointers to the best (by the
    sweep's metric and mode) and last checkpoints (and the best itself when small), the status
    (``trial_status``); where the trial's function started at ``opened``, its seconds to here
    (``trial_s``: one a round of halving)."""
    metrics = result.metrics or {}
    tags = {}
    if (last := result.checkpoint) is not None:
        tags[Tag.LAST_CHECKPOINT] = as_uri(last.filesystem, last.path)
        if (plan := sharding_plan(last)) is not None:
            tracker.log_text(run_id, plan, "sharding_plan.json")
    best = result.get_best_checkpoint("ckpt_score", mode) if result.best_checkpoints else None
    if best is not None:
        tags[Tag.BEST_CHECKPOINT] = as_uri(best.filesystem, best.path)
        if _size(best.path) < 64 * 2**20:
            tracker.log_folder(run_id, best.path, artifact_path="checkpoint_best")
    tags[Tag.STATUS] = trial_status(metrics, steps)
    tracker.set_tags(run_id, tags)
    if opened:
        tracker.log_values(run_id, {"trial_s": time.time() - opened})
    tracker.finish(run_id, "FAILED" if tags[Tag.STATUS] == "diverged" else "FINISHED")


def _size(folder: str) -> int:
    if not os.path.isdir(folder):
        return 1 << 62  # remote storage: log the pointer only
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
