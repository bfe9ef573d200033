"""What only GPUs can check: NCCL, ``cuda:LOCAL_RANK``, FBGEMM's CUDA kernels, the train pipeline on
CUDA streams. Skipped (not failed) without GPUs; ``./run.sh gpu-check`` runs them on a GPU host.

Each test runs the same rank function as its CPU counterpart (``tests/distributed``), with NCCL
and the GPUs; tolerances are looser than on CPU where CUDA kernels sum in another order. The
exact-resume items are held to ``GPU_RESUME_ATOL`` (why: ``tests/distributed/common.py``).
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

from tests.distributed.common import (
    GPU_RESUME_ATOL,
    INT8_MAX_PROB_DIFF,
    check_against_unsharded,
    check_pipeline_equals_plain,
    check_resume_is_exact,
    equivalence_rank,
    export_config,
    export_rank,
)
from tests.distributed.harness import run_ranks

pytestmark = [pytest.mark.gpu(gpus=2), pytest.mark.distributed]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
GPU_ATOL = 1e-4


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
def test_nccl_sharded_matches_unsharded_row_and_table_wise(pipeline):
    """2 NCCL ranks: row-wise, table-wise, column-wise and QR tables equal the unsharded model,
    through the plain step and through TrainPipelineSparseDist; the debug gather works on NCCL."""
    results = run_ranks(equivalence_rank, pipeline, True, backend="nccl")
    check_against_unsharded(results, pipeline, GPU_ATOL, row_wise=True)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_nccl_resume_is_exact(tmp_path, dtype):
    """Resume through a checkpoint on NCCL (the all-ranks-agree collective, DCP), pipeline on;
    half-precision tables round stochastically with the CUDA generator, saved and restored."""
    atol = GPU_RESUME_ATOL
    check_resume_is_exact(tmp_path, "on", atol=atol, use_gpu=True, dtype=dtype, backend="nccl")


def test_nccl_resume_is_exact_with_embedding_adam(tmp_path):
    """FBGEMM's fused Adam on the tables: its moments in the checkpoint, its step counter (kept
    outside the optimizer state) restored with ``set_optimizer_step``; dense Adam beside it."""
    check_resume_is_exact(
        tmp_path, "on", atol=GPU_RESUME_ATOL, use_gpu=True, backend="nccl", optim="embedding_adam"
    )


@pytest.mark.gpu(gpus=1)
@pytest.mark.parametrize("optim", ["adagrad", "embedding_adam"])
def test_one_gpu_resume_is_exact(tmp_path, optim):
    """The resume item on one GPU (NCCL with one rank: DCP, the agree collective, CUDA RNG)."""
    atol = GPU_RESUME_ATOL
    check_resume_is_exact(
        tmp_path, "on", atol=atol, use_gpu=True, backend="nccl", world_size=1, optim=optim
    )


@pytest.mark.gpu(gpus=1)
def test_one_gpu_pipeline_equals_plain_steps(tmp_path):
    """TrainPipelineSparseDist on CUDA streams trains the same model as plain steps (1 rank)."""
    check_pipeline_equals_plain(tmp_path, GPU_ATOL, use_gpu=True, backend="nccl")


@pytest.mark.gpu(gpus=1)
def test_export_of_a_one_gpu_checkpoint(tmp_path):
    from recsys.serving.export import export

    run_ranks(export_rank, str(tmp_path / "ckpt"), True, backend="nccl", world_size=1)
    report = export(export_config(), str(tmp_path / "ckpt" / "step_00000030"),
                    str(tmp_path / "out"), "int8")  # fmt: skip
    assert report.max_prob_diff < INT8_MAX_PROB_DIFF, report


@pytest.mark.gpu(gpus=1)
@pytest.mark.ray
def test_killed_worker_on_one_gpu_restarts_from_last_checkpoint(tmp_path):
    import ray

    from recsys.runtime.cluster import connect
    from recsys.train.ray_trainer import Resources
    from tests.helpers import fit_killed_once

    connect("local", log_to_driver=False)
    try:
        fit_killed_once(tmp_path, Resources(1, True, 1.0))
    finally:
        ray.shutdown()


def test_export_of_a_gpu_trained_checkpoint(tmp_path):
    from recsys.serving.export import export

    run_ranks(export_rank, str(tmp_path / "ckpt"), True, backend="nccl")
    report = export(export_config(), str(tmp_path / "ckpt" / "step_00000030"),
                    str(tmp_path / "out"), "int8")  # fmt: skip
    assert report.max_prob_diff < INT8_MAX_PROB_DIFF, report


@pytest.mark.ray
def test_killed_gpu_worker_restarts_from_last_checkpoint(tmp_path):
    """Ray Train on GPUs (NCCL group from TorchConfig): a SIGKILLed worker, a restart, the
    restore's collective on the device; every step reported once."""
    import ray

    from recsys.runtime.cluster import connect
    from recsys.train.ray_trainer import Resources
    from tests.helpers import fit_killed_once

    connect("local", log_to_driver=False)
    try:
        fit_killed_once(tmp_path, Resources(2, True, 1.0))
    finally:
        ray.shutdown()


@pytest.mark.gpu(gpus=1)
def test_the_planner_sees_this_gpu():
    from recsys.distributed.env import WorkerEnv
    from recsys.distributed.sharding import Machine

    env = WorkerEnv(0, 1, 0, 1, torch.device("cuda", 0))
    assert Machine.of(env).hbm == torch.cuda.get_device_properties(0).total_memory
