"""A one-worker CPU trial trained in its own Tune trial, without Ray Train.

A trial of one worker on CPU has one rank: no worker group to place and no peers to meet. Ray
Train would still start its controller and a worker actor for it and give the worker its train
context (about 8.5 s of every trial on 2 cores, BENCHMARKS.md's overhead rows), where the
training itself of a small reference takes 1-3 s. Such a trial (``inline``) trains in the Tune
trial's own process, which reserves the worker's CPUs beside its own, over a process group of
one rank (gloo, an in-memory store), with the same ``Trainer``.

Its checkpoints and reports persist as Ray Train's would in the same place: each checkpoint is
the folder ``<train storage>/trial_<id>/step_<step>`` that a Ray Train worker writes in place
(``recsys.train.worker.RayReporter``), with its report in ``metrics.json`` beside the data. So a
restored trial resumes from the newest complete one, whichever path wrote it (a sweep resumed on
other workers); the best ``KEEP`` by the trial's score and the latest are kept, as Ray Train
keeps them; and ``persisted`` gives the driver the ``ray.train.Result`` that Ray Train's own
persisted run gives (``recsys.tune.trial.train_result``). Each report reaches Tune as
``ReportToTune`` sends a Ray Train worker's (``recsys.tracking.tune_reports``).

Where the sweep's storage is an object store, or a trial has GPUs or several workers, it runs on
Ray Train as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

from recsys.config import ExperimentConfig
from recsys.runtime import storage
from recsys.train.reporting import LocalReporter

KEEP = 2  # checkpoints kept by score (and always the latest): make_trainer's keep_checkpoints
METRICS = "metrics.json"  # a checkpoint's report, beside its data


def inline(num_workers: int, use_gpu: bool, train_storage: str) -> bool:
    """Whether a trial of ``num_workers`` (GPUs or not) whose Train runs live under
    ``train_storage`` trains in its Tune trial: one CPU worker, on a file system."""
    return num_workers == 1 and not use_gpu and not storage.is_uri(train_storage)


def step_of(folder: str) -> int:
    """The step of a checkpoint folder ``step_<step>[_after_...]``."""
    return int(os.path.basename(folder)[5:13])


def completed(root: str) -> list[str]:
    """The complete checkpoint folders of a run at ``root`` (DCP writes ``.metadata`` last),
    oldest first."""
    return LocalReporter(root, 0).completed()


class TuneReporter(LocalReporter):
    """The one rank of an inline trial: checkpoints in its Train run's folder ``root``, reports
    to Tune with the keys ``ReportToTune`` adds (its MLflow run ``run_id``), the checkpoints
    beyond the best ``keep`` by ``ckpt_score`` (``mode``) and the latest removed."""

    def __init__(self, root: str, run_id: str, mode: str, keep: int = KEEP) -> None:
        super().__init__(root, 0)
        self.run_id, self.mode, self.keep = run_id, mode, keep
        self.seed: int | None = None  # the run's train.seed (the tests' holds)

    def checkpoint_dir(self, step: int) -> str:
        folder = super().checkpoint_dir(step)
        os.makedirs(folder, exist_ok=True)
        return folder

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        from ray import tune
        from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

        from recsys.tracking.tune_reports import CHECKPOINT_URI, REPORT_KEYS, RUN_ID
        from recsys.train.worker import hold

        metrics = {**metrics, "worker_nodes": node_id()}
        extra = {RUN_ID: self.run_id, REPORT_KEYS: ",".join(metrics)}
        if folder:
            with open(os.path.join(folder, METRICS), "w") as f:
                json.dump(metrics, f)
            self.prune()
            extra[CHECKPOINT_URI] = folder
            extra[CHECKPOINT_PATH_KEY] = folder  # (as Ray's ``TuneReportCallback`` adds it)
        self.reports.append(metrics)
        tune.report({**metrics, **extra})
        if folder and self.seed is not None:
            hold(self.seed, step)

    def prune(self) -> None:
        """Remove the complete checkpoints that are neither the latest nor among the best
        ``keep`` by score (as Ray Train's ``CheckpointConfig(num_to_keep)``)."""
        folders = completed(self.root)
        if len(folders) <= self.keep:
            return
        ranked = sorted(folders[:-1], key=lambda f: score(f, self.mode), reverse=True)
        for folder in ranked[self.keep :]:
            shutil.rmtree(folder, ignore_errors=True)


def score(folder: str, mode: str) -> float:
    """A checkpoint's ``ckpt_score``, the higher the better (negated for ``mode`` min)."""
    value = float(read_metrics(folder).get("ckpt_score", float("-inf")))
    return value if mode == "max" else -value


def read_metrics(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, METRICS)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return dict(json.load(f))


def node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def persisted(root: str) -> Any:
    """The ``ray.train.Result`` of an inline run at ``root``, as Ray Train's persisted run reads
    (its latest checkpoint and that report; its kept checkpoints with theirs); raises
    ``RuntimeError`` where it has no complete checkpoint with a report, as ``from_path`` does."""
    import ray.train

    kept = [(f, read_metrics(f)) for f in completed(root)]
    kept = [(f, m) for f, m in kept if m]
    if not kept:
        raise RuntimeError(f"{root}: no checkpoint of a trial trained in its Tune trial")
    best = [(ray.train.Checkpoint.from_directory(f), m) for f, m in kept]
    return ray.train.Result(
        metrics=best[-1][1], checkpoint=best[-1][0], error=None, path=root,
        best_checkpoints=best,
    )  # fmt: skip


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone while the block runs."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def train(
    cfg: ExperimentConfig, root: str, run_id: str, cpus: float, system_metrics: Any = None
) -> Any:
    """Train ``cfg`` on one CPU rank in this process with ``cpus`` threads (a Ray Train worker's
    ``cpus_per_worker``), checkpoints under ``root`` (resumed from the newest complete one
    there), reports to Tune; the run's ``ray.train.Result`` (its metrics: the last report)."""
    import torch

    from recsys.data.prepared.remote import localised
    from recsys.distributed.env import current
    from recsys.train.system_metrics import node_monitor
    from recsys.train.worker import hold, quiet_libraries

    quiet_libraries()
    from recsys.train.trainer import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cpus)))
    try:
        with one_rank_group():
            env = current(False)
            cfg = localised(cfg, 0, 1)
            reporter = TuneReporter(root, run_id, cfg.train.monitor_mode)
            reporter.seed = cfg.train.seed
            trainer = Trainer(cfg, env, reporter)
            with node_monitor(system_metrics, env):
                trainer.train()
    finally:
        torch.set_num_threads(threads)
    hold(cfg.train.seed)
    return result(root, reporter.reports[-1] if reporter.reports else None)


def result(root: str, last: dict[str, Any] | None) -> Any:
    """``persisted(root)`` with the metrics of the last report ``last`` (a run that never
    checkpointed: those alone)."""
    import ray.train

    try:
        found = persisted(root)
    except RuntimeError:
        return ray.train.Result(metrics=last, checkpoint=None, error=None, path=root)
    found.metrics = last or found.metrics
    return found
