"""A table that several features read (``embeddings.shared``), sharded on 2 gloo ranks, equals the
unsharded model: forward, K training steps (both features' gradients reach the one table), and a
checkpoint that resumes the same training exactly.

The config is ``tiny_config``'s with two sharers: ``cat_1`` reads ``cat_3``'s table (listed
before its owner; column-wise in the ``mixed`` plan) and ``cat_5`` reads ``cat_4``'s QR-split
table (table-wise). The reference is the one of ``test_sharded_equivalence.py`` (Adagrad against
FBGEMM's ``exact_adagrad``, global batches), at its tolerance.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import (
    EQUIVALENCE_STEPS,
    assert_equal_to_unsharded,
    concat_batches,
    copy_full_into_sharded,
    global_batches,
    tiny_config,
    train_both,
    unsharded_reference,
)
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

ATOL = 1e-5
SHARED = {"cat_1": "cat_3", "cat_5": "cat_4"}
PLANS = {  # sharding.tables of each plan: t_cat_3 column-wise, or every table table-wise
    "mixed": {"t_cat_3": {"sharding_types": ["column_wise"], "min_partition": 8}},
    "table_wise": {},
}


def shared_config(plan: str):
    return tiny_config(
        **{
            "embeddings.num_embeddings": [40, 900, 80, 900, 4000, 4000],
            "embeddings.shared": SHARED,
            "optim.embedding_optimizer": "exact_adagrad",
            "sharding.tables": PLANS[plan],
        }
    )


def _rank_fn(rank, world, plan, folder):
    """Forward and K steps against the unsharded model; then a checkpoint of the trained model
    loaded into a fresh one (sharded, and unsharded on rank 0) and one more step on both."""
    from recsys.distributed.checkpoint import TrainState, load, load_model_unsharded, save
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    cfg = shared_config(plan)
    env = current(False)
    ref, ref_opts = unsharded_reference(cfg)
    built = build(cfg, env)
    copy_full_into_sharded(built.model.state_dict(), ref.state_dict())
    batches = global_batches(cfg, EQUIVALENCE_STEPS + 2)
    mine = [b[rank] for b in batches]
    b = cfg.train.batch_size
    out = {"plan": built.plan["tables"], "sharded": [], "reference": []}
    with torch.no_grad():
        _, local = built.model(mine[0])
        _, full = ref(concat_batches(batches[0]))
    out["forward"] = (local["logits"], full["logits"][rank * b : (rank + 1) * b])
    stepper = Stepper(built.model, built.optimizer, env.device, False)
    train_both(stepper, ref, ref_opts, mine, batches, rank, out)

    save(folder, built.model, built.optimizer, TrainState(step=EQUIVALENCE_STEPS), rank, world)
    fresh = build(shared_config(plan), env)
    load(folder, fresh.model, fresh.optimizer, rank)
    if rank == 0:  # DCP reassembles each table, a shared one once, for the export's loader
        plain, _ = unsharded_reference(cfg)
        load_model_unsharded(folder, plain)
        out["unsharded"] = (plain.state_dict(), ref.state_dict())
    nxt = iter([mine[EQUIVALENCE_STEPS], mine[EQUIVALENCE_STEPS + 1]])
    again = Stepper(fresh.model, fresh.optimizer, env.device, False)
    out["resumed"] = (
        again(nxt)["loss"].item(),
        stepper(iter([mine[EQUIVALENCE_STEPS]]))["loss"].item(),
    )
    with torch.no_grad():
        out["resumed_after"] = (
            fresh.model(mine[EQUIVALENCE_STEPS + 1])[1]["logits"],
            built.model(mine[EQUIVALENCE_STEPS + 1])[1]["logits"],
        )
    return out


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_sharded_shared_tables_match_unsharded_and_resume(tmp_path, plan):
    results = run_ranks(_rank_fn, plan, str(tmp_path / "ckpt"))
    tables = results[0]["plan"]
    kinds = {t: p["sharding_type"] for t, p in tables.items()}
    # one table per owner: the sharers' features read t_cat_3 and the QR tables of cat_4
    assert set(tables) == {"t_cat_0", "t_cat_2", "t_cat_3", "t_cat_4_q", "t_cat_4_r"}
    if plan == "mixed":
        assert kinds.pop("t_cat_3") == "column_wise" and sorted(tables["t_cat_3"]["ranks"]) == [
            0,
            1,
        ]
    assert set(kinds.values()) == {"table_wise"}
    assert {r for p in tables.values() for r in p["ranks"]} == {0, 1}
    assert_equal_to_unsharded(results, ATOL)
    assert results[0]["reference"][-1] < results[0]["reference"][0]
    # the checkpoint: the unsharded load holds the trained tables; a resumed step is the same step
    loaded, trained = results[0]["unsharded"]
    assert any(k.endswith("t_cat_3.weight") for k in loaded)
    assert not any(k.endswith(("t_cat_1.weight", "t_cat_5_q.weight")) for k in loaded)
    for name, tensor in trained.items():
        if "embedding_bags" in name:
            torch.testing.assert_close(loaded[name], tensor, atol=ATOL, rtol=0)
    for r in results:
        assert r["resumed"][0] == r["resumed"][1]
        torch.testing.assert_close(*r["resumed_after"], atol=0, rtol=0)
