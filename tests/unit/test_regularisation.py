"""Regularisation: the MLP's normalisation and dropout (``model.norm``, ``model.dropout``) and the
tables' weight decay through FBGEMM's fused optimizer (``optim.embedding_weight_decay``, its
mode), checked against independent references: TorchRec's ``MLP``, the statistics a norm must
produce, and FBGEMM's update rule written out here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys.config import ConfigError, EmbeddingConfig, ExperimentConfig, ModelConfig, OptimConfig
from recsys.models import DLRM, build_model, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.mlp import MLP
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close

ROWS = [50, 300, 20, 1000]


def x_of(batch: int = 64, width: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, width, generator=torch.Generator().manual_seed(seed))


def io_of(mlp: MLP, module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and output of ``module`` (a part of ``mlp``) when ``mlp`` runs on ``x``."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = module.register_forward_hook(lambda m, i, o: seen.append((i[0].detach(), o.detach())))
    try:
        mlp(x)
    finally:
        handle.remove()
    return seen[0]


# --- the MLP ---


@pytest.mark.parametrize("norm", ["none", "batch", "layer"])
def test_each_layer_is_linear_norm_relu_dropout_with_the_widths_asked(norm):
    mlp = MLP(5, [7, 3], norm=norm, dropout=0.25)
    assert mlp(x_of()).shape == (64, 3) and mlp.out_features == 3
    want = ["linear", "act", "dropout"] if norm == "none" else ["linear", "norm", "act", "dropout"]
    for layer, (i, o) in zip(mlp, [(5, 7), (7, 3)], strict=True):
        assert list(layer._modules) == want
        assert (layer.linear.in_features, layer.linear.out_features) == (i, o)
        assert isinstance(layer.act, nn.ReLU) and layer.dropout.p == 0.25
    kinds = {"batch": nn.BatchNorm1d, "layer": nn.LayerNorm}
    if norm != "none":
        assert all(isinstance(layer.norm, kinds[norm]) for layer in mlp)


def test_without_norm_and_dropout_it_is_torchrecs_mlp_with_the_same_weights():
    """No dropout module, no norm; the same initial weights (same draws, same order) and the
    same outputs as TorchRec's ``MLP`` (``relu(Linear(x))`` per layer) under one seed."""
    from torchrec.modules.mlp import MLP as TorchRecMLP

    torch.manual_seed(3)
    mine = MLP(5, [7, 3])
    torch.manual_seed(3)
    theirs = TorchRecMLP(5, [7, 3])
    assert not any(
        isinstance(m, (nn.Dropout, nn.BatchNorm1d, nn.LayerNorm)) for m in mine.modules()
    )
    x = x_of()
    torch.testing.assert_close(mine(x), theirs(x), atol=0, rtol=0)


def test_evaluation_is_deterministic_and_training_drops_out():
    torch.manual_seed(0)
    mlp = MLP(5, [16, 8], norm="batch", dropout=0.5)
    x = x_of()
    a, b = mlp(x), mlp(x)  # training: two dropout masks
    assert not torch.equal(a, b)
    mlp.eval()
    c, d = mlp(x), mlp(x)
    torch.testing.assert_close(c, d, atol=0, rtol=0)
    # evaluation: batch norm uses its running statistics, a row scores alike in any batch
    torch.testing.assert_close(mlp(x[:3]), c[:3])
    torch.manual_seed(0)
    plain = MLP(5, [16, 8], norm="layer")  # no dropout: training is deterministic too
    torch.testing.assert_close(plain(x), plain(x), atol=0, rtol=0)


def test_dropout_zeroes_the_share_asked_and_scales_the_rest():
    torch.manual_seed(0)
    p = 0.3
    mlp = MLP(5, [400], dropout=p)
    act, dropped = io_of(mlp, mlp[0].dropout, x_of(batch=256))
    alive = act > 0
    zeroed = (dropped == 0) & alive
    assert abs(zeroed.sum().item() / alive.sum().item() - p) < 0.02
    kept = alive & ~zeroed
    torch.testing.assert_close(dropped[kept], act[kept] / (1 - p))
    mlp.eval()
    act, out = io_of(mlp, mlp[0].dropout, x_of(batch=256))
    torch.testing.assert_close(out, act, atol=0, rtol=0)  # evaluation: every unit, unscaled


