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


def _train(rank, world, root, steps, pipeline="off"):
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
        }
    )
    reporter = LocalReporter(root, rank)
    metrics = Trainer(cfg, current(use_gpu=False), reporter, log=lambda s: None).train()
    folder = reporter.completed()[-1]
    extra = torch.load(f"{folder}/worker_{rank}.pt", weights_only=True)
    del extra["torch_rng"]
    assert "cuda_rng" not in extra  # CPU workers have no CUDA generator to save
    model = build(cfg, current(use_gpu=False)).model
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    tensors = {
        k: [s.tensor.clone() for s in v.local_shards()] if isinstance(v, ShardedTensor) else [v]
        for k, v in state["model"].items()
    }
    history = [h for r in reporter.reports for h in r["loss_history"]]
    return {"metrics": metrics, "extra": extra, "weights": tensors, "history": history}


@pytest.mark.parametrize("pipeline", ["off", "on"])
def test_resume_is_exact(tmp_path, pipeline):
    straight = run_ranks(_train, str(tmp_path / "a"), 2 * K, pipeline)
    run_ranks(_train, str(tmp_path / "b"), K, pipeline)
    resumed = run_ranks(_train, str(tmp_path / "b"), 2 * K, pipeline)
    for s, r in zip(straight, resumed, strict=True):
        assert s["extra"] == r["extra"] == {**s["extra"], "step": 2 * K}
        assert s["metrics"]["loss"] == r["metrics"]["loss"]
        assert s["metrics"]["val_auc"] == r["metrics"]["val_auc"]
        for name, tensor in s["weights"].items():
            torch.testing.assert_close(tensor, r["weights"][name], atol=0, rtol=0)
    # the resumed run reported only the steps after the checkpoint: no step twice
    assert [step for step, _ in resumed[0]["history"]] == [8, 10, 12]
    assert [step for step, _ in straight[0]["history"]] == [2, 4, 6, 8, 10, 12]
