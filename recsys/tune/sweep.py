"""Run (or resume) a sweep: Ray Tune over a search space, one Ray Train job per trial, MLflow runs.

The sweep's folder ``<storage>/<name>`` holds Tune's state, ``sweep.json`` (the space and options
it was started with) and ``train/trial_<id>`` (each trial's Train run and checkpoints).
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from recsys.configlib import ConfigError
from recsys.tune.space import SearchSpace
from recsys.tune.tracking import Tracker
from recsys.tune.trial import TrialSpec, run_trial

TABLE_COLUMNS = [
    ("val_auc", "AUC"),
    ("val_log_loss", "logloss"),
    ("val_ne", "NE"),
    ("emb_bytes", "emb MB"),
    ("samples_per_s", "samples/s"),
]


@dataclass(frozen=True)
class SweepOptions:
    """Everything the command line decides. See ``experiments/sweep.py --help``."""

    name: str
    storage: str
    tracking_uri: str
    num_samples: int = 8
    max_concurrent: int = 1
    scheduler: str = "fifo"
    search: str = "random"
    num_workers: int = 2
    cpus_per_worker: float = 0.95
    use_gpu: bool = False
    driver_cpus: float = 0.1
    max_failures: int = 1
    seed: int = 0
    resume: bool = False


def sweep_dir(opts: SweepOptions) -> str:
    return os.path.join(opts.storage, opts.name)


def _fingerprint(space: SearchSpace) -> dict[str, Any]:
    return {"space": space.raw, "base": space.base.to_dict()}


def check_resume(space: SearchSpace, opts: SweepOptions) -> bool:
    """Whether to restore: a sweep of that name exists. ``--resume`` of a missing sweep, or of one
    started with another space, is an error."""
    path = sweep_dir(opts)
    state = os.path.join(path, "sweep.json")
    if not os.path.isfile(state):
        if opts.resume:
            raise ConfigError(f"--resume: no sweep named {opts.name!r} in {opts.storage}")
        return False
    with open(state) as f:
        saved = json.load(f)
    if saved["fingerprint"] != json.loads(json.dumps(_fingerprint(space), default=str)):
        raise ConfigError(
            f"sweep {opts.name!r} in {path} was started with another search space or base config "
            f"({saved['space_source']}); use a new --name, or the same space to resume"
        )
    return True


def _save_state(space: SearchSpace, opts: SweepOptions) -> None:
    os.makedirs(sweep_dir(opts), exist_ok=True)
    state = {
        "fingerprint": _fingerprint(space),
        "space_source": space.source,
        "options": asdict(opts),
    }
    with open(os.path.join(sweep_dir(opts), "sweep.json"), "w") as f:
        json.dump(state, f, indent=2, default=str)


def _scheduler(opts: SweepOptions, space: SearchSpace) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if opts.scheduler == "fifo":
        return FIFOScheduler()
    steps = space.base.train.steps
    grace = max(1, space.base.train.checkpoint_every or steps)
    return ASHAScheduler(time_attr="step", max_t=steps, grace_period=min(grace, steps))


def _searcher(opts: SweepOptions, space: SearchSpace) -> Any:
    if opts.search == "random":
        return None
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    if any(d.kind == "grid" for d in space.dimensions):
        raise ConfigError(f"{space.source}: grid dimensions need --search random")
    return ConcurrencyLimiter(OptunaSearch(seed=opts.seed), max_concurrent=opts.max_concurrent)


def _trainable(opts: SweepOptions, spec: TrialSpec) -> Any:
    from ray import tune

    trainable = tune.with_parameters(run_trial, spec=spec.to_dict())
    return tune.with_resources(trainable, {"CPU": opts.driver_cpus})


def build_tuner(space: SearchSpace, opts: SweepOptions, spec: TrialSpec, restore: bool) -> Any:
    from ray import tune

    path = sweep_dir(opts)
    if restore and tune.Tuner.can_restore(path):
        return tune.Tuner.restore(
            path, trainable=_trainable(opts, spec), resume_unfinished=True, resume_errored=True
        )
    return tune.Tuner(
        _trainable(opts, spec),
        param_space={"params": space.param_space()},
        tune_config=tune.TuneConfig(
            metric=space.metric,
            mode=space.mode,
            num_samples=opts.num_samples,
            max_concurrent_trials=opts.max_concurrent,
            scheduler=_scheduler(opts, space),
            search_alg=_searcher(opts, space),
        ),
        run_config=tune.RunConfig(name=opts.name, storage_path=opts.storage, verbose=1),
    )


def rows(result_grid: Any, metric: str, mode: str) -> list[dict[str, Any]]:
    """One row per trial: searched params, status, the table's metrics; best first."""
    out = []
    for r in result_grid:
        m = r.metrics or {}
        row: dict[str, Any] = {"trial_id": m.get("trial_id", ""), "status": "ok"}
        if r.error is not None:
            row["status"] = "error"
        elif m.get("diverged"):
            row["status"] = "diverged"
        row.update({f"param:{k}": v for k, v in (r.config or {}).get("params", {}).items()})
        for key, _ in TABLE_COLUMNS:
            row[key] = m.get(key, float("nan"))
        row["checkpoint"] = m.get("checkpoint_path", "")
        row["worker_nodes"] = m.get("worker_nodes", "")
        out.append(row)
    sign = -1 if mode == "max" else 1

    def order(row: dict[str, Any]) -> tuple[int, float]:
        v = row.get(metric, float("nan"))
        ok = isinstance(v, float) and v == v
        return (0 if ok else 1, sign * v if ok else 0.0)

    return sorted(out, key=order)


