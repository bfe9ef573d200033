"""A sweep's options and its saved state: what resuming a sweep checks before anything launches.

``<storage>/<name>/sweep.json`` holds the space and base config the sweep started with; resuming
with another is refused, naming the file. Kept apart from the sweep driver so that these checks
run before Ray, torch and MLflow load.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from recsys.configlib import ConfigError, kept, option, restored
from recsys.runtime import storage
from recsys.runtime.cluster import WorkerOptions
from recsys.runtime.storage import is_uri
from recsys.tune.space import SearchSpace


@dataclass(frozen=True, kw_only=True)
class SweepOptions(WorkerOptions):
    """Everything the command line decides (``recsys-sweep --help``): each option declared once,
    on its field (``option``: its flag, help and default; whether a resume restores it and a
    growth keeps it), and the parser made from these fields (``recsys.cli.add_options``)."""

    name: str
    storage: str
    tracking_uri: str
    num_samples: int = option(
        8, "trials to sample (default: the space's num_samples)", kind="count", restored=True
    )
    max_concurrent: int = option(1, "trials running at once", kind="count", restored=True,
                                 kept=True)  # fmt: skip
    scheduler: str = option(
        "fifo", "trial scheduler; asha stops the trials behind at rungs of the budget; "
        "hyperband: asha with 3 brackets of different grace periods",
        choices=("fifo", "asha", "hyperband"), restored=True, kept=True,
    )  # fmt: skip
    search: str = option(
        "random", "search algorithm; optuna: TPE, told the trials a scheduler stopped as pruned "
        "(with --scheduler hyperband: TPE with Hyperband, as BOHB pairs them)",
        choices=("random", "optuna"), restored=True, kept=True,
    )  # fmt: skip
    driver_cpus: float = option(0.1, "CPU of each trial's driver", kind="positive")
    max_failures: int = option(1, "worker restarts per trial", kind="int")
    seed: int = option(0, "the search's seed", kind="int", restored=True)
    resume: bool = option(
        False, "resume the unfinished sweep of this --name (a re-run of the name does too)",
        group="again",
    )  # fmt: skip
    device_memory_gb: float | None = option(
        None, "memory of one worker's device for the pre-launch check (default: a GPU's, "
        "measured; on CPU the node's memory over its workers)", kind="positive",
    )  # fmt: skip
    more: int = option(
        0, "grow the finished sweep of this --name by N trials (not with --num-samples): "
        "--search optuna starts from every earlier trial's score; --search, --scheduler, "
        "--max-concurrent as it last ran unless given", kind="count", metavar="N", group="again",
    )  # fmt: skip
    widen: bool = option(
        False, "with --more: grow the sweep with each range its best trials pressed against "
        "(the edges its last search printed) widened on that side",
    )  # fmt: skip
    system_metrics: float = option(
        0.0, "log each trial's system metrics in its MLflow run, a sample every S seconds per "
        "host (CPU, memory, disk, network; GPU where present); default off", kind="positive",
        metavar="S",
    )  # fmt: skip
    confirm: int | None = option(
        None, "after the search, re-train the K best with --seeds new seeds each (0: no seed "
        "check; default: the space's confirm section)", kind="int", metavar="K", restored=True,
    )  # fmt: skip
    seeds: int | None = option(
        None, "new seeds per confirmed configuration (default: the space's, else 3)",
        kind="int", metavar="N", restored=True,
    )  # fmt: skip


def default_tracking_uri(root: str) -> str:
    """A local SQLite store in the project folder (MLflow 3 refuses the plain file store)."""
    return f"sqlite:///{os.path.join(root, 'mlflow.db')}"


def reading_uri(given: str | None, root: str) -> str:
    """The store a command that reads a sweep's runs or models uses: ``given`` (its
    ``--tracking-uri``), else ``root``'s SQLite file where it exists; a ``ValueError`` otherwise
    (MLflow would create an empty store there, and the error would then leave it behind)."""
    if given:
        return given
    path = os.path.join(root, "mlflow.db")
    if not os.path.isfile(path):
        raise ValueError(f"no MLflow store here ({path} does not exist): run it in the folder "
                         "the sweep ran in, or pass --tracking-uri")  # fmt: skip
    return default_tracking_uri(root)


def sweep_dir(opts: SweepOptions) -> str:
    """The sweep's folder or object store prefix (``recsys.runtime.storage``)."""
    return storage.join(opts.storage, opts.name)


def export_dir(storage_path: str, sweep: str) -> str:
    """Where a sweep's best is exported (``recsys-sweep --export``, ``recsys-export --sweep``):
    ``<storage>/<sweep>/export`` on a file-system storage, else ``exports/<sweep>`` in the working
    folder (an object store gets no export written into it; the model is logged to MLflow)."""
    if is_uri(storage_path):
        return os.path.abspath(os.path.join("exports", sweep))
    return os.path.join(storage.resolved(storage_path), sweep, "export")


