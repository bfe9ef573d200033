"""FinalMLP (``model.arch: finalmlp``) equals the paper's equations written out here one sample,
one head and one task at a time from the model's own weights: the pooled rows, each stream's
gate ``2 sigmoid(MLP(c))``, the gated streams, and the fusion ``b + w1 . o1 + w2 . o2 +
sum_h o1_h^T W_h o2_h``; it exports to INT8 TorchScript."""

from __future__ import annotations

import pytest
import torch

from recsys.config import ConfigError, EmbeddingConfig, ExperimentConfig, ModelConfig, QRConfig
from recsys.configlib import from_dict
from recsys.models import build_model, materialize
from recsys.models.dlrm import WithRawIds
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close

ROWS = [30, 50, 20]
DIMS = [8, 4, 8]  # mixed dims: the streams read the rows as they are


def model_of(num_dense: int, tasks: int, heads: int) -> tuple[torch.nn.Module, EmbeddingConfig]:
    emb = EmbeddingConfig(num_embeddings=ROWS, dim=8, dims=DIMS)
    finalmlp = {"stream1": [12, 6], "stream2": [10, 4], "heads": heads, "gate": [5]}
    cfg = from_dict(ModelConfig, {"arch": "finalmlp", "num_dense": num_dense, "finalmlp": finalmlp})
    torch.manual_seed(0)
    model = materialize(build_model(cfg, emb, tasks, "meta")).eval()
    with torch.no_grad():  # a context away from zero, so the gates differ from 1
        for gate in (model.gate1, model.gate2):
            gate.context.normal_()
    return model, emb


def mlp(layers: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``ReLU(W x + b)`` layer after layer (no norm, no dropout), one vector."""
    for layer in layers:
        x = torch.relu(layer.linear.weight @ x + layer.linear.bias)
    return x


def by_hand(model, emb, dense, kjt, b: int, t: int, heads: int) -> float:
    """Sample ``b``'s logit of task ``t`` from the equations."""
    bags = model.sparse_arch.embedding_bag_collection.embedding_bags
    pooled = [
        sum(bags[f"t_{f}"].weight[i] for i in kjt[f].to_dense()[b].tolist()) for f in emb.names()
    ]
    x = torch.cat([dense[b], *pooled])
    outs = []
    for gate, stream in ((model.gate1, model.stream1), (model.gate2, model.stream2)):
        g = 2 * torch.sigmoid(gate.out.weight @ mlp(gate.mlp, gate.context[0]) + gate.out.bias)
        outs.append(mlp(stream, x * g))
    o1, o2 = outs
    fusion = model.fusion
    y = fusion.linear1.bias[t] + fusion.linear1.weight[t] @ o1 + fusion.linear2.weight[t] @ o2
    h1, h2 = len(o1) // heads, len(o2) // heads
    for h in range(heads):
        w = fusion.bilinear[h, t]  # [h1, h2]
        for i in range(h1):
            for j in range(h2):
                y = y + o1[h * h1 + i] * w[i, j] * o2[h * h2 + j]
    return float(y)


@pytest.mark.parametrize(("num_dense", "tasks", "heads"), [(3, 1, 1), (3, 2, 2), (0, 2, 2)])
def test_forward_equals_the_equations(num_dense, tasks, heads):
    model, emb = model_of(num_dense, tasks, heads)
    dense, kjt = torch.randn(6, num_dense), make_kjt(emb.names(), ROWS, batch=6, hot=3, seed=1)
    with torch.no_grad():
        logits = model(dense, kjt)
        want = [[by_hand(model, emb, dense, kjt, b, t, heads) for t in range(tasks)]
                for b in range(6)]  # fmt: skip
    assert logits.shape == (6, tasks)
    torch.testing.assert_close(logits, torch.tensor(want), atol=1e-5, rtol=0)


def test_it_exports_as_int8_torchscript_with_qr():
    emb = EmbeddingConfig(
        num_embeddings=[50, 300, 20], dim=8, qr=QRConfig(threshold=100, collisions=7)
    )
    cfg = from_dict(ModelConfig, {"arch": "finalmlp", "num_dense": 3, "finalmlp": {"heads": 2}})
    torch.manual_seed(0)
    model = WithRawIds(materialize(build_model(cfg, emb, 1, "meta")), emb.layout().qr).eval()
    dense, kjt = torch.randn(64, 3), make_kjt(emb.names(), [50, 300, 20], batch=64, seed=3)
    assert_int8_export_close(model, dense, kjt)


def test_heads_must_divide_each_streams_last_width():
    with pytest.raises(ConfigError, match="model.finalmlp.heads=3: model.finalmlp.stream1's last"):
        ExperimentConfig.from_dict({"model": {"arch": "finalmlp", "finalmlp": {"heads": 3}}})
