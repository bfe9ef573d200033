"""Resume is exact: 2K steps straight == K steps, stop, resume, K more (2 gloo ranks).

Checkpoints hold model, fused and dense optimizer state, step and data position; tolerance 0
(bitwise): the resumed run replays the same batches and the same updates.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import (
    RESUME_STEPS,
    check_pipeline_equals_plain,
    check_resume_is_exact,
    resume_rank,
)
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("pipeline", ["off", "on"])
def test_resume_is_exact(tmp_path, pipeline):
    check_resume_is_exact(tmp_path, pipeline, atol=0)


@pytest.mark.parametrize(
    "optim",
    ["adam", *(pytest.param(o, marks=pytest.mark.extended) for o in ("sgd", "regularised"))],
)
def test_resume_is_exact_with_every_optimizer(tmp_path, optim):
    """Dense Adam's state is created at its first step (TorchRec's load skipped it); SGD has no
    state at all (DCP writes no optimizer entry, which the load required). The embedding Adam's
    step counter (kept by FBGEMM outside the optimizer state, restored with
    ``set_optimizer_step``) is GPU-only: FBGEMM's CPU kernels have no fused Adam. ``regularised``:
    dropout, batch norm (each rank's running statistics differ until averaged) and weight decay
    on the tables."""
    check_resume_is_exact(tmp_path, "off", atol=0, optim=optim)


def test_prefetching_batches_changes_nothing(tmp_path):
    """Batches made in a background thread (data.prefetch) train the same model, bitwise."""
    off, on = (
        run_ranks(
            resume_rank, str(tmp_path / f"p{n}"), RESUME_STEPS, "off", False, "fp32", "adagrad", n
        )
        for n in (0, 2)
    )
    for a, b in zip(off, on, strict=True):
        assert a["metrics"]["loss"] == b["metrics"]["loss"]
        for name, tensor in a["weights"].items():
            torch.testing.assert_close(tensor, b["weights"][name], atol=0, rtol=0)


def test_pipelined_steps_equal_plain_steps(tmp_path):
    """One rank: TrainPipelineSparseDist trains the same model as plain steps (the 1-GPU check in
    ``tests/gpu`` runs this with NCCL and CUDA streams)."""
    check_pipeline_equals_plain(tmp_path, atol=1e-6)