def unlogged_dir(where: str, sweep: str) -> str | None:
    """Where a sweep keeps the artifacts MLflow could not store: a folder of its own, where its
    storage is a file system (None for an object store URI: the warning then names the artifact)."""
    return None if is_uri(where) else os.path.join(where, sweep, "unlogged_artifacts")


def _fingerprint(space: SearchSpace) -> dict[str, Any]:
    """What a resume must find unchanged: the space but its ``run`` section (how the sweep runs,
    as the flags it stands for), and the base config."""
    raw = {k: v for k, v in space.raw.items() if k != "run"}
    return {"space": raw, "base": space.base.to_dict()}


# the options a resumed sweep keeps from its start, whatever is typed (Tune's restore brings back
# its searcher, scheduler, sample count and concurrency; the seed check its points), with their
# flags: declared on SweepOptions' fields
RESTORED = restored(SweepOptions)
KEPT = kept(SweepOptions)  # what a growth keeps from the sweep's last part unless typed
NEW_SWEEP = "use a new --name, or --restart to archive this sweep and start it over"
GROWTHS = "growths"  # sweep.json: the options of each --more, in order
EDGES = "edges"  # sweep.json: the edges the last search flagged (recsys.tune.edges)
WIDENED = "widened"  # in a growth's options: the edges it widened (--widen)


def saved_state(opts: SweepOptions) -> dict[str, Any] | None:
    """The sweep's ``sweep.json`` (None if there is none)."""
    return read_saved(opts.storage, opts.name)


def read_saved(storage_path: str, name: str) -> dict[str, Any] | None:
    """``<storage_path>/<name>/sweep.json`` (None if there is none)."""
    state = state_file(storage_path, name)
    return json.loads(storage.read_text(state)) if storage.exists(state) else None


def state_file(storage_path: str, name: str) -> str:
    """Where sweep ``name`` keeps its ``sweep.json``."""
    return storage.join(storage_path, name, "sweep.json")


def check_resume(
    space: SearchSpace, opts: SweepOptions, typed: frozenset[str] = frozenset()
) -> bool:
    """Whether to restore: a sweep of that name exists, unfinished, or finished and grown
    (``--more``). Refused, before anything launches: ``--resume`` or ``--more`` of a missing
    sweep; a re-run of a finished one without ``--more`` (its results stand; ``--resume`` of one
    with errored trials retries them); ``--more`` of an unfinished one; another space or base
    config; a typed option of ``RESTORED`` (``typed``: the ``SweepOptions`` fields the user
    gave) that differs from the saved one on a resume, each named with its saved and given
    value."""
    path = sweep_dir(opts)
    saved = saved_state(opts)
    if saved is None:
        if opts.resume or opts.more:
            flag = "--resume" if opts.resume else "--more"
            raise ConfigError(f"{flag}: no sweep named {opts.name!r} in {opts.storage}")
        return False
    _check_same_space(space, opts, saved)
    if opts.more:
        if not saved.get("finished"):
            raise ConfigError(
                f"--more: sweep {opts.name!r} in {path} is unfinished: resume it first "
                f"(--resume), then grow it"
            )
        _check_device_change(space, opts, saved)  # (a growth resumes its errored seed checks)
        return True
    if saved.get("finished") and not (opts.resume and saved.get("errored")):
        raise ConfigError(
            f"sweep {opts.name!r} in {path} has finished ({saved['finished']}): its results "
            f"stand (recsys-export --sweep {opts.name} exports its best); --more N adds N trials "
            f"to it, warm-started with its results; or {NEW_SWEEP}"
        )
    was = running_options(saved)
    differ = [
        f"{RESTORED[k]} {was[k]!r} when it started, {getattr(opts, k)!r} now"
        for k in sorted(typed & RESTORED.keys())
        if k in was and was[k] != getattr(opts, k)
    ]
    if differ:
        raise ConfigError(
            f"sweep {opts.name!r} in {path} is unfinished and resumes with the options it started "
            f"with: {'; '.join(differ)}. Leave them out to resume it, or {NEW_SWEEP}"
        )
    _check_device_change(space, opts, saved)
    return True


