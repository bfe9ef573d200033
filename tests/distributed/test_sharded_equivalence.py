"""DMP-sharded model on 2 gloo ranks == the unsharded model (forward and K training steps), trained
plainly and through TorchRec's ``TrainPipelineSparseDist`` (which must pipeline the embedding
collection: with QR on, its ids are split in the batch, so its input comes straight from it).

The unsharded reference sees the global batch (both ranks' rows) with an equivalent optimizer:
Adagrad on the tables (FBGEMM's EXACT_ADAGRAD on the sharded side) and on the dense part. Not
row-wise Adagrad: on a column-wise sharded table its per-row state is the mean over the shard's
columns only, so it is not the unsharded optimizer (measured: 0.03 apart after one step).
DDP averages dense gradients over ranks, and TorchRec divides the sharded tables' summed gradients
by the number of ranks (its ``gradient_division``, on by default), so both see the gradient of the
global batch's mean loss and the two trajectories must agree (an L2 weight decay on the tables
too: ``SparseRowwiseAdagradL2``). Tolerance: 1e-5 absolute on logits and losses.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import (
    EQUIVALENCE_STEPS,
    assert_equal_to_unsharded,
    check_against_unsharded,
    concat_batches,
    copy_full_into_sharded,
    equivalence_rank,
    global_batches,
    own_data_config,
    train_both,
    unsharded_reference,
)
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

ATOL = 1e-5
FP16_ATOL = 1e-4  # an fp16 rounding of a table value may flip between the two


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
def test_sharded_matches_unsharded_forward_and_training(pipeline):
    check_against_unsharded(run_ranks(equivalence_rank, pipeline), pipeline, atol=ATOL)


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
def test_sharded_matches_unsharded_without_dense_features(pipeline):
    """``model.num_dense=0``: no bottom MLP, ``dot`` over the embeddings alone, ``[B, 0]`` dense
    inputs; the same plan and the same forward and training as the unsharded model."""
    results = run_ranks(equivalence_rank, pipeline, False, False)
    assert results[0]["bottom_mlp"] == results[1]["bottom_mlp"] == []
    check_against_unsharded(results, pipeline, atol=ATOL)


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "ids-only"])
def test_finalmlp_sharded_matches_unsharded(dense):
    """FinalMLP over the same tables (table-wise, column-wise, QR): its two gated streams and
    the bilinear fusion of 2 heads train as the unsharded model does."""
    overrides = {"model.arch": "finalmlp", "model.finalmlp.heads": 2}
    results = run_ranks(equivalence_rank, False, False, dense, False, overrides)
    assert results[0]["bottom_mlp"] == []  # no DLRM part
    check_against_unsharded(results, False, atol=ATOL)


def test_sharded_matches_unsharded_with_layer_norm_and_embedding_weight_decay():
    """Layer norm in both MLPs and L2 weight decay on the (fp16) tables: the same forward and
    training as the unsharded model whose tables follow FBGEMM's row-wise Adagrad with the decay
    written out against the global batch's mean loss (``SparseRowwiseAdagradL2``, fp16 storage
    emulated). A decay weighed against twice or half that gradient is 1e-3 to 1e-2 away."""
    results = run_ranks(equivalence_rank, False, False, True, True)
    check_against_unsharded(results, False, atol=FP16_ATOL, column_wise=False)


def test_adam_tables_on_cpu_train_dense_as_the_unsharded_model():
    """``optim.embedding_optimizer: adam`` on CPU workers (FBGEMM's CPU kernels have no fused
    Adam): every table data-parallel with the dense kernel (the QR pair included), trained by
    torch's AdamW at ``optim.embedding_lr`` with decoupled decay; the same forward and training
    as the unsharded model with AdamW on its tables."""
    overrides = {"optim.embedding_optimizer": "adam", "sharding.tables": {},
                 "optim.embedding_weight_decay": 0.01,
                 "optim.embedding_weight_decay_mode": "decoupled"}  # fmt: skip
    results = run_ranks(equivalence_rank, False, False, True, False, overrides)
    plan = results[0]["plan"]
    assert {p["sharding_type"] for p in plan.values()} == {"data_parallel"}, plan
    assert {p["compute_kernel"] for p in plan.values()} == {"dense"}, plan
    assert_equal_to_unsharded(results, ATOL)
    assert results[0]["reference"][-1] < results[0]["reference"][0]


def _rank_fn_own_data(rank, world, folder, overrides):
    """Forward and K training steps on a user's data (multi-hot bags of real lengths, a
    weighted list or a sequence in a shared table, two tasks, a QR table, a column-wise table)
    against the unsharded model; ``overrides``: the model's (``model.tasks``: a shared bottom,
    or experts; the sequence's pooling)."""
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    cfg = own_data_config(folder).with_overrides(overrides)
    env = current(False)
    ref, ref_opts = unsharded_reference(cfg)
    built = build(cfg, env)
    copy_full_into_sharded(built.model.state_dict(), ref.state_dict())
    batches = global_batches(cfg, EQUIVALENCE_STEPS + 1)
    mine = [b[rank] for b in batches]
    b = cfg.train.batch_size
    out = {"plan": built.plan["tables"], "sharded": [], "reference": [], "lengths": set()}
    for batch in mine:
        out["lengths"] |= set(batch.sparse_features.lengths().tolist())
    with torch.no_grad():
        _, local = built.model(mine[0])
        _, full = ref(concat_batches(batches[0]))
    out["forward"] = (local["logits"], full["logits"][rank * b : (rank + 1) * b])
    stepper = Stepper(built.model, built.optimizer, env.device, False)
    train_both(stepper, ref, ref_opts, mine, batches, rank, out)
    return out


