"""Embedding precision is set where the tables are defined: FP16 tables train and keep their
updates."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed


def _train_tables(rank, world, dtype, planner_free=False):
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from recsys.data.input.loader import TrainStream, load_splits
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    cfg = tiny_config(**{"embeddings.dtype": dtype})
    if planner_free:  # untuned, the planner would make the small tables data-parallel
        cfg = cfg.with_overrides({"sharding.default": {}, "sharding.tables": {}})
    built = build(cfg, current(False))
    model, optimizer, summary = built.model, built.optimizer, built.plan

    def tables():
        return {
            k: [s.tensor.clone() for s in v.local_shards()]
            for k, v in model.state_dict().items()
            if isinstance(v, ShardedTensor)
        }

    before = tables()
    train = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings).train
    stream = TrainStream(
        train,
        rank=rank,
        world_size=world,
        batch_size=64,
        layout=cfg.embeddings.layout(),
        seed=0,
        shuffle=True,
    )
    stepper = Stepper(model, optimizer, torch.device("cpu"), pipeline=False)
    losses = [float(stepper(stream)["loss"]) for _ in range(60)]
    after = tables()
    changed = {
        k: any(not torch.equal(a, b) for a, b in zip(before[k], after[k], strict=True))
        for k in before
        if before[k]
    }
    dtypes = {str(s.dtype) for v in after.values() for s in v}
    return losses, changed, dtypes, summary["embedding_bytes_per_rank"]


@pytest.mark.parametrize(("world", "planner_free"), [(2, False), (1, True)])
def test_fp16_tables_train_and_keep_updates(world, planner_free):
    dtype, torch_dtype = "fp16", "float16"
    results = run_ranks(_train_tables, dtype, planner_free, world_size=world)
    losses, changed, dtypes, per_rank = results[0]
    assert dtypes == {f"torch.{torch_dtype}"}
    assert changed and all(changed.values()), changed  # the fused optimizer updated every table
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10  # and the loss went down
    from recsys.models import embedding_report

    fp16 = embedding_report(tiny_config(**{"embeddings.dtype": dtype}).embeddings)
    fp32 = embedding_report(tiny_config().embeddings)
    assert fp16.bytes * 2 == fp32.bytes
    assert sum(per_rank.values()) == fp16.bytes


def _build_on_cpu(rank, world, overrides):
    from recsys.configlib import ConfigError
    from recsys.distributed.env import current
    from recsys.train.build import build

    try:
        build(tiny_config(**overrides), current(False))
    except ConfigError as e:
        return str(e)
    return "built"


def test_bf16_on_cpu_is_refused_clearly():
    (message,) = run_ranks(_build_on_cpu, {"embeddings.dtype": "bf16"}, world_size=1)
    assert "embeddings.dtype='bf16'" in message and "use fp16 on CPU" in message


def test_embedding_adam_on_cpu_with_a_table_pinned_off_data_parallel_is_refused_clearly():
    """FBGEMM's CPU kernels have no fused Adam: on CPU the tables train dense, data-parallel
    (``preflight.dense_adam``), which a table pinned to column-wise forbids; the refusal names
    the pin, where it once failed deep in TorchRec's planner."""
    (message,) = run_ranks(_build_on_cpu, {"optim.embedding_optimizer": "adam"}, world_size=1)
    assert message.startswith("sharding.tables.t_cat_3.sharding_types=['column_wise']"), message
    assert "optim.embedding_optimizer='adam' on CPU workers" in message
    assert "allow data_parallel, or use GPU workers" in message


def test_embedding_adam_on_cpu_builds_with_dense_tables():
    (message,) = run_ranks(
        _build_on_cpu,
        {"optim.embedding_optimizer": "adam", "sharding.tables": {}},
        world_size=1,
    )
    assert message == "built"


def test_embedding_weight_decay_on_fp32_tables_on_cpu_is_refused_clearly():
    """FBGEMM's CPU kernel for fp32 tables would drop the decay silently; fp16 tables keep it."""
    decay = {"optim.embedding_weight_decay": 0.01}
    (message,) = run_ranks(_build_on_cpu, decay, world_size=1)
    assert "optim.embedding_weight_decay=0.01" in message and "embeddings.dtype='fp16'" in message
    (built,) = run_ranks(_build_on_cpu, {**decay, "embeddings.dtype": "fp16"}, world_size=1)
    assert built == "built"
