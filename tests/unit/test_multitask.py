"""Multi-task experts (``model.tasks: mmoe | ple``) equal their papers' equations written out here
one sample and one task at a time from the modules' own weights; DLRM with them trains, exports
to INT8 and is sweepable; the shared bottom is the top MLP it always was."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.config import EmbeddingConfig, ExperimentConfig, ExpertsConfig, ModelConfig
from recsys.configlib import ConfigError
from recsys.models import build_model, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.multitask import Experts
from recsys.tune import space as spaces
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close, space_file

Z, TASKS = 6, 3


def mlp(layers, x: torch.Tensor) -> torch.Tensor:
    """``ReLU(W x + b)`` layer after layer, one vector (no norm, no dropout)."""
    for layer in layers:
        x = torch.relu(layer.linear.weight @ x + layer.linear.bias)
    return x


def softmax(v: torch.Tensor) -> list[float]:
    e = [math.exp(float(s)) for s in v]
    return [x / sum(e) for x in e]


def mixture(gate, x: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    weights = softmax(gate.weight @ x + gate.bias)
    assert len(weights) == len(experts)
    return sum(w * e for w, e in zip(weights, experts, strict=True))


def by_hand(model: Experts, z: torch.Tensor) -> list[float]:
    """One sample's logits: every level's experts, gates and mixtures, then the towers."""
    inputs, shared_in = [z] * TASKS, z
    for level in model.levels:
        shared = [mlp(e, shared_in) for e in level.shared]
        own = [[mlp(e, inputs[t]) for e in level.task_experts[t]] for t in range(TASKS)]
        outs = [mixture(level.gates[t], inputs[t], own[t] + shared) for t in range(TASKS)]
        if level.shared_gate is not None:
            shared_in = mixture(level.shared_gate, shared_in, [e for o in own for e in o] + shared)
        inputs = outs
    logits = []
    for tower, x in zip(model.towers, inputs, strict=True):
        hidden = mlp(tower[0], x)
        logits.append(float(tower[1].weight[0] @ hidden + tower[1].bias[0]))
    return logits


@pytest.mark.parametrize(
    ("kind", "cfg"),
    [
        ("mmoe", ExpertsConfig(count=3, mlp=[5, 4], tower=[3])),
        ("ple", ExpertsConfig(count=2, task_count=2, mlp=[4], tower=[3], levels=2)),
        ("ple", ExpertsConfig(count=1, task_count=1, mlp=[4], tower=[2], levels=3)),
    ],
    ids=["mmoe", "ple-2-levels", "ple-3-levels"],
)
def test_experts_equal_the_equations(kind, cfg):
    torch.manual_seed(0)
    model = Experts(cfg, kind, Z, TASKS).eval()
    z = torch.randn(4, Z)
    with torch.no_grad():
        logits = model(z)
        want = torch.tensor([by_hand(model, z[b]) for b in range(4)])
    assert logits.shape == (4, TASKS)
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)
    levels = len(model.levels)
    assert levels == (1 if kind == "mmoe" else cfg.levels)
    assert [lv.shared_gate is None for lv in model.levels] == [False] * (levels - 1) + [True]
    if kind == "mmoe":  # no task experts: each gate weighs the shared experts only
        assert all(len(e) == 0 for e in model.levels[0].task_experts)


@pytest.mark.parametrize("tasks", ["shared", "mmoe", "ple"])
def test_dlrm_with_each_sharing_trains_and_exports(tasks):
    emb = EmbeddingConfig(num_embeddings=[40, 60, 30], dim=8)
    cfg = ModelConfig(num_dense=3, tasks=tasks, top_mlp=[8])
    torch.manual_seed(0)
    model = materialize(build_model(cfg, emb, 2, "meta"))
    names = [n for n, _ in model.named_parameters()]
    assert any("over_arch" in n and "levels" in n for n in names) == (tasks != "shared")
    dense, kjt = torch.randn(64, 3), make_kjt(emb.names(), [40, 60, 30], batch=64, seed=3)
    labels = (torch.rand(64, 2) < 0.3).float()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] * 0.8
    assert_int8_export_close(WithRawIds(model, {}).eval(), dense, kjt)


def test_the_sharing_is_sweepable_and_refused_where_unread(tmp_path):
    body = (
        "space:\n  model.tasks: {choice: [shared, mmoe, ple]}\n"
        "  model.experts.count: {choice: [2, 4]}\n"
    )
    space = spaces.load(space_file(tmp_path, body))
    assert space.config_for({"model.tasks": "ple"}).model.tasks == "ple"
    with pytest.raises(ConfigError, match="model.tasks: model.arch finalmlp does not read it"):
        spaces.load(space_file(tmp_path, "overrides: {model.arch: finalmlp}\n" + body))


def test_bad_expert_settings_are_named():
    with pytest.raises(ConfigError, match="model.experts.count=0"):
        ExperimentConfig.from_dict({"model": {"tasks": "mmoe", "experts": {"count": 0}}})
    with pytest.raises(ConfigError, match=r"model.tasks='moe': not one of"):
        ExperimentConfig.from_dict({"model": {"tasks": "moe"}})
