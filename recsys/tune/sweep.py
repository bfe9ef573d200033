"""Run (or resume) a sweep: Ray Tune over a search space, one Ray Train job per trial, MLflow runs.

The sweep's folder ``<storage>/<name>`` holds Tune's state, ``sweep.json`` (the space and options
it was started with), ``train/trial_<id>`` (each trial's Train run and checkpoints) and the Tune
state of the later phases, ``baselines/`` and ``confirm/`` (``recsys.tune.phases``).

Trials are scored by their best validation report (``best_<metric>``, reported by the workers):
Tune's searcher and scheduler compare that, Ray Train keeps each trial's best checkpoints by it,
and the results (``recsys.tune.results``), MLflow and the export use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pandas as pd
import yaml

from recsys.configlib import ConfigError
from recsys.data.dataset import run_paths, steps_per_epoch, train_rows, with_budget
from recsys.runtime import storage
from recsys.runtime.cluster import RaySource
from recsys.runtime.shared_storage import check_nodes_see
from recsys.runtime.storage import check_storage, ray_storage
from recsys.tracking.tags import Tag
from recsys.tracking.tracker import Tracker
from recsys.tracking.view import compare_line
from recsys.train import inline
from recsys.tune.driver_log import driver_callbacks
from recsys.tune.edges import EarlyPeaks, Edge, early_peaks, search_edges, widen
from recsys.tune.phases import Outcome, log_confirmation, registered, seed_check
from recsys.tune.results import (
    METRICS,
    any_scored,
    format_table,
    pareto_plot,
    trial_frame,
    with_baselines,
)
from recsys.tune.search import WarmPoint, finite
from recsys.tune.space import SearchSpace
from recsys.tune.state import (
    SweepOptions,
    check_resume,
    export_dir,
    grown_options,
    growths,
    mark_finished,
    part_options,
    record_workers,
    save_state,
    saved_edges,
    start_growth,
    sweep_dir,
    unlogged_dir,
    widenings,
    worker_change,
)
from recsys.tune.trial import TrialSpec, asha, reuse_actors, trial_failures


def budgeted(space: SearchSpace, num_workers: int) -> SearchSpace:
    """``space`` with its base's budget in epochs (``train.epochs``) made steps for trials of
    ``num_workers`` workers (``recsys.data.dataset.with_budget``): the last step the driver's
    table and the trials' status count to where a report does not say its own (``train_steps``).
    Unchanged when the base counts steps."""
    if space.base.train.epochs <= 0:
        return space
    base = with_budget(space.base, train_rows(space.base), num_workers)
    return dataclasses.replace(space, base=base)


def budget_line(space: SearchSpace, num_workers: int) -> str:
    """A ``budgeted`` space's budget in epochs and the steps it came to, for the console (''
    for one in steps)."""
    tc = space.base.train
    if tc.epochs <= 0:
        return ""
    rows = train_rows(space.base)
    per_epoch = steps_per_epoch(rows, tc.batch_size, num_workers)
    return (
        f"budget: {tc.epochs:g} epochs of {rows} training rows = {tc.steps} steps of "
        f"{num_workers} workers x {tc.batch_size} ({per_epoch} steps an epoch), a report every "
        f"{tc.checkpoint_every} steps"
    )


HYPERBAND_BRACKETS = 3


def _scheduler(opts: SweepOptions, space: SearchSpace, single: bool) -> Any:
    """FIFO, or ASHA on the first objective; ``hyperband``: ASHA with 3 brackets (asynchronous
    Hyperband, Li et al. 2020: each bracket its own grace period, 1, 4 and 16 times the first,
    so a slow starter gets a longer look). With a budget in steps its time is the training
    step: rungs from one report interval (``train.checkpoint_every``) to ``train.steps``.

    With a budget in epochs (``train.epochs``) its time is the reports' ``epochs_done``
    (training samples over the split's rows): its grace period is one epoch (the whole budget if
    shorter) and its maximum ``train.epochs``. Epochs, not the steps they come to, because a
    trial's steps depend on its batch size and workers, and Tune restores a scheduler as it was
    saved: in steps, a sweep resumed on fewer workers (more steps an epoch) would cut its trials
    at the old maximum. A trial that passes every rung finishes itself (``trial.asha``).

    ``single``: the Tuner itself has that metric and mode, which Tune then refuses to see on the
    scheduler too (with several objectives the Tuner has none, and ASHA needs its own)."""
    from ray.tune.schedulers import FIFOScheduler

    if opts.scheduler == "fifo":
        return FIFOScheduler()
    score = space.objectives[0]
    metric, mode = (None, None) if single else (score.key, score.mode)
    brackets = HYPERBAND_BRACKETS if opts.scheduler == "hyperband" else 1
    tc = space.base.train
    grace = max(1, tc.checkpoint_every or tc.steps)
    return asha(tc, grace, metric=metric, mode=mode, brackets=brackets)


WORST = {"max": -1.0e30, "min": 1.0e30}


def worst(space: SearchSpace) -> dict[str, float]:
    """A finite stand-in per objective for a trial with no score (``WORST`` by its mode)."""
    return {o.key: WORST[o.mode] for o in space.objectives}


def _searcher(opts: SweepOptions, space: SearchSpace, prior: pd.DataFrame | None = None) -> Any:
    """Random search (seeded), or Optuna's TPE over one or several objectives, warm-started with
    the trials of ``prior`` (a grown sweep's earlier trials: ``warm_points``)."""
    if opts.search == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        # (the generator limits concurrency itself: Tune ignores max_concurrent_trials with it)
        return BasicVariantGenerator(random_state=opts.seed, max_concurrent=opts.max_concurrent)
    from ray.tune.search import ConcurrencyLimiter

    from recsys.tune.search import ConstrainedOptunaSearch

    if grid := [d.key for d in space.dimensions if d.kind == "grid"]:
        raise ConfigError(
            f"{space.source}: grid dimension(s) {', '.join(grid)} with --search optuna: a grid "
            "makes every value a trial of its own, while Optuna samples each dimension itself; "
            "make them `choice` for Optuna to pick from, or use --search random"
        )
    objectives = space.objectives
    searcher = ConstrainedOptunaSearch(
        metric=[o.key for o in objectives] if len(objectives) > 1 else objectives[0].key,
        mode=[o.mode for o in objectives] if len(objectives) > 1 else objectives[0].mode,
        worst=worst(space),
        seed=opts.seed,
        warm=warm_points(prior, space, worst(space)) if prior is not None else [],
    )
    return ConcurrencyLimiter(searcher, max_concurrent=opts.max_concurrent)


def warm_points(
    trials: pd.DataFrame, space: SearchSpace, worst: dict[str, float]
) -> list[WarmPoint]:
    """What a grown sweep's searcher is told first: each earlier search trial with a score (its
    params and best report per objective; pruned at its best step where the scheduler stopped
    it) and each infeasible one (a constraint violation); errored and diverged trials are left
    out (they have no score)."""
    from recsys.tune.results import SCORED, STOPPED

    out = []
    keys = [o.key for o in space.objectives]
    for _, row in trials.iterrows():
        if row.get("role", "trial") != "trial":
            continue
        values = [float(row[k]) if k in row else math.nan for k in keys]
        if row["status"] == "infeasible":
            out.append(WarmPoint(dict(row["params"]), [worst[k] for k in keys], True))
        elif row["status"] in SCORED and all(math.isfinite(v) for v in values):
            step = row.get("last_step", math.nan)  # (where the scheduler stopped it)
            at = int(step) if row["status"] == STOPPED and finite(step) else None
            out.append(WarmPoint(dict(row["params"]), values, False, at))
    return out


def build_tuner(
    space: SearchSpace,
    opts: SweepOptions,
    spec: TrialSpec,
    restore: bool,
    stop: Any = None,
    growth: int = 0,
    prior: pd.DataFrame | None = None,
) -> Any:
    """The sweep's ``Tuner`` (restored when ``restore`` and it exists); ``stop``: a Tune stopper
    (the benchmarks end a sweep once it reached a target). ``growth``: the k-th ``--more`` of a
    finished sweep, a Tune experiment of its own in ``<sweep>/grow-<k>``, its searcher
    warm-started with ``prior`` (the trials before it)."""
    from ray import tune

    from recsys.tune.progress import Progress

    name, root = (f"grow-{growth}", sweep_dir(opts)) if growth else (opts.name, opts.storage)
    path, fs = ray_storage(storage.join(root, name))  # an object store: retried while it is down
    total = space.num_trials(opts.num_samples)
    steps = space.base.train.steps  # (``run_sweep`` has made a budget in epochs steps)
    progress = Progress(space.metric, steps, mode=space.mode, total=total)
    if restore and tune.Tuner.can_restore(path, storage_filesystem=fs):
        return tune.Tuner.restore(
            path, trainable="recsys-trial", resume_unfinished=True, resume_errored=True,
            storage_filesystem=fs,
        )  # (Tune restores its run config, the progress callback included)  # fmt: skip
    score = space.objectives[0]
    single = len(space.objectives) == 1 or opts.search == "random"
    scheduler = _scheduler(opts, space, single)
    return tune.Tuner(
        "recsys-trial",  # (registered by run_phases: ``registered``)
        param_space={"params": space.param_space()},
        tune_config=tune.TuneConfig(
            metric=score.key if single else None,  # several objectives: the searcher's
            mode=score.mode if single else None,
            num_samples=opts.num_samples,
            scheduler=scheduler,
            search_alg=_searcher(opts, space, prior),  # (both limit concurrency themselves)
            reuse_actors=reuse_actors(scheduler, stop),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=ray_storage(root)[0],
            storage_filesystem=fs,
            verbose=0,
            stop=stop,
            callbacks=[progress, *driver_callbacks(spec, steps)],
            failure_config=trial_failures(spec),
        ),
    )


def log_sweep_summary(
    tracker: Tracker, parent: str, experiment_id: str, space: SearchSpace, result: Outcome
) -> None:
    """On the parent run: the space, all trials and baselines as CSV (best reports, cost, role),
    the seed check (``confirm.csv``: one row per seed run; ``confirmed.csv``: each
    configuration's mean and interval), the best trial's params, config and score, its lead over
    each baseline, and the score-against-memory plot."""
    with open(space.source) as f:
        tracker.log_text(parent, f.read(), "search_space.yaml")
    frame = result.frame
    if frame.empty or result.best is None:
        return
    tracker.log_text(parent, frame.drop(columns="params").to_csv(index=False), "trials.csv")
    log_confirmation(tracker, parent, experiment_id, result)
    best = result.best
    params = best["params"]
    tracker.log_text(parent, yaml.safe_dump(params), "best_params.yaml")
    tracker.log_text(parent, yaml.safe_dump(space.config_for(params).to_dict()), "best_config.yaml")
    keys = [o.key for o in space.objectives] + METRICS
    values = {
        (k if k.startswith("best_") else f"best_{k}"): float(best[k])
        for k in dict.fromkeys(keys)
        if k in best and isinstance(best[k], float) and math.isfinite(best[k])
    }
    values.update({f"lead_over_{arch}": lead for arch, lead in result.leads().items()})
    tracker.log_values(parent, values)
    verdicts = {f"{Tag.VERDICT}.{arch}": result.verdict_text(arch) for arch in result.verdicts()}
    tracker.set_tags(parent, {Tag.BEST_TRIAL: str(best["trial"]), **verdicts})
    if (winner := result.winner()) is not None:
        tracker.set_tags(parent, {Tag.WINNER: winner.tag(), Tag.WINNER_TRIAL: winner.trial,
                                  Tag.WINNER_KIND: winner.kind})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        plot = os.path.join(tmp, "auc_vs_memory.png")
        pareto_plot(frame, space, plot)
        tracker.log_file(parent, plot)


@contextlib.contextmanager
def legacy_tune_output() -> Iterator[None]:
    """Tune's newer console output prints a configuration box and TensorBoard hints whatever the
    verbosity; its older one prints nothing at ``verbose=0``, leaving the console to
    ``recsys.tune.progress``. The choice is an environment variable read by ``fit``."""
    saved = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    tune_log = logging.getLogger("ray.tune")
    level = tune_log.level
    tune_log.setLevel(logging.WARNING)  # its INFO lines: where it wrote its state files
    try:
        yield
    finally:
        tune_log.setLevel(level)
        if saved is None:
            del os.environ["RAY_AIR_NEW_OUTPUT"]
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = saved


def machine_spec(opts: SweepOptions, nodes: list[dict[str, float]]) -> dict[str, Any]:
    """What one worker has, as the planner sees it, by the workers' own rule
    (``Machine.of``): its device's memory (a GPU's HBM, measured on one of the cluster's GPUs, or
    ``--device-memory-gb``; on CPU its share of host memory) and its share of the host memory
    of its node (``host_memory_bytes``, measured on the smallest node that can hold workers).
    A trial's workers share a node ``local_world_size`` at a time, and up to
    ``--max-concurrent`` trials may run on one node: the node's memory is divided among
    ``node_workers``, every worker the sweep may place there, by the workers too (passed to
    them with the trial's ``Resources``)."""
    from recsys.runtime.cluster import node_host_memory, node_share

    gpus = 1.0 if opts.use_gpu else 0.0
    local, share = node_share(nodes, opts.num_workers, opts.cpus_per_worker, gpus,
                              opts.max_concurrent)  # fmt: skip
    ddr = node_host_memory(opts.cpus_per_worker, gpus) // share
    given = int(opts.device_memory_gb * 2**30) if opts.device_memory_gb else None
    spec = {"ddr": ddr, "local_world_size": local, "node_workers": share}
    if not opts.use_gpu:
        return {**spec, "device": "cpu", "hbm": None, "ddr": given or ddr}
    return {**spec, "device": "cuda", "hbm": given or gpu_memory()}


def gpu_memory(timeout_s: float = 120.0) -> int:
    """One cluster GPU's memory, measured by a one-GPU task."""
    import ray

    @ray.remote(num_gpus=1)
    def probe() -> int:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)

    try:
        return int(ray.get(probe.remote(), timeout=timeout_s))
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(
            f"could not measure a GPU's memory within {timeout_s:.0f} s (all GPUs busy?); "
            "pass --device-memory-gb"
        ) from None


