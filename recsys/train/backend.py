"""The process group of a run's workers, set up by Ray Train from a module that imports no torch.

Ray Train's controller unpickles the run's backend config at its start. Ray's own ``TorchConfig``
lives in ``ray.train.torch.config``, which imports torch: every trial's controller imported torch
(about 1.3 s of CPU, measured on 2 cores) before it could start the worker group, on the path of
every trial's start, only to read two fields. ``ProcessGroupConfig`` is the same configuration in
a module that imports only Ray; its backend (run by the controller) makes the group with Ray's own
functions, imported on the workers, which have torch loaded by then:

- rank 0's address and a free port as the group's master (``MASTER_ADDR``, ``MASTER_PORT``);
- ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``RANK``, ``WORLD_SIZE`` as torchrun sets
  them (``recsys.distributed.env.current`` reads them);
- ``torch.distributed.init_process_group`` on every worker (gloo on CPU, NCCL on GPU, with Ray's
  NCCL settings), and at the end the group destroyed as Ray's backend does it;
- each worker's CUDA device set before its train function runs, and every worker of a node sees
  the node's GPUs (``share_cuda_visible_devices``), as with ``TorchConfig``.

``tests/unit/test_trial_start.py`` holds that the controller's unpickling of it imports no torch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework


@dataclass
class ProcessGroupConfig(BackendConfig):
    """Ray Train's backend config of a run: ``backend`` (``gloo`` or ``nccl``), the group's
    timeout in seconds. ``TorchTrainer`` takes it as its ``torch_config``."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return ProcessGroupBackend

    @property
    def train_func_context(self) -> Any:
        """Sets the worker's CUDA device around the train function (Ray's own, read on the
        driver and the workers, never by the controller)."""
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class ProcessGroupBackend(Backend):
    """Makes and ends the workers' process group (run by the controller; see the module)."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, ProcessGroupConfig)
        from ray.train._internal.utils import get_address_and_port

        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(set_env, addr=addr, port=port)
        n = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    i, init_group, backend_config.backend, i, n, backend_config.timeout_s
                )
                for i in range(n)
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        from ray.exceptions import GetTimeoutError

        futures = worker_group.execute_async(end_group, len(worker_group) > 1)
        with contextlib.suppress(GetTimeoutError):  # as Ray's: a hung group ends with its worker
            ray.get(futures, timeout=SHUTDOWN_TIMEOUT_S)


SHUTDOWN_TIMEOUT_S = 30.0  # Ray's TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S default


def set_env(addr: str, port: int) -> None:
    """On a worker: the group's master, and the torchrun variables of this worker's ranks."""
    import os

    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    _set_torch_distributed_env_vars()


def init_group(backend: str, rank: int, world_size: int, timeout_s: int) -> None:
    """On a worker: join the group (Ray's ``_setup_torch_process_group``, ``env://``)."""
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(backend, rank, world_size, "env://", timeout_s)


def end_group(destroy: bool) -> None:
    """On a worker: Ray's end of the group (destroyed where there are several ranks)."""
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)
