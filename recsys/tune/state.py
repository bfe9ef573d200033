"""A sweep's options and its saved state: what resuming a sweep checks before anything launches.

``<storage>/<name>/sweep.json`` holds the space and base config the sweep started with; resuming
with another is refused, naming the file. Kept apart from the sweep driver so that these checks
run before Ray, torch and MLflow load.
"""

from __future__ import annotations

import json
import os
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


def check_resume(space: SearchSpace, opts: SweepOptions) -> bool:
    """Whether to restore: a sweep of that name exists. ``--resume`` of a missing sweep, or of one
    started with another space, is an error."""
    path = sweep_dir(opts)
    state = storage.join(path, "sweep.json")
    if not storage.exists(state):
        if opts.resume:
            raise ConfigError(f"--resume: no sweep named {opts.name!r} in {opts.storage}")
        return False
    saved = json.loads(storage.read_text(state))
    if saved["fingerprint"] != json.loads(json.dumps(_fingerprint(space), default=str)):
        raise ConfigError(
            f"sweep {opts.name!r} in {path} was started with another search space or base config "
            f"({saved['space_source']}); use a new --name, or the same space to resume"
        )
    return True


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