def launch(
    space: SearchSpace,
    opts: SweepOptions,
    *,
    address: str | RaySource | None = None,
    export: str | None = None,
    register: str | None = None,
    refit: bool = False,
    restore: bool | None = None,
) -> list[dict[str, Any]]:
    """Everything ``recsys-sweep`` does: check the request (resume, MLflow, cluster fit) before
    anything launches, connect to Ray, run or resume the sweep, print the best trials and where
    to look, and export the best one if asked (``refit``: refitted first, ``recsys.tune.refit``).
    Returns the trials' rows, best first.
    ``restore``: what ``check_resume`` said of it, where the caller checked (the command line,
    with the options typed); None: checked here."""
    if restore is None:
        check_storage(opts.storage)
        restore = check_resume(space, opts)
        opts = grown_options(opts, frozenset()) if opts.more else opts
    if restore and (change := worker_change(opts)):
        print(change)
    tracker = checked_before_ray(space, opts, restore)
    start_on_ray(space, opts, address)
    table = run_sweep(space, opts, tracker, restore)
    link = tracker.show_sweep(opts.name, [o.key for o in space.objectives])  # its MLflow UI view
    print(f"\nsweep folder: {sweep_dir(opts)}")
    if export:
        export_winner(opts, export, register, refit)
    if (kept := unlogged_dir(opts.storage, opts.name)) and os.path.isdir(kept):
        print(
            f"artifacts MLflow could not store are kept in {kept} (one folder per run; the "
            "warnings above name each and the command that logs it later)"
        )
    print(compare_line(opts.tracking_uri, link))
    return table