def test_batch_norm_normalises_each_feature_over_the_batch_layer_norm_each_row():
    """In training, the norm's output: batch norm has mean 0, variance 1 per feature over the
    batch (a row's output depends on its batch mates); layer norm per row over the features (it
    does not). The norm is before the activation: its output has negative values."""
    x = x_of(batch=128)
    torch.manual_seed(0)
    batch = MLP(5, [32], norm="batch")
    _, z = io_of(batch, batch[0].norm, x)
    torch.testing.assert_close(z.mean(0), torch.zeros(32), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.var(0, unbiased=False), torch.ones(32), atol=1e-3, rtol=0)
    assert (z < 0).any()
    assert not torch.allclose(batch(x[:8]), batch(x)[:8])
    torch.manual_seed(0)
    layer = MLP(5, [32], norm="layer")
    _, z = io_of(layer, layer[0].norm, x)
    torch.testing.assert_close(z.mean(1), torch.zeros(128), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.var(1, unbiased=False), torch.ones(128), atol=1e-3, rtol=0)
    torch.testing.assert_close(layer(x[:8]), layer(x)[:8])


def test_batch_norm_keeps_running_statistics_in_training_only():
    torch.manual_seed(0)
    mlp = MLP(5, [6], norm="batch")
    norm = mlp[0].norm
    assert torch.equal(norm.running_mean, torch.zeros(6))
    mlp(x_of())
    moved = norm.running_mean.clone()
    assert not torch.equal(moved, torch.zeros(6))
    mlp.eval()
    mlp(x_of(seed=1))
    assert torch.equal(norm.running_mean, moved)


def test_bad_mlp_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one layer"):
        MLP(5, [])
    with pytest.raises(ValueError, match="dropout=1.0"):
        MLP(5, [4], dropout=1.0)
    with pytest.raises(ValueError, match="unknown norm 'group'"):
        MLP(5, [4], norm="group")


# --- in DLRM and the reference models ---


def dlrm(op: str = "dot", norm: str = "none", dropout: float = 0.0, num_dense: int = 3) -> DLRM:
    emb = EmbeddingConfig(num_embeddings=ROWS, dim=8)
    cfg = ModelConfig(
        num_dense=num_dense, bottom_mlp=[8], top_mlp=[8, 4], interaction=op, norm=norm,
        dropout=dropout,
    )  # fmt: skip
    torch.manual_seed(0)
    return materialize(DLRM(cfg, emb, embedding_device="meta"))


def test_dlrm_has_norm_and_dropout_in_every_mlp_layer_never_after_the_logits():
    model = dlrm("dcn", norm="layer", dropout=0.2)
    bottom, (top, logits) = model.dense_arch, model.over_arch
    assert [layer.linear.out_features for layer in bottom] == [8, 8]  # its D-wide output too
    assert [layer.linear.out_features for layer in top] == [8, 4]
    for layer in [*bottom, *top]:
        assert isinstance(layer.norm, nn.LayerNorm) and layer.dropout.p == 0.2
    assert isinstance(logits, nn.Linear) and logits.out_features == 1  # the last module
    assert isinstance(model.interaction.dropout, nn.Dropout)  # dcn: on the cross net's output
    assert model.interaction.dropout.p == 0.2
    dot = dlrm("dot", dropout=0.2)
    assert sum(isinstance(m, nn.Dropout) for m in dot.modules()) == 4  # 2 bottom, 2 top


def test_the_default_dlrm_has_neither_norm_nor_dropout():
    for op in ("dot", "dcn"):
        kinds = {type(m) for m in dlrm(op).modules()}
        assert not kinds & {nn.Dropout, nn.BatchNorm1d, nn.LayerNorm}, op