@pytest.mark.parametrize("tasks", ["shared", "ple"])
def test_sharded_matches_unsharded_on_multi_hot_own_data(demo_prepared, tasks):
    """Two tasks over a shared bottom (DLRM's top MLP) or PLE's experts (2 levels), towers and
    gates, as DDP trains them on 2 ranks."""
    overrides = {"model.tasks": tasks, "model.experts.levels": 2}
    results = run_ranks(_rank_fn_own_data, demo_prepared, overrides)
    cfg = own_data_config(demo_prepared)
    plan = results[0]["plan"]
    largest = cfg.embeddings.names()[
        cfg.embeddings.num_embeddings.index(max(cfg.embeddings.num_embeddings))
    ]
    assert {f"t_{largest}_q", f"t_{largest}_r"} <= set(plan)  # QR on the largest table
    assert plan["t_tags"]["sharding_type"] == "column_wise" and len(plan["t_tags"]["ranks"]) == 2
    assert {r for p in plan.values() for r in p["ranks"]} == {0, 1}  # tables on both ranks
    assert cfg.embeddings.weighted == ["history"] and len(cfg.loss.tasks) == 2
    assert len(results[0]["lengths"] | results[1]["lengths"]) > 5  # bags of many lengths, 0 too
    assert 0 in results[0]["lengths"] | results[1]["lengths"]
    assert results[0]["forward"][0].shape == (32, 2)  # one logit per task
    assert_equal_to_unsharded(results, ATOL)


@pytest.mark.parametrize(("arch", "pooling"), [("dlrm", "attention"), ("finalmlp", "transformer")])
def test_a_sequence_sharded_matches_unsharded(sequence_prepared, arch, pooling):
    """The demo's history as a sequence of 8 positions in the item table (QR-split: every
    position's ids too, table-wise), pooled by DIN's target attention (DLRM) or BST's
    transformer (FinalMLP), as DDP trains the pooling layers on 2 ranks."""
    overrides = {"model.arch": arch, "model.sequence.pooling": pooling,
                 "model.sequence.heads": 2, "embeddings.qr.threshold": 300}  # fmt: skip
    results = run_ranks(_rank_fn_own_data, sequence_prepared, overrides)
    cfg = own_data_config(sequence_prepared).with_overrides(overrides)
    assert cfg.embeddings.sequences == {"history": 8}
    assert cfg.embeddings.sequence_targets == {"history": "item_id"}
    assert "history@7" in cfg.embeddings.layout().split()  # item_id's table is QR-split
    assert {"t_item_id_q", "t_item_id_r"} <= set(results[0]["plan"])
    assert_equal_to_unsharded(results, ATOL)