def checked_before_ray(space: SearchSpace, opts: SweepOptions, restore: bool) -> Tracker:
    """What the driver refuses before Ray starts: the space as this run searches it (grown or
    widened on a resume; ``--widen`` with no edge to widen), every config of it, and MLflow's
    reach and artifact space. Returns the sweep's tracker."""
    from recsys.tune.preflight import check_space

    parts = growths(opts) if restore else []
    if opts.more and opts.widen:
        if not (edges := saved_edges(opts)):
            raise ConfigError(
                f"--widen: the last search of sweep {opts.name!r} pressed against no edge of its "
                "space: nothing to widen; --more N alone grows it"
            )
        parts = [*parts, {"widened": edges}]
    searched = searched_space(space, parts)
    check_space(searched, "cuda" if opts.use_gpu else "cpu", opts.num_workers)  # before Ray
    tracker = Tracker(opts.tracking_uri, keep=unlogged_dir(opts.storage, opts.name))
    tracker.check_reachable()
    tracker.check_artifact_space(opts.name)
    return tracker


def start_on_ray(space: SearchSpace, opts: SweepOptions, address: str | RaySource | None) -> None:
    """Connect to (or start) Ray, wait until the trial's workers fit (a trial that trains inline:
    its driver and worker on one node, ``recsys.train.inline``), and refuse a storage or data
    path some node sees otherwise."""
    from recsys.runtime.cluster import connect, start_train_coordinator, wait_for_fit

    connect(address)
    start_train_coordinator()
    gpus = 1.0 if opts.use_gpu else 0.0
    if inline.fits(opts.num_workers, opts.use_gpu, opts.storage):  # its driver's and worker's
        cpus = opts.cpus_per_worker + opts.driver_cpus  # CPUs on one node: one Tune actor
        wait_for_fit(1, cpus, 0.0, 0.0, opts.wait_for_nodes)
    else:
        wait_for_fit(
            opts.num_workers, opts.cpus_per_worker, gpus, opts.driver_cpus, opts.wait_for_nodes
        )
    check_nodes_see(*run_paths(opts.storage, space.base.data))  # one node's own disk: refused


