"""The initial tables do not depend on the plan or the number of ranks: table-wise, column-wise
and data-parallel tables on 2 ranks, and 1 rank, all start as the unsharded model's, and no two
tables (nor two shards) start alike. (TorchRec runs a table's ``init_fn`` on each local shard
without its offsets: with one seed, shards repeated the table's first rows and columns.)"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

PLANS = {
    "table_wise": {"default": {"sharding_types": ["table_wise"]}, "tables": {}},
    "mixed": {
        "default": {"sharding_types": ["table_wise"]},
        "tables": {
            "t_cat_3": {"sharding_types": ["column_wise"], "min_partition": 4},
            "t_cat_4_q": {"sharding_types": ["column_wise"], "min_partition": 8},
            "t_cat_0": {"sharding_types": ["data_parallel"], "compute_kernels": ["dense"]},
        },
    },
}


def cfg(plan):
    return tiny_config(**{"sharding.default": PLANS[plan]["default"],
                          "sharding.tables": PLANS[plan]["tables"]})  # fmt: skip


def _save_initial(rank, world, plan, folder):
    from recsys.distributed import checkpoint
    from recsys.distributed.checkpoint import TrainState
    from recsys.distributed.env import current
    from recsys.train.build import build

    env = current(False)
    built = build(cfg(plan), env)
    checkpoint.save(folder, built.model, built.optimizer, TrainState(), rank, world)
    return {t: p["sharding_type"] for t, p in built.plan["tables"].items()}


def _tables(folder, c):
    from recsys.distributed.checkpoint import load_model_unsharded
    from recsys.models import DLRM, ModelAndLoss

    model = load_model_unsharded(folder, ModelAndLoss(DLRM(c.model, c.embeddings), c.loss))
    return {k: v for k, v in model.state_dict().items() if "embedding_bags" in k}


def test_initial_tables_are_the_same_whatever_the_plan_and_world_size(tmp_path):
    from recsys.models import DLRM, ModelAndLoss
    from recsys.models.dlrm import materialize

    c = cfg("table_wise")
    torch.manual_seed(0)
    unsharded = materialize(ModelAndLoss(DLRM(c.model, c.embeddings, init_seed=c.train.seed,
                                              embedding_device="meta"), c.loss))  # fmt: skip
    reference = {k: v for k, v in unsharded.state_dict().items() if "embedding_bags" in k}
    runs = [("table_wise", 2), ("mixed", 2), ("mixed", 1)]
    for plan, world in runs:
        folder = str(tmp_path / f"{plan}{world}")
        kinds = run_ranks(_save_initial, plan, folder, world_size=world)[0]
        if plan == "mixed" and world == 2:
            assert kinds["t_cat_3"] == "column_wise" and kinds["t_cat_0"] == "data_parallel"
        got = _tables(folder, c)
        for name, tensor in reference.items():
            torch.testing.assert_close(got[name], tensor, atol=0, rtol=0, msg=f"{plan}/{world}")
    # every table its own values; a column-wise table's halves differ too
    flat = [t.flatten()[:32] for t in reference.values()]
    assert len({tuple(f.tolist()) for f in flat}) == len(flat)
    t3 = reference["model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_3.weight"]
    assert not torch.equal(t3[:, :8], t3[:, 8:])
    bound = (1.0 / t3.shape[0]) ** 0.5
    assert t3.abs().max() <= bound and t3.std() > bound / 3  # U(-b, b): std b / sqrt(3)