def test_dcn_dropout_is_on_the_cross_network_output():
    model = dlrm("dcn", dropout=0.5).train()
    dense = x_of(6, 3)
    kjt = make_kjt([f"cat_{i}" for i in range(4)], ROWS, batch=6)
    net = model.interaction
    crossed, dropped = [], []
    h1 = net.crossnet.register_forward_hook(lambda m, i, o: crossed.append(o.detach()))
    h2 = net.dropout.register_forward_hook(lambda m, i, o: dropped.append(o.detach()))
    model(dense, kjt)
    h1.remove(), h2.remove()
    zero = dropped[0] == 0
    assert zero.any() and (crossed[0][zero] != 0).any()
    torch.testing.assert_close(dropped[0][~zero], crossed[0][~zero] * 2)


def test_dlrm_evaluates_deterministically_with_dropout_and_batch_norm():
    model = dlrm("dcn", norm="batch", dropout=0.3)
    dense, kjt = x_of(16, 3), make_kjt([f"cat_{i}" for i in range(4)], ROWS, batch=16)
    assert not torch.equal(model(dense, kjt), model(dense, kjt))  # training
    model.eval()
    torch.testing.assert_close(model(dense, kjt), model(dense, kjt), atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["lr", "fm"])
def test_reference_models_ignore_norm_and_dropout(arch):
    emb = EmbeddingConfig(num_embeddings=ROWS, dim=8)
    built = {}
    for norm, dropout in (("none", 0.0), ("batch", 0.5)):
        torch.manual_seed(0)
        cfg = ModelConfig(arch=arch, num_dense=3, norm=norm, dropout=dropout)  # type: ignore[arg-type]
        built[norm] = materialize(build_model(cfg, emb, 1, "meta"))
    kinds = {type(m) for m in built["batch"].modules()}
    assert not kinds & {nn.Dropout, nn.BatchNorm1d, nn.LayerNorm}
    a, b = (dict(m.state_dict()) for m in built.values())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batch_norm_and_dropout_export_as_int8_torchscript_in_eval():
    """Batch norm with trained running statistics and dropout (the DCN's too) through the
    export's path: the scripted INT8 model scores as the FP32 eval model, the same every time."""
    model = dlrm("dcn", norm="batch", dropout=0.3)
    kjt = make_kjt([f"cat_{i}" for i in range(4)], ROWS, batch=64, seed=3)
    for seed in range(3):  # running statistics away from their initial 0 / 1
        model(x_of(64, 3, seed) * 3 + 1, kjt)
    emb = EmbeddingConfig(num_embeddings=ROWS, dim=8)
    wrapped = WithRawIds(model, emb.layout().qr).eval()
    assert_int8_export_close(wrapped, x_of(64, 3, seed=9), kjt)


# --- the config ---


def test_regularisation_keys_round_trip_and_are_sweepable():
    keys = ExperimentConfig.all_keys()
    new = ["model.dropout", "model.norm", "optim.embedding_weight_decay"]
    assert {*new, "optim.embedding_weight_decay_mode"} <= set(keys)
    cfg = ExperimentConfig().with_overrides(
        {"model.dropout": 0.1, "model.norm": "batch", "optim.embedding_weight_decay": 1e-4,
         "optim.embedding_weight_decay_mode": "decoupled"}
    )  # fmt: skip
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.model.dropout, cfg.model.norm) == (0.1, "batch")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model.dropout": 1.0}, r"model.dropout=1.0: a probability in \[0, 1\)"),
        ({"model.dropout": -0.1}, r"model.dropout=-0.1: a probability in \[0, 1\)"),
        ({"model.dropout": float("nan")}, r"model.dropout=nan"),
        ({"model.norm": "group"}, r"model.norm='group': not one of \('none', 'batch', 'layer'\)"),
        ({"optim.embedding_weight_decay": -1e-3}, r"optim.embedding_weight_decay=-0.001: must"),
        ({"optim.embedding_weight_decay": float("inf")}, r"optim.embedding_weight_decay=inf"),
        ({"optim.embedding_weight_decay_mode": "l1"}, r"embedding_weight_decay_mode='l1': not one"),
        (
            {"optim.embedding_optimizer": "exact_adagrad", "optim.embedding_weight_decay": 0.01},
            r"optim.embedding_weight_decay=0.01: optim.embedding_optimizer='exact_adagrad' has "
            r"no weight decay",
        ),
        (
            {"optim.embedding_optimizer": "exact_sgd", "optim.embedding_weight_decay": 0.01},
            r"optim.embedding_weight_decay=0.01: optim.embedding_optimizer='exact_sgd' has no",
        ),
        (
            {"optim.embedding_optimizer": "adam", "optim.embedding_weight_decay": 0.01},
            r"optim.embedding_weight_decay_mode='l2': optim.embedding_optimizer='adam' with "
            r"optim.embedding_weight_decay=0.01 supports decoupled only",
        ),
        (
            {
                "optim.embedding_weight_decay": 25.0,
                "optim.embedding_weight_decay_mode": "decoupled",
            },
            r"optim.embedding_weight_decay=25.0: decoupled decay multiplies a row by "
            r"1 - embedding_lr \* embedding_weight_decay = -0.25",
        ),
    ],
)
def test_bad_regularisation_is_refused_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig().with_overrides(overrides)