def _check_device_change(space: SearchSpace, opts: SweepOptions, saved: dict[str, Any]) -> None:
    """Refuse a resume (or a growth, which resumes its errored seed-check runs) that moves a
    sweep between CPU and GPU workers when its trials may train their tables with
    ``optim.embedding_optimizer: adam`` (a searched choice, else the base config, or a
    reference's overrides): CPU workers hold such tables dense and train them with torch's Adam
    (``recsys.distributed.preflight``), GPU workers shard them with FBGEMM's fused Adam, and
    neither's optimizer state loads into the other's checkpoint layout."""
    was_gpu = bool(latest_workers(saved).get("use_gpu"))
    if was_gpu == opts.use_gpu or not _may_train_adam_tables(space):
        return
    kind = {False: "CPU", True: "GPU"}
    verb = "grow" if opts.more else "resume"
    flag = "with --gpus" if was_gpu else "without --gpus"
    raise ConfigError(
        f"sweep {opts.name!r} in {sweep_dir(opts)} ran on {kind[was_gpu]} workers and its trials "
        "may train their tables with optim.embedding_optimizer='adam', whose optimizer state "
        f"{kind[was_gpu]} and {kind[opts.use_gpu]} workers lay out differently (dense tables "
        f"with torch's Adam on CPU, FBGEMM's fused Adam on GPU): {verb} it {flag}, or "
        f"{NEW_SWEEP}"
    )


def _may_train_adam_tables(space: SearchSpace) -> bool:
    key = "optim.embedding_optimizer"
    searched = [d for d in space.dimensions if d.key == key]
    trials = (
        any("adam" in d.values for d in searched)
        if searched
        else space.base.optim.embedding_optimizer == "adam"
    )
    return trials or any(p.get(key) == "adam" for p in space.reference_points())


def _check_same_space(space: SearchSpace, opts: SweepOptions, saved: dict[str, Any]) -> None:
    if saved["fingerprint"] != json.loads(json.dumps(_fingerprint(space), default=str)):
        raise ConfigError(
            f"sweep {opts.name!r} in {sweep_dir(opts)} was started with another search space or "
            f"base config ({saved['space_source']}); {NEW_SWEEP}, or the same space to resume"
        )


def running_options(saved: dict[str, Any]) -> dict[str, Any]:
    """The ``RESTORED`` options of a sweep's last part: its latest growth's, else its start's."""
    grown = saved.get(GROWTHS) or []
    return dict(grown[-1]) if grown else dict(saved.get("options", {}))


def growths(opts: SweepOptions) -> list[dict[str, Any]]:
    """Each ``--more`` of the sweep, in order: the ``RESTORED`` options its trials ran with."""
    return list((saved_state(opts) or {}).get(GROWTHS) or [])


def grown_options(opts: SweepOptions, typed: frozenset[str]) -> SweepOptions:
    """``opts`` of ``--more N``: ``N`` samples; the search, scheduler and concurrency the sweep
    last ran with unless typed; the seed typed, else the start's seed plus the growth's number
    (a random search then draws new points, not its first ones again)."""
    saved = saved_state(opts) or {}
    last = running_options(saved)
    keep: dict[str, Any] = {k: last[k] for k in KEPT if k in last and k not in typed}
    if "seed" not in typed:
        keep["seed"] = int(saved.get("options", {}).get("seed", 0)) + len(growths(opts)) + 1
    return dataclasses.replace(opts, **keep, num_samples=opts.more)


def saved_edges(opts: SweepOptions) -> list[dict[str, Any]]:
    """The edges the sweep's last search flagged (``recsys.tune.edges``), as ``sweep.json``
    keeps them: ``[{key, side}]``."""
    return list((saved_state(opts) or {}).get(EDGES) or [])


def widenings(options: dict[str, Any]) -> list[dict[str, Any]]:
    """The edges a growth's recorded options widened (``--widen``), ``[]`` for none."""
    return list(options.get(WIDENED) or [])


def part_options(options: dict[str, Any]) -> dict[str, Any]:
    """A growth's recorded options without its widenings: ``SweepOptions`` fields."""
    return {k: v for k, v in options.items() if k != WIDENED}


def start_growth(opts: SweepOptions) -> int:
    """Record in ``sweep.json`` that the finished sweep grows by ``opts.more`` trials (it is
    unfinished again until they end: a killed growth resumes), with ``--widen`` the edges it
    widens (the space it searches: its fingerprint beside the start's); returns the growth's
    number."""
    saved = saved_state(opts) or {}
    part = {k: getattr(opts, k) for k in RESTORED}
    if opts.widen:
        part[WIDENED] = list(saved.get(EDGES) or [])
    saved.setdefault(GROWTHS, []).append(part)
    saved.pop("finished", None)
    saved.pop("errored", None)
    write_state(opts, saved)
    return len(saved[GROWTHS])


def write_state(opts: SweepOptions, saved: dict[str, Any]) -> None:
    """``sweep.json`` of the sweep replaced by ``saved`` (its start's, ``save_state``; or as
    ``saved_state`` read it, changed); values JSON has no type for are written as text."""
    text = json.dumps(saved, indent=2, default=str)
    storage.write_text(state_file(opts.storage, opts.name), text)


