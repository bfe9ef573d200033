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
import warnings
from collections.abc import Iterator
from typing import Any

import ray.train
import ray.train.torch

from recsys.config import ExperimentConfig
from recsys.distributed import collectives
from recsys.distributed.env import check_placement, current


class RayReporter:
    """Checkpoints go to a local temp folder per rank; ``ray.train.report`` merges the ranks'
    folders into one checkpoint directory on the run's storage, then the temp folder is removed.

    Reports also say which Ray nodes the worker group runs on (``worker_nodes``)."""

    def __init__(self, worker_nodes: str = "") -> None:
        self.worker_nodes = worker_nodes
        self.suffix = ""

    def checkpoints(self) -> list[Any]:
        """Every kept checkpoint of this run, newest (highest step) first."""
        if ray.train.get_checkpoint() is None:
            return []
        reported = ray.train.get_all_reported_checkpoints()
        reported.sort(key=lambda r: r.metrics.get("step", 0), reverse=True)
        return [r.checkpoint for r in reported]

    @contextlib.contextmanager
    def open_checkpoint(self, handle: Any) -> Iterator[str]:
        with handle.as_directory() as folder:
            yield folder

    def skip_names_of(self, handle: Any) -> None:
        self.suffix = f"_after_{os.path.basename(handle.path)}"

    def checkpoint_dir(self, step: int) -> str:
        return tempfile.mkdtemp(prefix=f"recsys-step{step}-")

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        metrics = {**metrics, "worker_nodes": self.worker_nodes}
        if not folder:
            ray.train.report(metrics)
            return
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(folder),
            checkpoint_dir_name=f"step_{step:08d}{self.suffix}",
        )
        shutil.rmtree(folder, ignore_errors=True)


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


def train_func(config: dict[str, Any]) -> None:
    """Worker entry point; ``config = {"experiment": <ExperimentConfig dict>, "use_gpu": bool}``.

    TorchRec (and FBGEMM, which logs every library it loads at INFO on the root logger, which Ray
    Train sets to INFO in its workers) is imported only after ``quiet_libraries``."""
    quiet_libraries()
    from recsys.train.trainer import Trainer

    cfg = ExperimentConfig.from_dict(config["experiment"])
    use_gpu = bool(config.get("use_gpu", False))
    env = current(use_gpu)
    if use_gpu and ray.train.torch.get_device() != env.device:
        raise RuntimeError(
            f"Ray placed this worker on {ray.train.torch.get_device()} but TorchRec shards on "
            f"cuda:LOCAL_RANK = {env.device}; give every worker one GPU"
        )
    node = ray.get_runtime_context().get_node_id()
    placement = collectives.all_gather_objects((node, env.local_rank, env.local_world_size))
    check_placement(placement)  # fail fast, naming the nodes, before the planner runs
    reporter = RayReporter(",".join(sorted({n for n, _, _ in placement})))
    Trainer(cfg, env, reporter).train()
