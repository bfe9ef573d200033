"""A checkpoint saved by 2 gloo ranks resumes on 1 and on 3: tables and optimizer state (row-wise
Adagrad on the tables, dense Adam) are resharded by DCP and equal the saved ones; the resumed run
says so in its log and its first report, and trains on. A checkpoint whose column-wise table is
loaded by another plan (table-wise on 1 rank, twice the column shards on 2) maps that table's
row-wise state by the documented rule and says so."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

K = 6


# t_cat_3 (900 x 16) as the saving plan has it (column-wise, 2 shards of 8), and two other plans
PLANS = {
    "cw2": {"sharding_types": ["column_wise"], "min_partition": 8},
    "tw": {"sharding_types": ["table_wise"]},
    "cw4": {"sharding_types": ["column_wise"], "min_partition": 4},
}


def _config(steps, plan="cw2"):
    return tiny_config(
        **{
            "train.steps": steps,
            "train.checkpoint_every": K,
            "train.eval_every": K,
            "optim.dense_optimizer": "adam",
            "sharding.tables": {"t_cat_3": PLANS[plan]},
        }
    )


def _train(rank, world, root, steps, plan="cw2"):
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    lines: list[str] = []
    reporter = LocalReporter(root, rank)
    trainer = Trainer(_config(steps, plan), current(use_gpu=False), reporter, log=lines.append)
    position, rows = trainer.state.data_position, len(trainer.stream.shard)
    trainer.train()
    return {"lines": lines, "reports": reporter.reports, "position": position, "rows": rows}


def _restore_and_save(rank, world, root, out, plan="cw2"):
    """Restore the newest checkpoint under ``root`` on this world size and ``plan``, then save it
    again, untouched, to ``out`` (so both can be compared whole, unsharded)."""
    from recsys.distributed import checkpoint
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.reporting import LocalReporter
    from recsys.train.resume import restore

    env = current(use_gpu=False)
    built = build(_config(K, plan), env)
    state = restore(LocalReporter(root, rank), built.model, built.optimizer, env, lambda s: None)
    checkpoint.save(out, built.model, built.optimizer, state, rank, world)
    if plan == "cw2":
        return state.saved_world_size
    return state.remapped, built.plan["tables"]["t_cat_3"]


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


@pytest.mark.parametrize("world", [1, pytest.param(3, marks=pytest.mark.extended)])
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


@pytest.mark.parametrize("world", [1, pytest.param(3, marks=pytest.mark.extended)])
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


MOMENTUM = "t_cat_3.momentum1"


@pytest.mark.parametrize(("plan", "world"), [("tw", 1), ("cw4", 2)])
def test_a_column_wise_table_loads_into_another_plan(tmp_path, plan, world):
    """Saved with t_cat_3 in 2 column shards (its row-wise Adagrad state 2 x 900 values); loaded
    table-wise on 1 rank (900 values: each row's mean of its two shard states, exact) and in 4
    column shards on 2 ranks (4 x 900: each quarter takes the state of the half it lies in)."""
    root = str(tmp_path / "run")
    run_ranks(_train, root, K, world_size=2)
    again = str(tmp_path / "again")
    ranks = run_ranks(_restore_and_save, root, again, plan, world_size=world)
    remapped, layout = ranks[0]
    layouts = {
        "tw": ("table_wise", "1 shard of all columns"),
        "cw4": ("column_wise", "4 column shards"),
    }
    want_type, shards = layouts[plan]
    assert layout["sharding_type"] == want_type
    assert remapped == (f"t_cat_3 (2 column shards -> {shards})",)
    before, after = _flat(_full(f"{root}/step_{K:08d}")), _flat(_full(again))
    assert set(before) == set(after)
    (key,) = [k for k in before if k.endswith(MOMENTUM)]
    halves = before[key].reshape(2, 900)
    assert halves.max() > 0 and not torch.equal(halves[0], halves[1])  # trained, per shard
    want = halves.mean(0) if plan == "tw" else halves.repeat_interleave(2, dim=0).reshape(-1)
    torch.testing.assert_close(after[key], want, atol=0, rtol=1e-6)
    for k, v in before.items():  # the rest, tables included, exactly
        if isinstance(v, torch.Tensor) and k != key:
            torch.testing.assert_close(after[k], v, atol=0, rtol=0, msg=k)


def test_a_resume_into_another_plan_trains_on_and_says_so(tmp_path):
    root = str(tmp_path / "run")
    run_ranks(_train, root, K, world_size=2)
    ranks = run_ranks(_train, root, 2 * K, "tw", world_size=1)
    note = ranks[0]["reports"][0]["resume_note"]
    assert "row-wise optimizer state of t_cat_3 (2 column shards -> 1 shard of all columns)" in note
    assert any(note in line for line in ranks[0]["lines"])
    assert [r["step"] for r in ranks[0]["reports"]] == [2 * K]


def test_the_mapping_rule_is_exact_where_shards_merge():
    """Row-wise Adagrad's state of a column shard is a sum of the row's mean squared gradient
    over the shard's columns: merged shards' states are their width-weighted mean, exactly."""
    from recsys.distributed.rowwise_state import mixing

    g2 = torch.rand(5, 7, 16, dtype=torch.float64)  # steps x rows x columns, squared gradients

    def state(widths):
        parts = torch.split(g2, list(widths), dim=2)
        return torch.stack([p.mean(2).sum(0) for p in parts])  # shards x rows

    for saved, new in [((4, 12), (16,)), ((4, 4, 8), (8, 8)), ((8, 8), (8, 8))]:
        torch.testing.assert_close(mixing(saved, new) @ state(saved), state(new))
    # a split starts each part from the whole shard's state
    torch.testing.assert_close(mixing((16,), (8, 8)), torch.ones(2, 1, dtype=torch.float64))