def export_winner(opts: SweepOptions, export: str, register: str | None, refit: bool) -> None:
    """Export the sweep's best trial as ``export`` (refitted first where ``refit``), registered
    as ``register`` if given, and say where it went and its test AUC."""
    from recsys.serving.mlflow_model import quiet_libraries
    from recsys.tune.publish import export_best

    quiet_libraries()
    out = export_dir(opts.storage, opts.name)
    if refit:
        from recsys.train.ray_trainer import Resources
        from recsys.tune.refit import refit_best

        workers = Resources(opts.num_workers, opts.use_gpu, opts.cpus_per_worker)
        run_id, report, uri = refit_best(
            opts.tracking_uri, opts.name, opts.storage, workers, out, export, register
        )
        what = f"the best trial refitted (run {run_id})"
    else:
        run_id, report, uri = export_best(opts.tracking_uri, opts.name, out, export, register)
        what = f"the best trial ({run_id})"
    print(
        f"exported {what} as {export}: {report.path}; test AUC "
        f"{report.exported_auc:.4f} (FP32 {report.fp32_auc:.4f}); MLflow model {uri}"
    )


def run_sweep(
    space: SearchSpace, opts: SweepOptions, tracker: Tracker, restore: bool
) -> list[dict[str, Any]]:
    """Start or resume the sweep on the connected Ray; returns the trials' rows, best first."""
    from recsys.runtime.cluster import alive_nodes
    from recsys.train.nodes import quiet_lost_trial_processes

    quiet_lost_trial_processes()  # a lost trial's process in a line, not Tune's traceback
    experiment_id = tracker.experiment(opts.name)
    parent = tracker.parent_run(experiment_id, opts.name)
    tracker.set_tags(parent, {Tag.METRIC: space.metric, Tag.MODE: space.mode})
    spec = TrialSpec(
        sweep=opts.name,
        base=space.base.to_dict(),
        storage=opts.storage,
        tracking_uri=opts.tracking_uri,
        experiment_id=experiment_id,
        parent_run_id=parent,
        num_workers=opts.num_workers,
        use_gpu=opts.use_gpu,
        cpus_per_worker=opts.cpus_per_worker,
        max_failures=opts.max_failures,
        metric=space.metric,
        mode=space.mode,
        constraints=space.constraints,
        machine=machine_spec(opts, alive_nodes()),
        system_metrics=opts.system_metrics,
    )
    if not restore:
        save_state(space, opts)
    scores = ", ".join(f"{o.metric} ({o.mode})" for o in space.objectives)
    if opts.more:
        _searcher(opts, space)  # refused before the growth is recorded (a grid with Optuna)
        k = start_growth(opts)
        print(f"growing sweep {opts.name!r} ({k}): {opts.more} more trials of {space.source} "
              f"({opts.search} search), by {scores}")  # fmt: skip
    else:
        verb = "resuming" if restore else "starting"
        print(f"{verb} sweep {opts.name!r}: {opts.num_samples} trials of {space.source}, by "
              f"{scores}")  # fmt: skip
    if restore:
        record_workers(opts)  # what a bare re-run resumes with (after every refusal above)
    space = budgeted(space, opts.num_workers)  # (a resume on other workers derives again)
    if line := budget_line(space, opts.num_workers):
        print(line)
    result = run_phases(space, opts, spec, restore)
    searched = searched_space(space, growths(opts))
    edges, peaks = search_edges(result.frame, searched), early_peaks(result.frame, searched)
    log_sweep_summary(tracker, parent, experiment_id, space, result)
    tracker.set_tags(parent, edge_tags(edges, peaks))
    tracker.finish(parent)
    rows = list(result.frame.to_dict("records"))
    if any_scored(rows):  # a re-run is refused (unscored, --resume retries it all)
        trials = [r for r in rows if r.get("role", "trial") == "trial"]
        errored = sum(r.get("status") == "error" for r in trials)
        mark_finished(opts, len(trials), errored, [e.saved() for e in edges])
    print(f"\nbest trials (each by its best {space.metric} report):")
    winner = result.winner()
    print(format_table(result.frame, space, winner=winner.trial if winner else ""))
    print(result.lines())
    for line in [e.line() for e in edges] + ([peaks.line()] if peaks.most else []):
        print(line)
    return rows


