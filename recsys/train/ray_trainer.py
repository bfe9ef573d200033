"""Build the ``TorchTrainer`` of one configuration (Ray Train V2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from recsys.config import ExperimentConfig
from recsys.configlib import check
from recsys.distributed.env import backend_for
from recsys.runtime.cluster import alive_nodes, node_slots, placement_strategy
from recsys.runtime.storage import ray_storage
from recsys.train.nodes import NodeWatch
from recsys.train.worker import train_func


@dataclass(frozen=True)
class Resources:
    """What one training run asks of the cluster.

    Attributes:
        num_workers: Ray Train workers (ranks).
        use_gpu: one GPU per worker, NCCL; else CPU and gloo.
        cpus_per_worker: CPUs reserved per worker.
    """

    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    node_workers: int = 0  # workers of all trials that may share a node (``WorkerEnv``); 0: own

    def __post_init__(self) -> None:
        check(self.num_workers >= 1, "num_workers", self.num_workers, "must be >= 1")
        check(self.cpus_per_worker > 0, "cpus_per_worker", self.cpus_per_worker, "must be > 0")


def make_trainer(
    cfg: ExperimentConfig,
    resources: Resources,
    *,
    name: str,
    storage_path: str,
    max_failures: int = 0,
    keep_checkpoints: int | None = 2,
    train_loop: Callable[[dict[str, Any]], None] = train_func,
    callbacks: list[Any] | None = None,
    system_metrics: dict[str, Any] | None = None,
) -> TorchTrainer:
    """A trainer for ``cfg``; re-running one with the same ``name`` and ``storage_path`` resumes
    from its latest checkpoint. Keeps the best ``keep_checkpoints`` by ``train.monitor`` (and
    always the latest; ``None`` keeps all). A lost node is named and its workers restart from
    the last checkpoint (up to ``max_failures`` times); after a lost node, workers that no node
    can place are waited for up to ``RECSYS_NODE_WAIT_S`` (``recsys.train.nodes``). Its workers
    are placed on one node when one can hold them all, else over whole nodes
    (``recsys.runtime.cluster.placement_strategy``; needs Ray running). ``system_metrics``: where
    each host's first worker logs its system metrics (``recsys.train.system_metrics``)."""
    per_worker = {"CPU": resources.cpus_per_worker}
    if resources.use_gpu:
        per_worker["GPU"] = 1
    slots = node_slots(alive_nodes(), resources.cpus_per_worker, per_worker.get("GPU", 0))
    path, fs = ray_storage(storage_path)  # an object store: retried while it is down
    return TorchTrainer(
        train_loop,
        train_loop_config={
            "experiment": cfg.to_dict(),
            "use_gpu": resources.use_gpu,
            "node_workers": resources.node_workers,
            "system_metrics": system_metrics,
        },
        torch_config=TorchConfig(backend=backend_for(resources.use_gpu)),
        scaling_config=ScalingConfig(
            num_workers=resources.num_workers,
            use_gpu=resources.use_gpu,
            resources_per_worker=per_worker,
            placement_strategy=placement_strategy(resources.num_workers, slots),
        ),
        # ray.train.RunConfig is Train V2's at run time (mypy sees the V1 class it replaces)
        run_config=RunConfig(  # type: ignore[call-arg]
            name=name,
            storage_path=path,
            storage_filesystem=fs,
            # a lost node named, a line per placement attempt that found no room, and a run
            # that lost a node fails after RECSYS_NODE_WAIT_S without room (recsys.train.nodes)
            callbacks=[*(callbacks or []), NodeWatch(name)],  # type: ignore[list-item]
            failure_config=FailureConfig(max_failures=max_failures),
            logging_config=LoggingConfig(log_level="WARNING"),
            checkpoint_config=CheckpointConfig(
                num_to_keep=keep_checkpoints,
                checkpoint_score_attribute="ckpt_score",  # train.monitor's value, WORST if none
                checkpoint_score_order=cfg.train.monitor_mode,
            ),
        ),
    )
