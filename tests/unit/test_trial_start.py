"""A trial's start: the process group's backend (``recsys.train.backend``) that Ray Train's
controller loads without torch, making the group as Ray's ``TorchConfig`` does."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import pytest

from recsys.train import backend
from recsys.train.backend import ProcessGroupBackend, ProcessGroupConfig


def fresh_python(code: str) -> str:
    """``code`` run by a new interpreter of this venv; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_the_controller_loads_the_backend_config_without_torch() -> None:
    """What Ray Train's controller unpickles of our backend (its config, the backend class)
    imports no torch; Ray's ``TorchConfig`` does (about 1.3 s of every trial's start)."""
    blob = pickle.dumps(ProcessGroupConfig(backend="gloo"))
    code = (
        "import pickle, sys\n"
        f"cfg = pickle.loads({blob!r})\n"
        "cls = cfg.backend_cls\n"
        "print(cfg.backend, cfg.timeout_s, cls.share_cuda_visible_devices, 'torch' in sys.modules)"
    )
    assert fresh_python(code) == "gloo 1800 True False"


def test_the_config_is_torchs_for_the_rest_of_ray_train() -> None:
    """The worker's CUDA device is set around the train function by Ray's own context manager,
    and Ray Train files the run as a torch run."""
    from ray.train.torch.config import TorchConfigContextManager
    from ray.train.v2._internal.util import TrainingFramework

    cfg = ProcessGroupConfig(backend="nccl")
    assert cfg.train_func_context is TorchConfigContextManager
    assert cfg.framework == TrainingFramework.TORCH
    assert cfg.to_dict() == {"backend": "nccl", "init_method": "env", "timeout_s": 1800}


class FakeGroup:
    """A worker group whose ``execute*`` calls are recorded and answered in place."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return self.n

    def execute_single(self, rank: int, fn: Any, *args: Any, **kw: Any) -> Any:
        self.calls.append(("single", rank, fn.__name__, args, kw))
        return ("10.0.0.1", 29500)

    def execute(self, fn: Any, *args: Any, **kw: Any) -> list[Any]:
        self.calls.append(("all", None, fn.__name__, args, kw))
        return [None] * self.n

    def execute_single_async(self, rank: int, fn: Any, *args: Any, **kw: Any) -> str:
        self.calls.append(("async", rank, fn.__name__, args, kw))
        return f"ref{rank}"

    def execute_async(self, fn: Any, *args: Any, **kw: Any) -> list[str]:
        self.calls.append(("all_async", None, fn.__name__, args, kw))
        return ["ref"] * self.n


@pytest.mark.parametrize("n", [1, 2])
def test_the_backend_makes_the_group_as_rays_does(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Rank 0's address and port as the master on every worker, then every rank joins (waited
    for together); at the end the group is destroyed where there are several ranks."""
    got: list[Any] = []
    monkeypatch.setattr(backend.ray, "get", lambda refs, **kw: got.append(refs))
    group, cfg = FakeGroup(n), ProcessGroupConfig(backend="gloo", timeout_s=60)
    ProcessGroupBackend().on_start(group, cfg)
    assert group.calls[0][:3] == ("single", 0, "get_address_and_port")
    assert group.calls[1] == ("all", None, "set_env", (), {"addr": "10.0.0.1", "port": 29500})
    joins = [c for c in group.calls if c[2] == "init_group"]
    assert [(c[1], c[3]) for c in joins] == [(r, ("gloo", r, n, 60)) for r in range(n)]
    assert got == [[f"ref{r}" for r in range(n)]]
    ProcessGroupBackend().on_shutdown(group, cfg)
    assert group.calls[-1][2:4] == ("end_group", (n > 1,))
