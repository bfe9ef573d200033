"""DLRM builds on meta, materialises, and runs forward/backward for every op x QR x mixed dims."""

from __future__ import annotations

import itertools

import pytest
import torch
from torchrec.datasets.utils import Batch

from recsys.config import (
    INTERACTIONS,
    ConfigError,
    EmbeddingConfig,
    LossConfig,
    ModelConfig,
    QRConfig,
)
from recsys.models import DLRM, ModelAndLoss, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.embeddings import qr_split_kjt
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close

ROWS = [50, 300, 20, 1000]
GRID = list(itertools.product(INTERACTIONS, [False, True], [False, True]))  # every op


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
        first = model.over_arch[0][0].linear  # MLP -> its first layer -> Linear
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


# No dense features (``model.num_dense == 0``): no bottom MLP, the interaction over the embeddings


def no_dense(op: str, itself: bool = False) -> tuple[ModelConfig, EmbeddingConfig]:
    """``tiny`` with QR and mixed dims (projected for dot/sum/dcn) and ``num_dense=0``."""
    _, emb = tiny(op, qr=True, mixed=True)
    model_cfg = ModelConfig(
        num_dense=0, bottom_mlp=[8], top_mlp=[8], interaction=op, interaction_itself=itself
    )
    return model_cfg, emb


def by_hand(op: str, pooled: list[torch.Tensor], model: DLRM) -> torch.Tensor:
    """The interaction of the pooled embeddings ``F x [B, d_f]`` alone -> ``[B, out_dim]``."""
    if op == "cat":
        return torch.cat(pooled, dim=1)
    if op == "sum":
        return sum(pooled[1:], pooled[0])
    if op == "dot":
        lower = [(pooled[i] * pooled[j]).sum(1) for i in range(len(pooled)) for j in range(i)]
        return torch.stack(lower, dim=1)  # F(F-1)/2 pairs, no dense vector concatenated
    net = model.interaction.crossnet  # dcn: x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l
    x0 = x = torch.cat(pooled, dim=1)
    for w, v, b in zip(net.W_kernels, net.V_kernels, net.bias, strict=True):
        x = x0 * (x @ v.T @ w.T + b) + x
    return x


@pytest.mark.parametrize("op", ["dot", "cat", "sum", "dcn"])
def test_without_dense_the_interaction_is_over_the_embeddings_alone(op):
    model_cfg, emb = no_dense(op)
    torch.manual_seed(0)
    model = materialize(DLRM(model_cfg, emb, embedding_device="meta"))
    assert model.dense_arch is None
    assert not any("dense_arch" in n for n, _ in model.named_parameters())
    kjt = make_kjt(emb.names(), ROWS, batch=6, hot=2, seed=4)
    got = WithRawIds(model, emb.layout().qr)(torch.empty(6, 0), kjt)  # dense: [B, 0]
    with torch.no_grad():
        pooled = model.sparse_arch(qr_split_kjt(kjt, emb.layout().qr))  # F x [B, d_f]
        want = model.over_arch(by_hand(op, pooled, model))
    assert got.shape == (6, 1)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("op", ["dot", "cat", "sum", "dcn"])
def test_without_dense_forward_backward(op):
    model_cfg, emb = no_dense(op)
    torch.manual_seed(0)
    model = materialize(DLRM(model_cfg, emb, embedding_device="meta"))
    batch = Batch(
        dense_features=torch.empty(6, 0),
        sparse_features=make_kjt(emb.names(), ROWS, batch=6, hot=2),
        labels=torch.randint(0, 2, (6,)).float(),
    )
    loss, out = ModelAndLoss(WithRawIds(model, emb.layout().qr), LossConfig())(batch)
    assert out["logits"].shape == (6, 1) and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_without_dense_top_mlp_width_follows_op():
    f, d = len(ROWS), 8
    widths = {"dot": f * (f - 1) // 2, "cat": None, "sum": d, "dcn": d * f}
    for op, expected in widths.items():
        model_cfg, emb = no_dense(op)
        model = DLRM(model_cfg, emb)
        if expected is None:  # cat: the raw mixed dims, not projected
            expected = sum(emb.table_dims())
        assert model.over_arch[0][0].linear.in_features == expected, op
    model_cfg, emb = no_dense("dot", itself=True)
    assert DLRM(model_cfg, emb).interaction.out_dim == f * (f + 1) // 2


def test_num_dense_zero_is_allowed_negative_is_not():
    assert ModelConfig(num_dense=0).num_dense == 0
    with pytest.raises(ConfigError, match="model.num_dense=-1"):
        ModelConfig(num_dense=-1)


@pytest.mark.parametrize("op", ["dot", "cat", "sum", "dcn"])
def test_without_dense_exports_as_int8_torchscript(op):
    """The export's own path (quantize the tables, shard for inference, trace, script) with a
    ``[B, 0]`` dense input."""
    model_cfg, emb = no_dense(op)
    torch.manual_seed(0)
    model = WithRawIds(materialize(DLRM(model_cfg, emb, embedding_device="meta")), emb.layout().qr)
    dense, kjt = torch.empty(64, 0), make_kjt(emb.names(), ROWS, batch=64, seed=3)
    assert_int8_export_close(model.eval(), dense, kjt)
