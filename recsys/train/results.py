"""A training run's persisted result, whichever way it ran: Ray Train's (its run snapshot) or a run
trained inline (``recsys.train.inline``: its checkpoint folders and their reports)."""

from __future__ import annotations

import logging
from typing import Any

from ray.train import Result as TrainResult

from recsys.runtime import storage
from recsys.train import inline

# Ray Train's checkpoint manager, which announces at INFO each run snapshot it reads, with advice
# for starting a new training job (``RunConfig(name)``): not the case of reading a finished run
RAY_SNAPSHOT_LOGGER = "ray.train.v2._internal.execution.checkpoint.checkpoint_manager"


def train_result(train_run: str) -> Any:
    """The persisted result of a training run (its reports and checkpoints), from its folder or
    object store URI: Ray Train's, or, on a file system, the one its checkpoints' reports make
    (``inline.persisted``: a run trained inline), whichever reaches the later step (a trial
    resumed on other workers ran both ways); ``RuntimeError`` where there is neither. Ray's INFO
    note that it found the run's snapshot is left out (each trial that ASHA stops is read so,
    and the note would print once per trial), its warnings are not."""
    path, fs = storage.ray_storage(train_run)
    found = [r for r in (ray_train_result(path, fs), None if fs else inline_result(path)) if r]
    if not found:
        raise RuntimeError(f"{train_run}: no checkpoint of a training run")
    return max(found, key=step_of)  # (a tie: Ray Train's, the first)


def last_checkpoint(result: Any, run: str) -> tuple[str, dict[str, Any]]:
    """A training's last checkpoint (a folder or an object store URI) and its report, once its
    ``fit()`` returned ``result``: that result's, or, where it names none, the newest checkpoint
    with its report in the run's folder ``run`` (``train_result``). A run killed after its workers
    wrote their last checkpoint in place and before Ray Train recorded it resumes from that
    checkpoint (``recsys.train.worker.RayReporter.checkpoints``) with nothing left to train: its
    report has no checkpoint, nor has Ray Train's result. The report is the checkpoint's over the
    result's (a run with nothing left reports no test score). ``RuntimeError`` where the run has
    no checkpoint either way."""
    metrics = dict(result.metrics or {})
    found = result if result.checkpoint is not None else train_result(run)
    if found.checkpoint is None:
        raise RuntimeError(f"{run}: no checkpoint of a training run")
    if found is not result:
        metrics = {**metrics, **dict(found.metrics or {})}
    return storage.as_uri(found.checkpoint.filesystem, found.checkpoint.path), metrics


def step_of(result: Any) -> float:
    """The step of a result's latest report (0: none)."""
    return float((getattr(result, "metrics", None) or {}).get("step", 0))


def ray_train_result(path: str, fs: Any) -> Any:
    """Ray Train's persisted run at ``path`` (in ``fs``), or None."""
    log = logging.getLogger(RAY_SNAPSHOT_LOGGER)
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        return TrainResult.from_path(path) if fs is None else TrainResult.from_path(path, fs)
    except RuntimeError:
        return None
    finally:
        log.setLevel(level)


def inline_result(path: str) -> Any:
    try:
        return inline.persisted(path)
    except RuntimeError:
        return None


def sharding_plan(checkpoint: Any) -> str | None:
    """A checkpoint's ``sharding_plan.json``, read through its own file system (the run's:
    an object store's is retried while it is down); None if it has none."""
    import pyarrow.fs

    fs, path = checkpoint.filesystem, f"{checkpoint.path}/sharding_plan.json"
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path, compression=None) as f:
        return bytes(f.read()).decode()
