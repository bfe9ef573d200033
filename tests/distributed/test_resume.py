"""Resume is exact: 2K steps straight == K steps, stop, resume, K more (2 gloo ranks).

Checkpoints hold model, fused and dense optimizer state, step and data position; tolerance 0
(bitwise): the resumed run replays the same batches and the same updates.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

K = 6


OPTIMIZERS = {
    "adagrad": {},  # row-wise Adagrad on the tables, Adagrad on the rest (the defaults)
    "adam": {"optim.dense_optimizer": "adam"},  # FBGEMM's CPU kernels have no embedding Adam
    "sgd": {"optim.embedding_optimizer": "exact_sgd", "optim.dense_optimizer": "sgd"},
    # FBGEMM's fused Adam on the tables (its step counter restored by set_optimizer_step): GPU only
    "embedding_adam": {"optim.embedding_optimizer": "adam", "optim.dense_optimizer": "adam"},
}


def _train(
    rank, world, root, steps, pipeline="off", use_gpu=False, dtype="fp32", optim="adagrad",
    prefetch=2,
):  # fmt: skip
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    cfg = tiny_config(
        **{
            "train.steps": steps,
            "train.checkpoint_every": K,
            "train.eval_every": K,
            "sharding.pipeline": pipeline,
            "embeddings.dtype": dtype,
            **OPTIMIZERS[optim],
            "data.prefetch": prefetch,
        }
    )
    reporter = LocalReporter(root, rank)
    env = current(use_gpu=use_gpu)
    metrics = Trainer(cfg, env, reporter, log=lambda s: None).train()
    folder = reporter.completed()[-1]
    extra = torch.load(f"{folder}/worker_{rank}.pt", weights_only=True)
    del extra["torch_rng"]
    assert ("cuda_rng" in extra) == use_gpu  # a GPU worker saves its device's generator too
    extra.pop("cuda_rng", None)
    cost = {k: extra.pop(k) for k in ("wall_s", "worker_s")}  # times differ between runs
    model = build(cfg, env).model
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    tensors = {
        k: [s.tensor.cpu() for s in v.local_shards()] if isinstance(v, ShardedTensor) else [v.cpu()]
        for k, v in state["model"].items()
    }
    history = [h for r in reporter.reports for h in r["loss_history"]]
    return {
        "metrics": metrics, "extra": extra, "cost": cost, "weights": tensors, "history": history
    }  # fmt: skip


@pytest.mark.parametrize("pipeline", ["off", "on"])
def test_resume_is_exact(tmp_path, pipeline):
    check_resume_is_exact(tmp_path, pipeline, atol=0)


@pytest.mark.parametrize("optim", ["adam", "sgd"])
def test_resume_is_exact_with_every_optimizer(tmp_path, optim):
    """Dense Adam's state is created at its first step (TorchRec's load skipped it); SGD has no
    state at all (DCP writes no optimizer entry, which the load required). The embedding Adam's
    step counter (kept by FBGEMM outside the optimizer state, restored with
    ``set_optimizer_step``) is GPU-only: FBGEMM's CPU kernels have no fused Adam."""
    check_resume_is_exact(tmp_path, "off", atol=0, optim=optim)


def check_resume_is_exact(
    tmp_path,
    pipeline,
    atol,
    use_gpu=False,
    dtype="fp32",
    backend="gloo",
    world_size=2,
    optim="adagrad",
):
    """2K steps straight vs K, stop, resume, K more (shared by the NCCL runs in ``tests/gpu``)."""

    def train(folder, steps):
        args = (str(tmp_path / folder), steps, pipeline, use_gpu, dtype, optim)
        return run_ranks(_train, *args, backend=backend, world_size=world_size)

    straight = train("a", 2 * K)
    first = train("b", K)
    resumed = train("b", 2 * K)
    for s, f, r in zip(straight, first, resumed, strict=True):
        assert s["extra"] == r["extra"] == {**s["extra"], "step": 2 * K}
        # the cost goes on from the checkpoint: samples of every rank, seconds of both attempts
        assert r["extra"]["samples_seen"] == 2 * K * world_size * 32
        assert r["cost"]["wall_s"] > f["cost"]["wall_s"] > 0
        assert r["cost"]["worker_s"] == pytest.approx(world_size * r["cost"]["wall_s"])
        assert r["metrics"]["wall_s"] == r["cost"]["wall_s"]
        assert s["metrics"]["loss"] == pytest.approx(r["metrics"]["loss"], abs=atol)
        assert s["metrics"]["val_auc"] == pytest.approx(r["metrics"]["val_auc"], abs=atol)
        for name, tensor in s["weights"].items():
            torch.testing.assert_close(tensor, r["weights"][name], atol=atol, rtol=0)
    # the resumed run reported only the steps after the checkpoint: no step twice
    assert [step for step, _ in resumed[0]["history"]] == [8, 10, 12]
    assert [step for step, _ in straight[0]["history"]] == [2, 4, 6, 8, 10, 12]


def test_prefetching_batches_changes_nothing(tmp_path):
    """Batches made in a background thread (data.prefetch) train the same model, bitwise."""
    off, on = (
        run_ranks(_train, str(tmp_path / f"p{n}"), K, "off", False, "fp32", "adagrad", n)
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


def check_pipeline_equals_plain(tmp_path, atol, use_gpu=False, backend="gloo"):
    plain, piped = (
        run_ranks(_train, str(tmp_path / p), K, p, use_gpu, backend=backend, world_size=1)[0]
        for p in ("off", "on")
    )
    assert piped["metrics"]["loss"] == pytest.approx(plain["metrics"]["loss"], abs=atol)
    for name, tensor in plain["weights"].items():
        torch.testing.assert_close(piped["weights"][name], tensor, atol=atol, rtol=0)
