"""The Ray Train side of a trial: ``train_func`` runs on every worker of a ``TorchTrainer``.

The process group comes from Ray's ``TorchConfig`` (gloo on CPU, NCCL on GPU); nothing here calls
``init_process_group``. The trial's plain dict becomes typed configs once, at the top.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow.fs
import ray.train
import ray.train.torch
from ray.train.v2.api.report_config import CheckpointUploadMode

from recsys.config import ExperimentConfig
from recsys.data.prepared.remote import localised
from recsys.distributed import collectives
from recsys.distributed.env import check_placement, current
from recsys.train.reporting import is_inline, reported, write_report
from recsys.train.system_metrics import node_monitor


class RayReporter:
    """Where the run's storage is a file system (a local or mounted path, as on one node or a
    shared disk), every rank writes its part of a checkpoint straight into the checkpoint's folder
    there and reports it without an upload (``CheckpointUploadMode.NO_UPLOAD``): each byte is
    written once and nothing is staged. Elsewhere (an object store URI) each rank writes to a
    local staging folder (``train.checkpoint_staging``, default the system's temp folder; its free
    space is checked first), which ``ray.train.report`` uploads and merges (through the run's
    ``storage_filesystem``, which retries while the store is down: ``recsys.runtime.storage``),
    then it is removed.

    Reports also say which Ray nodes the worker group runs on (``worker_nodes``)."""

    def __init__(
        self,
        worker_nodes: str = "",
        staging: str = "",
        need_bytes: int = 0,
    ) -> None:
        self.worker_nodes = worker_nodes
        self.suffix = ""
        self.staging, self.need_bytes = staging or tempfile.gettempdir(), need_bytes
        self.seed: int | None = None  # the run's train.seed (the tests' holds: ``hold``)
        storage = ray.train.get_context().get_storage()
        self.direct = isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem)
        self.storage = storage

    def checkpoints(self) -> list[Any]:
        """Every kept checkpoint of this run, newest (highest step) first. On a file system,
        those a run trained without Ray Train wrote in its folder too (``recsys.train.inline``:
        one worker, a sweep or a run resumed on more), which may have gone on past Ray Train's
        last and removed some of Ray Train's kept ones; a run with none of its own on disk takes
        every checkpoint there with its report. Where it has some, not one that its own workers
        wrote but never registered (its report never reached Ray Train's record). Every rank
        takes rank 0's list (a shared disk's listing may lag on another host)."""
        kept = []
        if ray.train.get_checkpoint() is not None:
            kept = [(r.metrics.get("step", 0), r.checkpoint)
                    for r in ray.train.get_all_reported_checkpoints()]  # fmt: skip
        if self.direct:
            kept = [(s, c) for s, c in kept if os.path.isdir(c.path)]
            kept += [(s, c) for s, c, m in self.written() if not kept or is_inline(m)]
        newest: dict[str, tuple[int, Any]] = {}
        for step, checkpoint in kept:
            newest.setdefault(os.path.realpath(checkpoint.path), (int(step), checkpoint))
        order = [c for _, (_, c) in sorted(newest.items(), key=by_age, reverse=True)]
        if not self.direct or ray.train.get_context().get_world_size() == 1:
            return order
        paths = collectives.all_gather_objects([c.path for c in order])[0]
        return [ray.train.Checkpoint.from_directory(p) for p in paths]

    def written(self) -> list[tuple[int, Any, dict[str, Any]]]:
        """The checkpoints with their reports in this run's folder: step, checkpoint, report."""
        run = self.storage.experiment_fs_path  # (where ``checkpoint_dir`` writes in place)
        return [(int(m.get("step", 0)), ray.train.Checkpoint.from_directory(f), m)
                for f, m in reported(run)]  # fmt: skip

    @contextlib.contextmanager
    def open_checkpoint(self, handle: Any) -> Iterator[str]:
        with handle.as_directory() as folder:
            yield folder

    def skip_names_of(self, handle: Any) -> None:
        self.suffix = f"_after_{os.path.basename(handle.path)}"

    def _name(self, step: int) -> str:
        return f"step_{step:08d}{self.suffix}"

    def checkpoint_dir(self, step: int) -> str:
        if self.direct:
            path = str(self.storage.build_checkpoint_path_from_name(self._name(step)))
            os.makedirs(path, exist_ok=True)
            return path
        check_space(self.staging, self.need_bytes)
        return tempfile.mkdtemp(prefix=f"recsys-step{step}-", dir=self.staging)

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        metrics = {**metrics, "worker_nodes": self.worker_nodes}
        if not folder:
            ray.train.report(metrics)
            return
        # rank 0's report beside the checkpoint (as an inline run's: its records read either way,
        # ``recsys.train.inline``; on an object store, uploaded with it)
        if ray.train.get_context().get_world_rank() == 0:
            write_report(folder, metrics)
        if self.direct:
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(folder),
                checkpoint_dir_name=self._name(step),
                checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
            )
        else:
            checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=self._name(step))
            shutil.rmtree(folder, ignore_errors=True)
        if self.seed is not None:
            hold(self.seed, step)


def by_age(entry: tuple[str, tuple[int, Any]]) -> tuple[int, int]:
    """A checkpoint's age (a path and its step, checkpoint): its step, then its name's length
    (a folder written after a skipped one of its step is named after it)."""
    path, (step, _) = entry
    return step, len(os.path.basename(path))


