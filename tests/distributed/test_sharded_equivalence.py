"""DMP-sharded model on 2 gloo ranks == the unsharded model (forward and K training steps), trained
plainly and through TorchRec's ``TrainPipelineSparseDist`` (which must pipeline the embedding
collection: with QR on, its ids are split in the batch, so its input comes straight from it).

The unsharded reference sees the global batch (both ranks' rows) with an equivalent optimizer:
Adagrad on the tables (FBGEMM's EXACT_ADAGRAD on the sharded side) and on the dense part. Not
row-wise Adagrad: on a column-wise sharded table its per-row state is the mean over the shard's
columns only, so it is not the unsharded optimizer (measured: 0.03 apart after one step).
DDP averages dense gradients over ranks while sharded tables sum them; Adagrad is invariant to that
constant factor (up to eps), so the two trajectories must agree. Tolerance: 1e-5 absolute on logits
and losses.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import copy_full_into_sharded, own_data_config, tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

K = 5
ATOL = 1e-5


def _global_batches(cfg, steps):
    """The batches rank 0 and rank 1 see at each step, concatenated = the global batch."""
    from recsys.data import TrainStream, load_splits

    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    streams = [
        TrainStream(
            splits.train,
            rank=r,
            world_size=2,
            batch_size=cfg.train.batch_size,
            layout=cfg.embeddings.layout(),
            seed=cfg.train.seed,
            shuffle=True,
        )
        for r in range(2)
    ]
    return [[next(s) for s in streams] for _ in range(steps)]


def _concat(parts):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjts = [p.sparse_features for p in parts]
    keys = kjts[0].keys()
    values, lengths = [], []
    for k in keys:
        for kjt in kjts:
            values.append(kjt[k].values())
    for i, _ in enumerate(keys):
        for kjt in kjts:
            lengths.append(kjt.lengths().view(len(keys), -1)[i])
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        lengths=torch.cat(lengths),
        stride=sum(k.stride() for k in kjts),
    )
    return Batch(
        torch.cat([p.dense_features for p in parts]), kjt, torch.cat([p.labels for p in parts])
    )


def _reference(cfg):
    from recsys.models import DLRM, ModelAndLoss

    torch.manual_seed(cfg.train.seed)
    model = ModelAndLoss(DLRM(cfg.model, cfg.embeddings, len(cfg.loss.tasks)), cfg.loss)
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    dense = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    opts = [
        torch.optim.Adagrad(tables, lr=cfg.optim.embedding_lr, eps=cfg.optim.eps),
        torch.optim.Adagrad(dense, lr=cfg.optim.lr, eps=cfg.optim.eps),
    ]
    return model, opts


def _without_dense(batch):
    """``batch`` with its dense features dropped, ``[B, 0]``: what the loader gives for data
    without dense columns (the synthetic data always has some)."""
    from torchrec.datasets.utils import Batch

    return Batch(batch.dense_features[:, :0], batch.sparse_features, batch.labels)


def _rank_fn(rank, world, pipeline, use_gpu=False, dense=True):
    """One rank of the comparison; ``use_gpu``: NCCL, ``cuda:rank``, and the smallest table
    row-wise (CUDA-only sharding) beside the table-wise and column-wise ones; ``dense=False``: a
    model without dense features (``model.num_dense=0``, no bottom MLP) fed ``[B, 0]`` ones."""
    from recsys.distributed.debug import describe, gather_table
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    data_cfg = cfg = tiny_config(**{"optim.embedding_optimizer": "exact_adagrad"})
    if not dense:
        cfg = cfg.with_overrides({"model.num_dense": 0})
    if use_gpu:
        row_wise = {"sharding_types": ["row_wise"]}
        cfg = cfg.with_overrides({"sharding.tables": {**_tables(cfg), "t_cat_0": row_wise}})
    env = current(use_gpu=use_gpu)
    ref, ref_opts = _reference(cfg)
    built = build(cfg, env)
    dmp, optimizer, summary = built.model, built.optimizer, built.plan
    copy_full_into_sharded(dmp.state_dict(), ref.state_dict())
    batches = _global_batches(data_cfg, K + 3)  # the pipeline reads two batches ahead
    if not dense:
        batches = [[_without_dense(b) for b in step] for step in batches]
    mine = [b[rank].to(env.device) for b in batches]

    out = {"plan": summary["tables"], "sharded": [], "reference": []}
    out["bottom_mlp"] = [n for n in dmp.state_dict() if "dense_arch" in n]
    # the debug helper reassembles a column-wise table on rank 0
    full = gather_table(dmp, "t_cat_3")
    name = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_3.weight"
    out["gathered"] = (full, ref.state_dict()[name].clone()) if rank == 0 else None
    out["described"] = describe(dmp)
    with torch.no_grad():
        _, local = dmp(mine[0])
        _, full = ref(_concat(batches[0]))
    out["forward"] = (local["logits"].cpu(), full["logits"][rank * 32 : (rank + 1) * 32])
    stepper = Stepper(dmp, optimizer, env.device, pipeline)
    _train_both(stepper, ref, ref_opts, mine, batches, rank, out)
    if pipeline:
        out["pipelined"] = [type(m).__name__ for m in stepper.pipeline._pipelined_modules]
    return out


def _train_both(stepper, ref, ref_opts, mine, batches, rank, out):
    """K steps of the sharded model (this rank's batches) and of the reference (the global
    batches): both losses per step into ``out``, then both forwards on the next batch."""
    stream = iter(mine)
    for step in range(K):
        out["sharded"].append(stepper(stream)["loss"].item())
        for o in ref_opts:
            o.zero_grad()
        ref_loss, _ = ref(_concat(batches[step]))
        ref_loss.backward()
        for o in ref_opts:
            o.step()
        out["reference"].append(ref_loss.item())
    b = mine[K].dense_features.shape[0]
    with torch.no_grad(), stepper.plain_model() as plain:
        _, local = plain(mine[K])
        _, full = ref(_concat(batches[K]))
    out["after"] = (local["logits"].cpu(), full["logits"][rank * b : (rank + 1) * b])


def _tables(cfg):
    return {k: {"sharding_types": v.sharding_types, "min_partition": v.min_partition}
            for k, v in cfg.sharding.tables.items()}  # fmt: skip


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
def test_sharded_matches_unsharded_forward_and_training(pipeline):
    check_against_unsharded(run_ranks(_rank_fn, pipeline), pipeline, atol=ATOL)


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
def test_sharded_matches_unsharded_without_dense_features(pipeline):
    """``model.num_dense=0``: no bottom MLP, ``dot`` over the embeddings alone, ``[B, 0]`` dense
    inputs; the same plan and the same forward and training as the unsharded model."""
    results = run_ranks(_rank_fn, pipeline, False, False)
    assert results[0]["bottom_mlp"] == results[1]["bottom_mlp"] == []
    check_against_unsharded(results, pipeline, atol=ATOL)


def check_against_unsharded(results, pipeline, atol, row_wise=False):
    """The assertions, shared by the 2-GPU NCCL run (``tests/gpu``)."""
    if pipeline:  # the collection (QR tables included) is pipelined: input dist overlaps compute
        assert results[0]["pipelined"] == ["ShardedEmbeddingBagCollection"], results[0]
    plan = results[0]["plan"]
    kinds = {t: p["sharding_type"] for t, p in plan.items()}
    tw_ranks = {p["ranks"][0] for p in plan.values() if p["sharding_type"] == "table_wise"}
    assert tw_ranks == {0, 1}, plan
    if row_wise:
        assert kinds["t_cat_0"] == "row_wise" and sorted(plan["t_cat_0"]["ranks"]) == [0, 1]
    assert kinds["t_cat_3"] == "column_wise" and sorted(plan["t_cat_3"]["ranks"]) == [0, 1], plan
    assert {"t_cat_4_q", "t_cat_4_r"} <= set(plan)  # the QR tables are sharded like any other
    torch.testing.assert_close(*results[0]["gathered"], atol=0, rtol=0)
    held = [d for r in results for d in r["described"] if d["name"].endswith("t_cat_3.weight")]
    assert sorted(s["offsets"][1] for d in held for s in d["local_shards"]) == [0, 8]
    for r in results:
        torch.testing.assert_close(*r["forward"], atol=atol, rtol=0)
        torch.testing.assert_close(*r["after"], atol=atol, rtol=0)
    # the global loss is the mean of the two ranks' local losses
    for step in range(K):
        sharded = (results[0]["sharded"][step] + results[1]["sharded"][step]) / 2
        assert abs(sharded - results[0]["reference"][step]) < atol
    assert results[0]["reference"][-1] < results[0]["reference"][0]


def _rank_fn_own_data(rank, world, folder):
    """Forward and K training steps on a user's data (multi-hot bags of real lengths, sum and
    mean pooling, two tasks, a QR table, a column-wise table) against the unsharded model."""
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    cfg = own_data_config(folder)
    env = current(False)
    ref, ref_opts = _reference(cfg)
    built = build(cfg, env)
    copy_full_into_sharded(built.model.state_dict(), ref.state_dict())
    batches = _global_batches(cfg, K + 1)
    mine = [b[rank] for b in batches]
    b = cfg.train.batch_size
    out = {"plan": built.plan["tables"], "sharded": [], "reference": [], "lengths": set()}
    for batch in mine:
        out["lengths"] |= set(batch.sparse_features.lengths().tolist())
    with torch.no_grad():
        _, local = built.model(mine[0])
        _, full = ref(_concat(batches[0]))
    out["forward"] = (local["logits"], full["logits"][rank * b : (rank + 1) * b])
    stepper = Stepper(built.model, built.optimizer, env.device, False)
    _train_both(stepper, ref, ref_opts, mine, batches, rank, out)
    return out


def test_sharded_matches_unsharded_on_multi_hot_own_data(demo_prepared):
    results = run_ranks(_rank_fn_own_data, demo_prepared)
    cfg = own_data_config(demo_prepared)
    plan = results[0]["plan"]
    largest = cfg.embeddings.names()[
        cfg.embeddings.num_embeddings.index(max(cfg.embeddings.num_embeddings))
    ]
    assert {f"t_{largest}_q", f"t_{largest}_r"} <= set(plan)  # QR on the largest table
    assert plan["t_tags"]["sharding_type"] == "column_wise" and len(plan["t_tags"]["ranks"]) == 2
    assert {r for p in plan.values() for r in p["ranks"]} == {0, 1}  # tables on both ranks
    assert cfg.embeddings.pooling_of("tags") == "mean" and len(cfg.loss.tasks) == 2
    assert len(results[0]["lengths"] | results[1]["lengths"]) > 5  # bags of many lengths, 0 too
    assert 0 in results[0]["lengths"] | results[1]["lengths"]
    for r in results:
        torch.testing.assert_close(*r["forward"], atol=ATOL, rtol=0)
        torch.testing.assert_close(*r["after"], atol=ATOL, rtol=0)
        assert r["forward"][0].shape == (32, 2)  # one logit per task
    for step in range(K):
        sharded = (results[0]["sharded"][step] + results[1]["sharded"][step]) / 2
        assert abs(sharded - results[0]["reference"][step]) < ATOL
