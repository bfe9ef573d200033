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

from recsys import storage
from recsys.configlib import ConfigError
from recsys.storage import is_uri
from recsys.tune.space import SearchSpace


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
    device_memory_gb: float | None = None  # one worker's device; None: measured at launch
    wait_for_nodes: float = 0.0  # seconds to wait for nodes that can hold a trial (autoscaling)


def default_tracking_uri(root: str) -> str:
    """A local SQLite store in the project folder (MLflow 3 refuses the plain file store)."""
    return f"sqlite:///{os.path.join(root, 'mlflow.db')}"


def sweep_dir(opts: SweepOptions) -> str:
    """The sweep's folder or object store prefix (``recsys.storage``)."""
    return storage.join(opts.storage, opts.name)


def unlogged_dir(where: str, sweep: str) -> str | None:
    """Where a sweep keeps the artifacts MLflow could not store: a folder of its own, where its
    storage is a file system (None for an object store URI: the warning then names the artifact)."""
    return None if is_uri(where) else os.path.join(where, sweep, "unlogged_artifacts")


def _fingerprint(space: SearchSpace) -> dict[str, Any]:
    return {"space": space.raw, "base": space.base.to_dict()}


# the options a resumed sweep keeps from its start, whatever is typed (Tune's restore brings back
# its searcher, scheduler, sample count and concurrency): with their flags
RESTORED = {
    "num_samples": "--num-samples",
    "max_concurrent": "--max-concurrent",
    "scheduler": "--scheduler",
    "search": "--search",
    "seed": "--seed",
}
NEW_SWEEP = "use a new --name, or --restart to archive this sweep and start it over"


def saved_state(opts: SweepOptions) -> dict[str, Any] | None:
    """The sweep's ``sweep.json`` (None if there is none)."""
    state = storage.join(sweep_dir(opts), "sweep.json")
    return json.loads(storage.read_text(state)) if storage.exists(state) else None


def check_resume(
    space: SearchSpace, opts: SweepOptions, typed: frozenset[str] = frozenset()
) -> bool:
    """Whether to restore: an unfinished sweep of that name exists. Refused, before anything
    launches: ``--resume`` of a missing sweep; a re-run of a finished one (its results stand;
    ``--resume`` of one with errored trials retries them);
    another space or base config; a typed option of ``RESTORED`` (``typed``: the
    ``SweepOptions`` fields the user gave) that differs from the saved one, each named with
    its saved and given value."""
    path = sweep_dir(opts)
    saved = saved_state(opts)
    if saved is None:
        if opts.resume:
            raise ConfigError(f"--resume: no sweep named {opts.name!r} in {opts.storage}")
        return False
    if saved.get("finished") and not (opts.resume and saved.get("errored")):
        raise ConfigError(
            f"sweep {opts.name!r} in {path} has finished ({saved['finished']}): its results "
            f"stand (recsys-export --sweep {opts.name} exports its best); {NEW_SWEEP}"
        )
    if saved["fingerprint"] != json.loads(json.dumps(_fingerprint(space), default=str)):
        raise ConfigError(
            f"sweep {opts.name!r} in {path} was started with another search space or base config "
            f"({saved['space_source']}); {NEW_SWEEP}, or the same space to resume"
        )
    was = saved.get("options", {})
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
    return True


def restored_options(opts: SweepOptions) -> SweepOptions:
    """``opts`` of a sweep being resumed, with its ``RESTORED`` options as it started (what
    Tune's restore runs, and what the console then says)."""
    was = (saved_state(opts) or {}).get("options", {})
    return dataclasses.replace(opts, **{k: was[k] for k in RESTORED if k in was})


def mark_finished(opts: SweepOptions, trials: int, errored: int = 0) -> None:
    """Record in ``sweep.json`` that the sweep ran to its end: a re-run of its name is then
    refused (``check_resume``), but for ``--resume`` of one with ``errored`` trials, which
    retries them."""
    saved = saved_state(opts) or {}
    failed = f", {errored} errored (--resume retries them)" if errored else ""
    saved["finished"] = f"{trials} trials{failed}, {time.strftime('%Y-%m-%d %H:%M %Z')}"
    saved["errored"] = errored
    storage.write_text(storage.join(sweep_dir(opts), "sweep.json"), json.dumps(saved, indent=2))


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
    sweep started with: their checkpoints are resharded ('' if nothing changed)."""
    started = json.loads(storage.read_text(storage.join(sweep_dir(opts), "sweep.json")))
    started = started.get("options", {})
    was = (started.get("num_workers"), bool(started.get("use_gpu")))
    if was == (opts.num_workers, opts.use_gpu):
        return ""
    kind = {False: "CPU", True: "GPU"}
    return (
        f"note: sweep {opts.name!r} started with {was[0]} {kind[was[1]]} workers per trial, it "
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
    text = json.dumps(state, indent=2, default=str)
    storage.write_text(storage.join(sweep_dir(opts), "sweep.json"), text)
