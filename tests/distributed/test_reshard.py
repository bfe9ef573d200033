"""A checkpoint saved by 2 gloo ranks resumes on 1 and on 3: tables and optimizer state (row-wise
Adagrad on the tables, dense Adam) are resharded by DCP and equal the saved ones; the resumed run
says so in its log and its first report, and trains on."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

K = 6


def _config(steps):
    return tiny_config(
        **{
            "train.steps": steps,
            "train.checkpoint_every": K,
            "train.eval_every": K,
            "optim.dense_optimizer": "adam",
        }
    )


def _train(rank, world, root, steps):
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    lines: list[str] = []
    reporter = LocalReporter(root, rank)
    trainer = Trainer(_config(steps), current(use_gpu=False), reporter, log=lines.append)
    position, rows = trainer.state.data_position, len(trainer.stream.shard)
    trainer.train()
    return {"lines": lines, "reports": reporter.reports, "position": position, "rows": rows}


def _restore_and_save(rank, world, root, out):
    """Restore the newest checkpoint under ``root`` on this world size, then save it again,
    untouched, to ``out`` (so both can be compared whole, unsharded)."""
    from recsys.distributed import checkpoint
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.reporting import LocalReporter
    from recsys.train.resume import restore

    env = current(use_gpu=False)
    built = build(_config(K), env)
    state = restore(LocalReporter(root, rank), built.model, built.optimizer, env, lambda s: None)
    checkpoint.save(out, built.model, built.optimizer, state, rank, world)
    return state.saved_world_size


def _full(folder):
    """A DCP checkpoint as one plain state dict of whole tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, f"{folder}.pt")
    return torch.load(f"{folder}.pt", weights_only=False)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}/"))
        return out
    return {prefix.rstrip("/"): tree}


@pytest.mark.parametrize("world", [1, 3])
def test_checkpoint_of_two_ranks_loads_on_another_count(tmp_path, world):
    root = str(tmp_path / "run")
    run_ranks(_train, root, K, world_size=2)
    saved = f"{root}/step_{K:08d}"
    again = str(tmp_path / "again")
    assert run_ranks(_restore_and_save, root, again, world_size=world) == [2] * world
    before, after = _flat(_full(saved)), _flat(_full(again))
    tensors = [k for k, v in before.items() if isinstance(v, torch.Tensor)]
    assert any("embedding_bags" in k and "momentum1" in k for k in tensors)  # fused Adagrad
    assert any("exp_avg_sq" in k for k in tensors)  # dense Adam
    assert set(before) == set(after)
    for key in tensors:
        torch.testing.assert_close(after[key], before[key], atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("world", [1, 3])
def test_resume_on_another_count_trains_on_and_says_so(tmp_path, world):
    root = str(tmp_path / "run")
    first = run_ranks(_train, root, K, world_size=2)
    ranks = run_ranks(_train, root, 2 * K, world_size=world)
    note = ranks[0]["reports"][0]["resume_note"]
    assert f"on {world} workers from a checkpoint of 2" in note
    assert any(note in line for line in ranks[0]["lines"])
    assert all("resume_note" not in r for r in ranks[0]["reports"][1:])
    assert [r["step"] for r in ranks[0]["reports"]] == [2 * K]
    # the same epoch (the first) and fraction of it: K batches of 32 of rank 0's old shard
    done = K * 32 / first[0]["rows"]
    for r in ranks:
        assert r["position"] == int(done * r["rows"])