def searched_space(space: SearchSpace, parts: list[dict[str, Any]]) -> SearchSpace:
    """The space the sweep's last part searched: ``space`` with each growth's widened edges
    (``--widen``) applied in order."""
    for options in parts:
        if edges := widenings(options):
            space = widen(space, edges)
    return space


def edge_tags(edges: list[Edge], peaks: EarlyPeaks) -> dict[str, str]:
    """The parent run's tags of the search's edges (``recsys.edge.<key>``) and early peaks."""
    tags = {f"{Tag.EDGE}.{e.dim.key}": e.tag() for e in edges}
    if peaks.most:
        tags[Tag.EARLY_PEAKS] = f"{peaks.early} of {peaks.of} trials within their first tenth"
    return tags


def widened_text(space: SearchSpace, edges: list[dict[str, Any]]) -> list[str]:
    """Each widened dimension as the growth searches it: ``optim.lr loguniform [0.01, 1.0]``."""
    dims = {d.key: d for d in space.dimensions}
    return [f"{e['key']} {dims[e['key']].kind} {dims[e['key']].values} ({e['side']})"
            for e in edges if e["key"] in dims]  # fmt: skip


def ran(tuner: Any, finished: bool) -> Any:
    """A restored part's results as they stand (``finished``: a part before a growth, whose
    errored trials ``--more`` must not retry), else what its ``fit`` runs."""
    return tuner.get_results() if finished else tuner.fit()