def test_what_each_embedding_optimizer_supports_is_accepted():
    for opt in ("exact_rowwise_adagrad", "exact_adagrad", "exact_sgd", "adam"):
        OptimConfig(embedding_optimizer=opt)  # no decay: any optimizer  # type: ignore[arg-type]
    for mode in ("l2", "decoupled"):
        OptimConfig(embedding_weight_decay=1e-2, embedding_weight_decay_mode=mode)  # type: ignore[arg-type]
    decoupled = {"embedding_weight_decay": 0.01, "embedding_weight_decay_mode": "decoupled"}
    OptimConfig(embedding_optimizer="adam", **decoupled)  # type: ignore[arg-type]


# --- the fused parameters and FBGEMM's rule ---


def test_fused_params_carry_the_decay_and_its_mode():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    from recsys.distributed.sharding import fused_params

    plain = fused_params(OptimConfig())
    assert plain == {
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-8
    }  # fmt: skip
    l2 = fused_params(OptimConfig(embedding_weight_decay=0.01))
    assert l2["weight_decay"] == 0.01 and l2["weight_decay_mode"] == WeightDecayMode.L2
    decoupled = OptimConfig(embedding_weight_decay=0.01, embedding_weight_decay_mode="decoupled")
    d = fused_params(decoupled)
    assert d["weight_decay"] == 0.01 and d["weight_decay_mode"] == WeightDecayMode.DECOUPLE


def tbe_step(optim: OptimConfig, fp16: bool) -> tuple:
    """One CPU FBGEMM table (6 rows x 8) built from ``fused_params``, one backward over bags
    ``{1}, {3, 3}, {4}`` with upstream gradient ``up``: ``(w0, up, w1, state)``."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from recsys.distributed.sharding import fused_params

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(6, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        weights_precision=SparseType.FP16 if fp16 else SparseType.FP32,
        **fused_params(optim),
    )
    g = torch.Generator().manual_seed(0)
    weights = tbe.split_embedding_weights()[0]
    with torch.no_grad():
        weights.copy_(torch.randn(6, 8, generator=g))
    w0 = weights.float().clone()
    out = tbe(torch.tensor([1, 3, 3, 4]), torch.tensor([0, 1, 3, 4]))
    up = torch.randn(3, 8, generator=g)
    (out * up).sum().backward()
    state = tbe.split_optimizer_states()[0][0]
    return w0, up, tbe.split_embedding_weights()[0].float(), state.clone()


def row_grads(up: torch.Tensor) -> torch.Tensor:
    """The tables' gradient of ``sum(out * up)`` for the bags of ``tbe_step``: ``[6, 8]``."""
    grad = torch.zeros(6, 8)
    grad[1], grad[3], grad[4] = up[0], 2 * up[1], up[2]
    return grad


TOUCHED = torch.tensor([False, True, False, True, True, False])


