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
    [
        "adam",
        "dense_adam",
        *(pytest.param(o, marks=pytest.mark.extended) for o in ("sgd", "regularised")),
    ],
)
def test_resume_is_exact_with_every_optimizer(tmp_path, optim):
    """Dense Adam's state is created at its first step (TorchRec's load skipped it); SGD has no
    state at all (DCP writes no optimizer entry, which the load required). The embedding Adam's
    step counter (kept by FBGEMM outside the optimizer state, restored with
    ``set_optimizer_step``) is GPU-only: FBGEMM's CPU kernels have no fused Adam; on CPU workers
    ``dense_adam`` holds the tables dense and trains them with torch's Adam, an optimizer of its
    own beside the dense one. ``regularised``: dropout, batch norm (each rank's running
    statistics differ until averaged) and weight decay on the tables."""
    check_resume_is_exact(tmp_path, "off", atol=0, optim=optim)


def test_a_run_paused_and_started_again_trains_as_one_uninterrupted(tmp_path):
    """``train.pause_at`` (successive halving's rounds): the run stops at its first report at
    or past that step, checkpoint written, its schedule (here a decay over all ``steps``) that
    of the whole run; started again without it, it ends bitwise where the uninterrupted run
    does. Started again at or past it, it trains nothing."""
    schedule = {"optim.decay_start_step": 2, "optim.decay_steps": 2 * RESUME_STEPS - 2,
                "optim.end_lr_factor": 0.1}  # fmt: skip

    def train(folder, pause_at):
        extra = {**schedule, "train.pause_at": pause_at}
        args = (str(tmp_path / folder), 2 * RESUME_STEPS, "off", False, "fp32", "adagrad", 2, extra)
        return run_ranks(resume_rank, *args)

    straight = train("a", 0)
    paused = train("b", RESUME_STEPS - 1)  # (not a report's step: it stops at the next report)
    assert [r["extra"]["step"] for r in paused] == [RESUME_STEPS] * 2
    assert "test_auc" in straight[0]["metrics"] and "test_auc" not in paused[0]["metrics"]
    again = train("b", RESUME_STEPS)
    assert [r["extra"]["step"] for r in again] == [RESUME_STEPS] * 2  # nothing left to train
    resumed = train("b", 0)
    for s, r in zip(straight, resumed, strict=True):
        assert s["extra"] == r["extra"] == {**s["extra"], "step": 2 * RESUME_STEPS}
        assert s["metrics"]["val_auc"] == r["metrics"]["val_auc"]
        for name, tensor in s["weights"].items():
            torch.testing.assert_close(tensor, r["weights"][name], atol=0, rtol=0)
    assert [step for step, _ in resumed[0]["history"]] == [8, 10, 12]


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


def fused_tbes(optimizer) -> set[int]:
    """The TBEs behind the fused embedding optimizers in ``optimizer`` (TorchRec's path for
    ``set_optimizer_step``), as ids."""
    found, todo = set(), [optimizer]
    while todo:
        opt = todo.pop()
        if hasattr(opt, "_emb_module"):
            found.add(id(opt._emb_module))
        todo += [o for _, o in getattr(opt, "optimizers", [])]
    return found


def counters_rank(rank, world, root, steps):
    """The step counters ``(iter, iter_cpu)`` of every FBGEMM TBE of a trainer's model once
    restored from ``root``, once trained to ``steps`` (evaluating every 3 steps), and once the
    first checkpoint is loaded into the trained model; whether they are every fused
    optimizer's TBEs."""
    from recsys.distributed import checkpoint
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer
    from tests.distributed.common import tiny_config

    cfg = tiny_config(**{"train.steps": steps, "train.eval_every": 3,
                         "train.checkpoint_every": 3})  # fmt: skip
    env, reporter = current(use_gpu=False), LocalReporter(root, rank)
    trainer = Trainer(cfg, env, reporter, log=lambda s: None)
    model, optimizer = trainer.stepper.model, trainer.stepper.optimizer
    tbes = checkpoint.step_counter_modules(model)

    def counters():
        return [(int(m.iter.item()), int(m.iter_cpu.item())) for m in tbes]

    restored = counters()
    trainer.train()
    trained = counters()
    checkpoint.load(reporter.completed()[0], model, optimizer, rank)
    every = {id(m) for m in tbes} == fused_tbes(optimizer)
    return restored, trained, counters(), every


def test_every_tbes_step_counter_counts_training_steps_only_and_resumes(tmp_path):
    """Embedding Adam's bias correction reads FBGEMM's step counter, which every forward
    advances, evaluation's too: evaluation puts it back, and a load sets it to the saved step
    (``iter`` and ``iter_cpu``, what the kernels read), also in a model that has run. The TBEs
    sit in TorchRec's plain-list ``_lookups``, out of ``model.modules()``'s reach: found there,
    every fused optimizer's. (CPU tables train with row-wise Adagrad, which ignores the counter
    but advances it alike.)"""
    root = str(tmp_path / "run")
    restored, trained, reloaded, every = run_ranks(counters_rank, root, 6, world_size=1)[0]
    assert restored and every and all(c == (0, 0) for c in restored)  # a fresh start
    assert all(c == (6, 6) for c in trained), trained  # evaluated twice, counted 6
    assert all(c == (3, 3) for c in reloaded), reloaded  # the step-3 checkpoint's
    restored, trained, _, _ = run_ranks(counters_rank, root, 9, world_size=1)[0]
    assert all(c == (6, 6) for c in restored), restored
    assert all(c == (9, 9) for c in trained), trained
