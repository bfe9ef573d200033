"""Faults inside a training job (2 gloo ranks, the product loop with a local reporter)."""

from __future__ import annotations

import errno
import os

import pytest

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed


def _train(rank, world, root, overrides, fail_second_save=False):
    from recsys.distributed import checkpoint
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    if fail_second_save:  # the disk fills up while the step-12 checkpoint is written
        real = checkpoint.torch.save

        def save(obj, path, *a, **k):
            if "step_00000012" in str(path):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(obj, path, *a, **k)

        checkpoint.torch.save = save
    logs: list[str] = []
    try:
        cfg, reporter = tiny_config(**overrides), LocalReporter(root, rank)
        metrics = Trainer(cfg, current(False), reporter, logs.append).train()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "logs": logs}
    return {"metrics": {k: v for k, v in metrics.items() if k != "loss_history"}, "logs": logs}


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    root = str(tmp_path)
    run_ranks(_train, root, {"train.steps": 12})
    bad = tmp_path / "step_00000012"
    shard = bad / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    results = run_ranks(_train, root, {"train.steps": 18})
    logs = "\n".join(results[0]["logs"])
    assert "skipping checkpoint" in logs and "step_00000012" in logs and "truncated" in logs
    assert "resumed from step 6" in logs
    assert results[0]["metrics"]["step"] == 18
    # the replayed steps got new folders; the bad one is left as it was for inspection
    names = sorted(os.listdir(root))
    assert "step_00000012_after_step_00000012" in names and "step_00000012" in names


def test_missing_shard_is_named(tmp_path):
    root = str(tmp_path)
    run_ranks(_train, root, {"train.steps": 6})
    os.remove(tmp_path / "step_00000006" / "__0_0.distcp")
    results = run_ranks(_train, root, {"train.steps": 12})
    logs = "\n".join(results[0]["logs"])
    assert "__0_0.distcp is missing" in logs
    assert "resumed" not in logs  # no usable checkpoint left: a fresh start, not a crash loop
    assert results[0]["metrics"]["step"] == 12


def test_disk_full_is_a_clear_error_and_previous_checkpoint_stays(tmp_path):
    root = str(tmp_path)
    results = run_ranks(_train, root, {"train.steps": 12}, True, world_size=1)
    assert "CheckpointError: cannot write checkpoint to" in results[0]["error"]
    assert "step_00000012" in results[0]["error"] and "No space left" in results[0]["error"]
    from recsys.distributed.checkpoint import verify

    verify(str(tmp_path / "step_00000006"))  # still complete


def test_diverged_trial_stops_with_status(tmp_path):
    overrides = {"optim.lr": 1e30, "optim.embedding_lr": 1e30, "optim.dense_optimizer": "sgd"}
    results = run_ranks(_train, str(tmp_path), overrides)
    m = results[0]["metrics"]
    assert m["diverged"] == 1.0 and m["step"] < 12
    assert "diverged" in "\n".join(results[0]["logs"])


def test_same_config_same_metrics(tmp_path):
    """Reproducible on CPU: same config, seed and worker count give identical metrics (seeded
    init and data order, deterministic CPU kernels, EXACT_* fused optimizers)."""
    a = run_ranks(_train, str(tmp_path / "a"), {})
    b = run_ranks(_train, str(tmp_path / "b"), {})
    keys = ["loss", "val_auc", "val_log_loss", "test_auc"]
    assert [a[0]["metrics"][k] for k in keys] == [b[0]["metrics"][k] for k in keys]
