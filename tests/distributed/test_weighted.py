"""Weighted lists (``embeddings.weighted``) sharded on 2 gloo ranks equal the unsharded model:
forward and K training steps (plainly, and through TorchRec's train pipeline), table-wise and with
a weighted feature's table column-wise.

The config is ``tiny_config``'s with six multi-hot features: ``cat_2`` weighted with its own table
(table-wise), ``cat_3`` weighted and read by the unweighted ``cat_1`` (column-wise in the ``mixed``
plan), ``cat_5`` weighted and reading ``cat_4``'s QR-split table (table-wise). The batches are
built by ``recsys.data.input.loader.to_batch`` from ``RaggedColumns`` with weights (bags of 0 to 3
ids, weights in ``[0.2, 2)``); the reference is the one of ``test_sharded_equivalence.py`` (Adagrad
against FBGEMM's ``exact_adagrad``, the global batch), at its tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.distributed.common import (
    EQUIVALENCE_STEPS,
    assert_equal_to_unsharded,
    copy_full_into_sharded,
    tiny_config,
    unsharded_reference,
)
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

ATOL = 1e-5
SHARED = {"cat_1": "cat_3", "cat_5": "cat_4"}
WEIGHTED = ["cat_2", "cat_3", "cat_5"]
PLANS = {  # sharding.tables of each plan: t_cat_3 column-wise, or every table table-wise
    "mixed": {"t_cat_3": {"sharding_types": ["column_wise"], "min_partition": 8}},
    "table_wise": {},
}


def weighted_config(plan: str):
    return tiny_config(
        **{
            "embeddings.num_embeddings": [40, 900, 80, 900, 4000, 4000],
            "embeddings.shared": SHARED,
            "embeddings.weighted": WEIGHTED,
            "data.synthetic.multi_hot": 3,
            "optim.embedding_optimizer": "exact_adagrad",
            "sharding.tables": PLANS[plan],
        }
    )


def weighted_rows(cfg, seed: int = 0):
    """The training split as ``RaggedColumns``: each bag its first 0..3 ids, the weighted
    features' ids weighted in ``[0.2, 2)`` (the same on every rank)."""
    from recsys.data.columns import RaggedColumns
    from recsys.data.input.loader import load_splits

    train = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).train
    cols = train.read(0, len(train))
    rng = np.random.default_rng(seed)
    n, f, h = cols.sparse.shape
    lengths = rng.integers(0, h + 1, (n, f))
    values = tuple(
        np.concatenate([cols.sparse[i, k, : lengths[i, k]] for i in range(n)]).astype(np.int64)
        for k in range(f)
    )
    names = cfg.embeddings.names()
    weights = tuple(
        rng.uniform(0.2, 2.0, len(v)).astype(np.float32) if names[k] in WEIGHTED else None
        for k, v in enumerate(values)
    )
    return RaggedColumns(cols.dense, values, lengths, cols.labels, "weighted", weights)


def weighted_batches(cfg, steps):
    """``[(rank 0's batch, rank 1's batch, the global batch)]`` per step: a shuffle's rows, the
    global batch rank 0's rows then rank 1's."""
    from recsys.data.input.loader import to_batch

    rows, layout, b = weighted_rows(cfg), cfg.embeddings.layout(), cfg.train.batch_size
    order = np.random.default_rng(cfg.train.seed).permutation(len(rows))
    out = []
    for s in range(steps):
        idx = order[s * 2 * b : (s + 1) * 2 * b]
        parts = [to_batch(rows.take(idx[r * b : (r + 1) * b]), layout) for r in range(2)]
        out.append((*parts, to_batch(rows.take(idx), layout)))
    return out


def ones_like_weights(batch):
    """``batch`` with every weight 1 (the same ids)."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    ones = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=kjt.values(),
        lengths=kjt.lengths(),
        weights=torch.ones_like(kjt.weights()),
        stride=kjt.stride(),
    )
    return Batch(batch.dense_features, ones, batch.labels)


def _rank_fn(rank, world, plan, pipeline):
    """Forward, then K steps of the sharded model (this rank's batches) and of the reference (the
    global batches): the losses, and both forwards on the next batch."""
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    cfg = weighted_config(plan)
    env = current(False)
    ref, ref_opts = unsharded_reference(cfg)
    built = build(cfg, env)
    copy_full_into_sharded(built.model.state_dict(), ref.state_dict())
    batches = weighted_batches(cfg, EQUIVALENCE_STEPS + 3)  # the pipeline reads two ahead
    mine = [step[rank] for step in batches]
    assert mine[0].sparse_features.weights_or_none() is not None
    b = cfg.train.batch_size
    out = {"plan": built.plan["tables"], "sharded": [], "reference": []}
    with torch.no_grad():
        _, local = built.model(mine[0])
        _, ones = built.model(ones_like_weights(mine[0]))
        _, full = ref(batches[0][2])
    out["forward"] = (local["logits"], full["logits"][rank * b : (rank + 1) * b])
    out["ones"] = ones["logits"]
    stepper = Stepper(built.model, built.optimizer, env.device, pipeline)
    stream = iter(mine)
    for step in range(EQUIVALENCE_STEPS):
        out["sharded"].append(stepper(stream)["loss"].item())
        ref.zero_grad()
        ref_loss, _ = ref(batches[step][2])
        ref_loss.backward()
        for o in ref_opts:
            o.step()
        out["reference"].append(ref_loss.item())
    with torch.no_grad(), stepper.plain_model() as plain:
        _, local = plain(mine[EQUIVALENCE_STEPS])
        _, full = ref(batches[EQUIVALENCE_STEPS][2])
    out["after"] = (local["logits"], full["logits"][rank * b : (rank + 1) * b])
    if pipeline:
        out["pipelined"] = [type(m).__name__ for m in stepper.pipeline._pipelined_modules]
    return out


@pytest.mark.parametrize(
    ("plan", "pipeline"),
    [("mixed", False), ("table_wise", False), ("mixed", True)],
    ids=["mixed", "table_wise", "mixed-pipeline"],
)
def test_sharded_weighted_lists_match_unsharded(plan, pipeline):
    results = run_ranks(_rank_fn, plan, pipeline)
    tables = results[0]["plan"]
    kinds = {t: p["sharding_type"] for t, p in tables.items()}
    assert set(tables) == {"t_cat_0", "t_cat_2", "t_cat_3", "t_cat_4_q", "t_cat_4_r"}
    if plan == "mixed":
        assert kinds.pop("t_cat_3") == "column_wise"
        assert sorted(tables["t_cat_3"]["ranks"]) == [0, 1]
    assert set(kinds.values()) == {"table_wise"}
    assert {r for p in tables.values() for r in p["ranks"]} == {0, 1}
    if pipeline:  # the weighted collection is pipelined: its input comes straight from the batch
        assert results[0]["pipelined"] == ["ShardedEmbeddingBagCollection"]
    for r in results:  # the sharded collection takes the weights: weights of 1 score otherwise
        assert (r["forward"][0] - r["ones"]).abs().max() > 1e-3
    assert_equal_to_unsharded(results, ATOL)
    assert results[0]["reference"][-1] < results[0]["reference"][0]