def test_one_rowwise_adagrad_step_with_l2_decay_is_the_formula():
    """FBGEMM's CPU kernel (fp16 tables: the kernel that applies decay on CPU) against
    ``g' = g + wd * w``, ``state = mean(g'^2)`` per row, ``w -= lr g' / (sqrt(state) + eps)``;
    rows no bag reads are left alone (no decay either)."""
    lr, wd, eps = 0.1, 0.4, 1e-8
    optim = OptimConfig(embedding_lr=lr, eps=eps, embedding_weight_decay=wd)
    w0, up, w1, state = tbe_step(optim, fp16=True)
    grad = row_grads(up) + wd * w0
    want_state = (grad**2).mean(1) * TOUCHED
    want = w0 - lr * grad / (want_state.sqrt() + eps)[:, None]
    torch.testing.assert_close(state, want_state, rtol=1e-6, atol=0)
    torch.testing.assert_close(w1[TOUCHED], want[TOUCHED], rtol=2**-10, atol=0)  # fp16 storage
    torch.testing.assert_close(w1[~TOUCHED], w0[~TOUCHED], atol=0, rtol=0)
    plain = w0 - lr * row_grads(up) / ((row_grads(up) ** 2).mean(1).sqrt() + eps)[:, None]
    assert ((w1 - plain)[TOUCHED].abs() > 1e-2).any()  # the decay is far above the tolerance


def test_one_rowwise_adagrad_step_with_decoupled_decay_is_the_formula():
    """``state = mean(g^2)`` (the plain gradient), ``w = (1 - lr wd) w - lr g / (sqrt(state) +
    eps)``; rows no bag reads are left alone."""
    lr, wd, eps = 0.1, 0.4, 1e-8
    optim = OptimConfig(
        embedding_lr=lr, eps=eps, embedding_weight_decay=wd, embedding_weight_decay_mode="decoupled"
    )
    w0, up, w1, state = tbe_step(optim, fp16=True)
    grad = row_grads(up)
    want_state = (grad**2).mean(1) * TOUCHED
    want = (1 - lr * wd) * w0 - lr * grad / (want_state.sqrt() + eps)[:, None]
    torch.testing.assert_close(state, want_state, rtol=1e-6, atol=0)
    torch.testing.assert_close(w1[TOUCHED], want[TOUCHED], rtol=2**-10, atol=0)
    torch.testing.assert_close(w1[~TOUCHED], w0[~TOUCHED], atol=0, rtol=0)


def test_fbgemm_drops_the_decay_of_fp32_tables_on_cpu_so_it_is_refused_there():
    """FBGEMM's CPU kernel for fp32 tables updates as if there were no decay (its fast path
    passes ``weight_decay=0``): a run would silently train unregularised, so the worker refuses
    it. If this starts failing, FBGEMM applies the decay and ``check_fused_decay`` can go."""
    from recsys.distributed.sharding import check_fused_decay

    optim = OptimConfig(embedding_lr=0.1, embedding_weight_decay=0.4)
    w0, up, w1, _ = tbe_step(optim, fp16=False)
    grad = row_grads(up)
    plain = w0 - 0.1 * grad / ((grad**2).mean(1).sqrt() + 1e-8)[:, None]
    torch.testing.assert_close(w1, plain)
    with pytest.raises(ConfigError, match=r"optim.embedding_weight_decay=0.4: FBGEMM's CPU kernel"):
        check_fused_decay(optim, "cpu", half=False)
    check_fused_decay(optim, "cpu", half=True)
    check_fused_decay(optim, "cuda", half=False)
    check_fused_decay(OptimConfig(), "cpu", half=False)


# --- batch norm statistics, for the trainer ---


def test_batch_norm_stats_are_every_running_mean_and_variance_in_order():
    from recsys.distributed import collectives
    from recsys.train.trainer import batch_norm_stats, sync_batch_norm

    model = dlrm("dot", norm="batch")
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d)]
    assert len(norms) == 4  # 2 bottom layers, 2 top
    stats = batch_norm_stats(model)
    assert len(stats) == 8
    for i, m in enumerate(norms):
        assert stats[2 * i] is m.running_mean and stats[2 * i + 1] is m.running_var
    assert batch_norm_stats(dlrm("dot", norm="layer")) == []
    before = [t.clone() for t in stats]
    sync_batch_norm(model)  # one process: nothing to average
    collectives.average_([])
    assert all(torch.equal(a, b) for a, b in zip(before, stats, strict=True))