def format_table(table: list[dict[str, Any]], top: int = 10) -> str:
    params = [k for k in (table[0] if table else {}) if k.startswith("param:")]
    header = ["trial", "status", *[p[6:] for p in params], *[h for _, h in TABLE_COLUMNS]]
    lines = []
    for row in table[:top]:
        cells = [str(row["trial_id"]), row["status"], *[_fmt(row[p]) for p in params]]
        for key, _ in TABLE_COLUMNS:
            v = row[key]
            cells.append(_fmt(v / 2**20 if key == "emb_bytes" else v))
        lines.append(cells)
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [header, *lines])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if v == v else "-"
    return str(v)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (lower memory, higher AUC), sorted by memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_plot(table: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in table if r["val_auc"] == r["val_auc"] and r["emb_bytes"] == r["emb_bytes"]]
    pts = [(r["emb_bytes"] / 2**20, r["val_auc"]) for r in ok]
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], c="tab:blue", label="trials")
    ax.plot(
        [pts[i][0] for i in front],
        [pts[i][1] for i in front],
        "o-",
        c="tab:red",
        label="Pareto front",
    )
    for r, (x, y) in zip(ok, pts, strict=True):
        ax.annotate(str(r["trial_id"])[-5:], (x, y), fontsize=7, alpha=0.7)
    ax.set_xlabel("embedding memory (MB)")
    ax.set_ylabel("validation AUC")
    ax.set_title("Validation AUC against embedding memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def log_sweep_summary(
    tracker: Tracker, parent: str, space: SearchSpace, table: list[dict[str, Any]]
) -> None:
    """On the parent run: the space, the best config and metrics, all trials as CSV, the plot."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(space.source) as f:
            tracker.log_text(parent, f.read(), "search_space.yaml")
        if table:
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
            tracker.log_text(parent, buf.getvalue(), "trials.csv")
            best = table[0]
            params = {k[6:]: v for k, v in best.items() if k.startswith("param:")}
            tracker.log_text(parent, yaml.safe_dump(params), "best_params.yaml")
            cfg = space.config_for(params).to_dict()
            tracker.log_text(parent, yaml.safe_dump(cfg), "best_config.yaml")
            values = {
                f"best_{key}": best[key]
                for key, _ in TABLE_COLUMNS
                if isinstance(best[key], float) and best[key] == best[key]
            }
            tracker.log_values(parent, values)
            plot = os.path.join(tmp, "auc_vs_memory.png")
            pareto_plot(table, plot)
            tracker.log_file(parent, plot)


def launch(
    space: SearchSpace,
    opts: SweepOptions,
    *,
    address: str | None = None,
    export: str | None = None,
    register: str | None = None,
) -> list[dict[str, Any]]:
    """Everything ``recsys-sweep`` does: check the request (resume, MLflow, cluster fit) before
    anything launches, connect to Ray, run or resume the sweep, print the best trials and where
    to look, and export the best one if asked. Returns the trials' rows, best first."""
    from recsys.cluster import alive_nodes, check_fits, connect

    restore = check_resume(space, opts)
    tracker = Tracker(opts.tracking_uri)
    tracker.check_reachable()
    connect(address)
    gpus = 1.0 if opts.use_gpu else 0.0
    nodes = alive_nodes()
    check_fits(opts.num_workers, opts.cpus_per_worker, gpus, nodes, extra_cpus=opts.driver_cpus)
    table = run_sweep(space, opts, tracker, restore)
    print("\nbest trials (validation):")
    print(format_table(table))
    print(f"\nsweep folder: {sweep_dir(opts)}")
    if export:
        from recsys.tune.publish import export_best

        out = os.path.join(sweep_dir(opts), "export")
        run_id, report, uri = export_best(opts.tracking_uri, opts.name, out, export, register)
        print(
            f"exported the best trial ({run_id}) as {export}: {report.path}; test AUC "
            f"{report.exported_auc:.4f} (FP32 {report.fp32_auc:.4f}); MLflow model {uri}"
        )
    print(
        f"compare the runs: mlflow ui --backend-store-uri {opts.tracking_uri} "
        "--host 127.0.0.1 --port 5000"
    )
    return table


def run_sweep(
    space: SearchSpace, opts: SweepOptions, tracker: Tracker, restore: bool
) -> list[dict[str, Any]]:
    """Start or resume the sweep on the connected Ray; returns the trials' rows, best first."""
    local = opts.tracking_uri.startswith(("sqlite:", "file:"))
    root = os.path.dirname(os.path.abspath(opts.tracking_uri.split(":///", 1)[1])) if local else ""
    artifacts = Path(root, "mlartifacts", opts.name).as_uri() if local else None
    experiment_id = tracker.experiment(opts.name, artifacts)
    parent = tracker.parent_run(experiment_id, opts.name)
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
    )
    if not restore:
        _save_state(space, opts)
    verb = "resuming" if restore else "starting"
    print(f"{verb} sweep {opts.name!r}: {opts.num_samples} trials of {space.source}")
    results = build_tuner(space, opts, spec, restore).fit()
    table = rows(results, space.metric, space.mode)
    log_sweep_summary(tracker, parent, space, table)
    tracker.finish(parent)
    return table