def run_phases(space: SearchSpace, opts: SweepOptions, spec: TrialSpec, restore: bool) -> Outcome:
    """The references (if the space lists any) beside the search and each of its growths, then
    the seed check (if asked)."""
    from recsys.runtime.cluster import alive_nodes
    from recsys.tune.baselines import Beside, Found, Run, header, room_beside, search_references

    parts = growths(opts)  # a part before the last one finished: read, never run again
    with legacy_tune_output():
        for role in ("trial", "confirm"):  # (names registered in this thread: ``registered``)
            registered(opts, spec, role)
        beside, found = None, Found()
        if space.baselines:
            run = Run(space, opts, spec, restore, finished=restore and bool(parts))
            run.register()
            together = room_beside(opts, alive_nodes())
            print(header(space, opts.scheduler, together, opts.max_concurrent))
            if together:
                beside = Beside(run).start()
            else:
                found = search_references(run)
        results = list(ran(build_tuner(space, opts, spec, restore), restore and bool(parts)))
        searched = space
        for k, options in enumerate(parts, 1):
            grown = dataclasses.replace(opts, **part_options(options))
            if edges := widenings(options):  # --widen: this growth searches wider ranges
                searched = widen(searched, edges)
                if opts.more and k == len(parts):
                    print(f"widened: {', '.join(widened_text(searched, edges))}")
            prior = trial_frame(results, searched)
            if opts.more and k == len(parts) and grown.search != "random":
                warm = len(warm_points(prior, searched, worst(searched)))
                print(f"the {grown.search} search is warm-started with {warm} earlier trials")
            tuner = build_tuner(searched, grown, spec, True, growth=k, prior=prior)
            results += list(ran(tuner, k < len(parts)))
        found = beside.result() if beside is not None else found
        trials = trial_frame(results, space)
        seeds = seed_check(space, opts, spec, restore, trials, found.frame, len(parts))
    frame = with_baselines(trials, found.frame, space)
    return Outcome(frame, seeds, space, found.walks)