def check_space(folder: str, need: int) -> None:
    """Refuse to stage a checkpoint of about ``need`` bytes in ``folder`` without the room."""
    from recsys.distributed.checkpoint import CheckpointError

    os.makedirs(folder, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise CheckpointError(
            f"train.checkpoint_staging={folder}: {free / 2**30:.2f} GiB free, a checkpoint of this "
            f"rank needs about {need / 2**30:.2f} GiB (tables, optimizer state, dense layers); "
            "point train.checkpoint_staging at a larger local disk"
        )


def quiet_libraries() -> None:
    """Keep worker logs to our progress lines and real warnings: TorchRec, FBGEMM and Ray Train
    log every table and report at INFO, and TorchRec raises deprecation notices on every build.
    (Ray Train's own ``ray.train`` console logs are set by ``LoggingConfig`` in the trainer;
    its per-report log line uses a logger named after its file, below the root's WARNING.)"""
    logging.getLogger().setLevel(logging.WARNING)  # FBGEMM logs each table at INFO on the root
    for name in ["torchrec", "fbgemm_gpu", "torch.fx._symbolic_trace"]:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    # FBGEMM's dense (data-parallel) lookup op warns that no autograd kernel is registered; its
    # tables still train and equal the unsharded model on CPU (7e-7 apart after 5 steps, checked
    # on 2 gloo ranks), so the warning says nothing to the user.
    warnings.filterwarnings("ignore", message=".*dense_embedding_codegen_lookup_function.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    # torchrec 1.6.1 (the torch 2.11 pair) asks torch for a process group's default device,
    # which torch 2.11 has deprecated: a notice per build, nothing for the user to do
    warnings.filterwarnings("ignore", message=".*_get_pg_default_device.*")
    warnings.filterwarnings("ignore", message="Multiple backends are registered with this")


def train_func(config: dict[str, Any]) -> None:
    """Worker entry point; ``config = {"experiment": <ExperimentConfig dict>, "use_gpu": bool,
    "node_workers": int, "system_metrics": dict | None}`` (``node_workers``: as ``WorkerEnv``
    has it; absent: 0; ``system_metrics``: ``recsys.train.system_metrics``).

    TorchRec (and FBGEMM, which logs every library it loads at INFO on the root logger, which Ray
    Train sets to INFO in its workers) is imported only after ``quiet_libraries``. A budget in
    epochs (``train.epochs``) is made steps by the ``Trainer`` (``recsys.data.dataset.
    with_budget``): it is the one place that knows this worker group's size, the training
    split's rows and, on a resume, the steps and samples the checkpoint had done."""
    quiet_libraries()
    from recsys.train.trainer import Trainer

    cfg = ExperimentConfig.from_dict(config["experiment"])
    use_gpu = bool(config.get("use_gpu", False))
    env = current(use_gpu, int(config.get("node_workers", 0)))
    if use_gpu and ray.train.torch.get_device() != env.device:
        raise RuntimeError(
            f"Ray placed this worker on {ray.train.torch.get_device()} but TorchRec shards on "
            f"cuda:LOCAL_RANK = {env.device}; give every worker one GPU (nodes with GPUs "
            "numbered 10 and up are not supported: docs/cluster.md)"
        )
    # a host is an IP, as Ray Train counts LOCAL_RANK and LOCAL_WORLD_SIZE (two raylets on one
    # machine are one host to it, and to TorchRec's planner)
    host, node = ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()
    placement = collectives.all_gather_objects((host, env.local_rank, env.local_world_size, node))
    check_placement([p[:3] for p in placement])  # fail fast, naming the hosts, before planning
    nodes = ",".join(sorted({p[3] for p in placement}))
    cfg = localised(cfg, env.rank, env.world_size)  # a prepared folder in an object store
    reporter = RayReporter(nodes, cfg.train.checkpoint_staging)
    reporter.seed = cfg.train.seed
    trainer = Trainer(cfg, env, reporter)
    reporter.need_bytes = trainer.checkpoint_bytes()
    with node_monitor(config.get("system_metrics"), env):
        trainer.train()
    hold(cfg.train.seed)


HOLD_ENV = "RECSYS_TEST_HOLD_AFTER_TRAINING_S"
HOLD_SEED_ENV = "RECSYS_TEST_HOLD_SEED"
HOLD_STEP_ENV = "RECSYS_TEST_HOLD_AT_STEP"


def hold(seed: int, step: int | None = None) -> None:
    """For the tests only: with ``RECSYS_TEST_HOLD_AFTER_TRAINING_S`` set, a worker waits that
    long after its last report (``step`` None), or, with ``RECSYS_TEST_HOLD_AT_STEP`` set, after
    its checkpoint's report of that step instead; only in runs of ``train.seed`` =
    ``RECSYS_TEST_HOLD_SEED``, when that is set. So a test can kill a sweep exactly after a
    trial's last checkpoint and before Tune records the trial as done, or while a trial is
    mid-run, whatever the machine's speed (``tests/ray/killing.py``)."""
    seconds = float(os.environ.get(HOLD_ENV, "0") or 0)
    only, at = os.environ.get(HOLD_SEED_ENV, ""), os.environ.get(HOLD_STEP_ENV, "")
    if seconds <= 0 or (only and int(only) != seed):
        return
    if (step is None and not at) or (step is not None and at and int(at) == step):
        time.sleep(seconds)
