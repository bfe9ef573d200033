"""DLRM builds on meta, materialises, and runs forward/backward for every op x QR x mixed dims."""

from __future__ import annotations

import itertools

import pytest
import torch
from torchrec.datasets.utils import Batch

from recsys.config import ConfigError, EmbeddingConfig, LossConfig, ModelConfig, QRConfig
from recsys.models import DLRM, ModelAndLoss, materialize
from recsys.models.dlrm import WithRawIds
from tests.conftest import make_kjt

ROWS = [50, 300, 20, 1000]
GRID = list(itertools.product(["dot", "cat", "sum", "dcn"], [False, True], [False, True]))


def tiny(op: str, qr: bool, mixed: bool) -> tuple[ModelConfig, EmbeddingConfig]:
    emb = EmbeddingConfig(
        num_embeddings=ROWS,
        dim=8,
        md_alpha=0.5 if mixed else None,
        qr=QRConfig(threshold=100, collisions=4) if qr else QRConfig(),
    )
    return ModelConfig(num_dense=3, bottom_mlp=[8], top_mlp=[8], interaction=op), emb


@pytest.mark.parametrize(("op", "qr", "mixed"), GRID)
def test_forward_backward_grid(op, qr, mixed):
    model_cfg, emb = tiny(op, qr, mixed)
    torch.manual_seed(0)
    model = materialize(DLRM(model_cfg, emb, embedding_device="meta"))
    assert not any(p.is_meta for p in model.parameters())
    batch = Batch(
        dense_features=torch.randn(6, 3),
        sparse_features=make_kjt(emb.names(), ROWS, batch=6, hot=2),
        labels=torch.randint(0, 2, (6,)).float(),
    )
    loss, out = ModelAndLoss(WithRawIds(model, emb.layout().qr), LossConfig())(batch)
    assert out["logits"].shape == (6, 1) and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    table = next(iter(model.sparse_arch.embedding_bag_collection.embedding_bags.values()))
    assert table.weight.grad is not None and table.weight.grad.abs().sum() > 0


def test_top_mlp_width_follows_op():
    for op, expected in [("dot", 8 + 10), ("cat", 8 * 5), ("sum", 16), ("dcn", 8 * 5)]:
        model_cfg, emb = tiny(op, qr=False, mixed=False)
        model = DLRM(model_cfg, emb)
        first = model.over_arch[0]._mlp[0]._linear  # torchrec MLP -> Perceptron -> Linear
        assert first.in_features == expected, op


def test_cat_uses_raw_mixed_dims_without_projection():
    model_cfg, emb = tiny("cat", qr=False, mixed=True)
    model = DLRM(model_cfg, emb)
    assert len(model.sparse_arch.projections) == 0
    assert model.interaction.out_dim == 8 + sum(emb.table_dims())


def test_multitask_logits():
    model_cfg, emb = tiny("dot", qr=False, mixed=False)
    model = DLRM(model_cfg, emb, num_tasks=2)
    out = model(torch.randn(4, 3), make_kjt(emb.names(), ROWS, batch=4))
    assert out.shape == (4, 2)


def test_unknown_op_is_a_config_error():
    with pytest.raises(ConfigError, match="model.interaction='dott'"):
        ModelConfig(interaction="dott")  # type: ignore[arg-type]
