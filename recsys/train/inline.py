"""A run of one CPU worker trained in the calling process (a Tune trial's), without Ray Train.

A run of one worker on CPU has one rank: no worker group to place and no peers to meet. Ray
Train would still start its controller and a worker actor for it and give the worker its train
context (about 8.5 s a run on 2 cores, BENCHMARKS.md's overhead rows), where the training itself
of a small reference takes 1-3 s. ``train`` runs the same ``Trainer`` here instead, over a process
group of one rank (gloo, an in-memory store), with the threads the worker would have.

Its checkpoints persist as Ray Train's would, in the same place: each is the folder
``<run>/step_<step>`` that a Ray Train worker writes in place (``recsys.train.worker.
RayReporter``), with its report in ``metrics.json`` beside the data (Ray Train's workers write
it there too). So a run started again resumes from the newest checkpoint with its report,
whichever way it ran before (Ray Train resumes from this one's too: ``RayReporter.
checkpoints``); the best ``KEEP`` by score and the latest are kept, as Ray Train keeps them; and
``persisted`` reads the folder as the ``ray.train.Result`` that Ray Train's persisted run gives
(``recsys.train.results.train_result`` takes whichever of the two is newer). Each report goes to
the caller's ``send`` (a sweep's trial: to Tune, ``recsys.tune.trial``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from recsys.config import ExperimentConfig
from recsys.runtime import storage
from recsys.train.reporting import INLINE, RUN_KIND, LocalReporter, reported, write_report

Send = Callable[[dict[str, Any], str], None]  # (a report, its checkpoint's folder or "")

KEEP = 2  # checkpoints kept by score (and always the latest): make_trainer's keep_checkpoints


def fits(num_workers: int, use_gpu: bool, storage_path: str) -> bool:
    """Whether a run of ``num_workers`` (GPUs or not) stored under ``storage_path`` can train
    here: one CPU worker, on a file system."""
    return num_workers == 1 and not use_gpu and not storage.is_uri(storage_path)


class InlineReporter(LocalReporter):
    """The one rank of a run trained here: checkpoints in its folder ``root``, resumed from the
    newest with its report (``reported``), each report (with the node it ran on, as
    ``RayReporter`` adds, and ``RUN_KIND``: ``INLINE``) written beside its checkpoint and sent to
    ``send``, the checkpoints beyond the best ``keep`` by ``ckpt_score`` (``mode``) and the
    latest removed."""

    def __init__(self, root: str, send: Send, mode: str, keep: int = KEEP) -> None:
        super().__init__(root, 0)
        self.send, self.mode, self.keep = send, mode, keep
        self.seed: int | None = None  # the run's train.seed (the tests' holds)

    def checkpoints(self) -> list[Any]:
        return [folder for folder, _ in reported(self.root)][::-1]

    def checkpoint_dir(self, step: int) -> str:
        folder = super().checkpoint_dir(step)
        shutil.rmtree(folder, ignore_errors=True)  # one saved before but never reported
        os.makedirs(folder)
        return folder

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        from recsys.train.worker import hold

        metrics = {**metrics, "worker_nodes": node_id(), RUN_KIND: INLINE}
        if folder:
            write_report(folder, metrics)
            self.prune()
        self.reports.append(metrics)
        self.send(metrics, folder)
        if folder and self.seed is not None:
            hold(self.seed, step)

    def prune(self) -> None:
        """Remove the reported checkpoints that are neither the latest nor among the best
        ``keep`` by score (as Ray Train's ``CheckpointConfig(num_to_keep)``)."""
        kept = reported(self.root)
        if len(kept) <= self.keep:
            return
        ranked = sorted(kept[:-1], key=lambda fm: score(fm[1], self.mode), reverse=True)
        for folder, _ in ranked[self.keep :]:
            shutil.rmtree(folder, ignore_errors=True)


def score(report: dict[str, Any], mode: str) -> float:
    """A report's ``ckpt_score``, the higher the better (negated for ``mode`` min); one without
    it ranks last either way."""
    if "ckpt_score" not in report:
        return float("-inf")
    value = float(report["ckpt_score"])
    return value if mode == "max" else -value


def node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def persisted(root: str) -> Any:
    """The ``ray.train.Result`` of the run at ``root`` from its checkpoints' reports, as Ray
    Train's persisted run reads (its latest checkpoint and that report; its kept checkpoints with
    theirs); raises ``RuntimeError`` where it has no checkpoint with its report, as ``from_path``
    does."""
    import ray.train

    kept = reported(root)
    if not kept:
        raise RuntimeError(f"{root}: no checkpoint with its report")
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
    cfg: ExperimentConfig,
    root: str,
    send: Send,
    cpus: float,
    system_metrics: Any = None,
    node_workers: int = 0,
) -> Any:
    """Train ``cfg`` on one CPU rank in this process with ``cpus`` threads (a Ray Train worker's
    ``cpus_per_worker``), checkpoints under ``root`` (resumed from the newest there with its
    report), each report to ``send``; the run's ``ray.train.Result`` (its metrics: the last
    report). ``system_metrics``: as ``recsys.train.system_metrics.node_monitor`` takes them;
    ``node_workers``: as ``WorkerEnv`` has it (the planner's share of the host's memory)."""
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
            env = current(False, node_workers)
            cfg = localised(cfg, 0, 1)
            reporter = InlineReporter(root, send, cfg.train.monitor_mode)
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
