"""The ranks' harness itself: forked from a server that imported torch and TorchRec once, each rank
still sees the caller's environment and working directory as they are at the call."""

from __future__ import annotations

import os

import pytest

from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed


def _where(rank: int, world: int) -> tuple[str | None, str, int, bool]:
    import sys

    import torch.distributed as dist

    return (os.environ.get("HARNESS_PROBE"), os.getcwd(), dist.get_world_size(),
            "torchrec" in sys.modules)  # fmt: skip


def test_ranks_see_the_callers_environment_and_folder_at_the_call(tmp_path, monkeypatch):
    run_ranks(_where, world_size=1)  # the fork server started before the caller's changes
    monkeypatch.setenv("HARNESS_PROBE", "set after the server started")
    monkeypatch.chdir(tmp_path)
    got = run_ranks(_where)
    assert got == [("set after the server started", str(tmp_path), 2, True)] * 2