def restored_options(opts: SweepOptions) -> SweepOptions:
    """``opts`` of a sweep being resumed, with its ``RESTORED`` options as it started (what
    Tune's restore runs, and what the console then says: a grown sweep's last growth's)."""
    was = running_options(saved_state(opts) or {})
    return dataclasses.replace(opts, **{k: was[k] for k in RESTORED if k in was})


WORKERS = ("num_workers", "cpus_per_worker")  # a resume runs on its last run's, unless typed
LAST_WORKERS = "workers"  # sweep.json: the WORKERS its latest run (start or resume) used


def resumed_workers(opts: SweepOptions, typed: frozenset[str]) -> SweepOptions:
    """``opts`` of a sweep being resumed or grown, with the ``WORKERS`` its latest run used
    (``typed``: the ones the user gave, kept as given): a bare re-run goes on with the workers it
    ran on, not with the space's ``run`` section or the flags' defaults."""
    last = latest_workers(saved_state(opts) or {})
    return dataclasses.replace(
        opts, **{k: last[k] for k in WORKERS if k in last and k not in typed}
    )


def latest_workers(saved: dict[str, Any]) -> dict[str, Any]:
    """The options a sweep's latest run gave its workers (``saved``: its ``sweep.json``): its
    last resume's (``LAST_WORKERS``) over its start's."""
    return {**saved.get("options", {}), **(saved.get(LAST_WORKERS) or {})}


def record_workers(opts: SweepOptions) -> None:
    """Record in ``sweep.json`` the ``WORKERS`` (and the device) this run of the sweep uses (a
    resume's: what the next bare re-run resumes with, and ``worker_change`` compares with)."""
    saved = saved_state(opts) or {}
    saved[LAST_WORKERS] = {k: getattr(opts, k) for k in (*WORKERS, "use_gpu")}
    write_state(opts, saved)


def mark_finished(
    opts: SweepOptions, trials: int, errored: int = 0, edges: list[dict[str, Any]] | None = None
) -> None:
    """Record in ``sweep.json`` that the sweep ran to its end: a re-run of its name is then
    refused (``check_resume``), but for ``--resume`` of one with ``errored`` trials, which
    retries them; and the edges its search flagged (what ``--widen`` widens)."""
    saved = saved_state(opts) or {}
    failed = f", {errored} errored (--resume retries them)" if errored else ""
    saved["finished"] = f"{trials} trials{failed}, {time.strftime('%Y-%m-%d %H:%M %Z')}"
    saved["errored"] = errored
    saved[EDGES] = list(edges or [])
    write_state(opts, saved)


def archive(opts: SweepOptions) -> str:
    """``--restart``: the sweep's folder moved aside to ``<name>.archived-<time>`` (a local
    folder renamed; an object store's objects copied there, then removed), so that the name
    starts over; returns where it went ('' if there was nothing)."""
    path = sweep_dir(opts)
    if not storage.exists(path):
        return ""
    to = f"{path.rstrip('/')}.archived-{time.strftime('%Y%m%d-%H%M%S')}"
    if not is_uri(path):
        os.rename(path, to)
        return to
    import pyarrow.fs

    fs, src = storage.filesystem(path)
    dst = storage.filesystem(to)[1]
    try:  # (an object store moves no folders: its objects are copied, then removed)
        pyarrow.fs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(src)
    except OSError as e:
        raise ConfigError(f"--restart: could not move {path} to {to}: {e}") from None
    return to


def worker_change(opts: SweepOptions) -> str:
    """On a resume, a notice if the trials now get another number of workers (or device) than the
    sweep's latest run gave them (its start's, or its last resume's): their checkpoints are
    resharded ('' if nothing changed)."""
    saved = saved_state(opts) or {}
    last = latest_workers(saved)
    was = (last.get("num_workers"), bool(last.get("use_gpu")))
    if was == (opts.num_workers, opts.use_gpu):
        return ""
    kind = {False: "CPU", True: "GPU"}
    ran = "last ran" if saved.get(LAST_WORKERS) else "started"
    return (
        f"note: sweep {opts.name!r} {ran} with {was[0]} {kind[was[1]]} workers per trial, it "
        f"resumes with {opts.num_workers} {kind[opts.use_gpu]}: each unfinished trial's checkpoint "
        "is resharded (tables and optimizer state exactly; data position by epoch fraction; the "
        "global batch changes), and its MLflow run is tagged recsys.resume_note"
    )


def save_state(space: SearchSpace, opts: SweepOptions) -> None:
    state = {
        "fingerprint": _fingerprint(space),
        "space_source": space.source,
        "options": asdict(opts),
    }
    write_state(opts, state)
