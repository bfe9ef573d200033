"""The model registry (``recsys.archs``): every registered architecture builds from a config and
maps a batch to one logit per task over the tables it declares; a new one is a module plus one
registration (shown with a toy model registered here); a key an architecture does not read is
refused where a search space or a reference sets it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys import archs
from recsys.config import ConfigError, EmbeddingConfig, ExperimentConfig, ModelConfig, QRConfig
from recsys.models import build_model, materialize
from recsys.models.build import model_class
from recsys.tune import space as spaces
from tests.conftest import make_kjt
from tests.helpers import space_file

ROWS = [50, 300, 20]


@pytest.mark.parametrize("name", list(archs.ARCHS))
@pytest.mark.parametrize("tasks", [1, 2])
def test_every_registered_arch_builds_and_scores_a_batch(name, tasks):
    """``(dense [B, I], kjt) -> logits [B, T]``, finite, over tables of the registered width,
    and every parameter's gradient in the parameter's own strides (what DDP's reducer expects of
    the dense parameters, and warns about on every trial otherwise): what every architecture
    must do, checked for each one registered."""
    emb = EmbeddingConfig(num_embeddings=ROWS, dim=8)
    cfg = ExperimentConfig(model=ModelConfig(arch=name, num_dense=3), embeddings=emb)
    torch.manual_seed(0)
    model = materialize(build_model(cfg.model, cfg.embeddings, tasks, "meta"))
    kjt = make_kjt(emb.names(), ROWS, batch=5, hot=2)
    logits = model(torch.randn(5, 3), kjt)
    assert logits.shape == (5, tasks) and torch.isfinite(logits).all()
    logits.sum().backward()
    strides = {n: (p.grad.stride(), p.stride()) for n, p in model.named_parameters()
               if p.grad is not None and p.grad.stride() != p.stride()}  # fmt: skip
    assert not strides, strides
    width = archs.get(name).table_width
    assert cfg.tables.dim == (8 if width is None else width(8, 1))


class Bias(nn.Module):
    """The smallest model a registration can name: one logit per task from a bias."""

    def __init__(self, model, embeddings, num_tasks, embedding_device=None, init_seed=0):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_tasks))

    def forward(self, dense: torch.Tensor, kjt) -> torch.Tensor:
        return self.bias.expand(dense.shape[0], -1)


@pytest.fixture
def toy_arch():
    from recsys.models.build import BUILDERS

    arch = archs.register(archs.Arch(
        name="toy", summary="a bias", reads=("model.dropout",),
        table_width=lambda dim, tasks: 4, whole_rows=True,
    ))  # fmt: skip
    BUILDERS["toy"] = Bias
    yield arch
    del archs.ARCHS["toy"], BUILDERS["toy"]


def test_every_registered_arch_has_a_class():
    from recsys.models.build import BUILDERS

    assert set(BUILDERS) == set(archs.ARCHS)


def test_one_registration_makes_an_arch_configurable_and_buildable(toy_arch, tmp_path):
    cfg = ExperimentConfig(model=ModelConfig(arch="toy"), embeddings=EmbeddingConfig(dim=8))
    assert model_class("toy") is Bias and cfg.tables.dim == 4
    model = build_model(cfg.model, cfg.embeddings, 2)
    assert model(torch.zeros(3, 13), None).shape == (3, 2)
    with pytest.raises(ConfigError, match="embeddings.qr.operation=.*model.arch='toy' reads"):
        ExperimentConfig(model=ModelConfig(arch="toy"), embeddings=EmbeddingConfig(
            qr=QRConfig(threshold=10, collisions=2, operation="concat")))  # fmt: skip
    body = "overrides: {model.arch: toy}\nspace:\n  model.dropout: {choice: [0, 0.1]}\n"
    assert spaces.load(space_file(tmp_path, body)).dimensions[0].key == "model.dropout"
    with pytest.raises(ValueError, match="registered twice"):
        archs.register(toy_arch)


def test_an_unknown_arch_is_named_with_the_registered_ones():
    with pytest.raises(ConfigError, match=r"model.arch='dlrn': not one of .*'dlrm'.*did you mean"):
        ModelConfig(arch="dlrn")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("overrides: {model.arch: lr}\nspace:\n  model.interaction: {choice: [dot, cat]}\n",
         r"space.model.interaction: model.arch lr does not read it"),
        ("space:\n  model.arch: {choice: [lr, fm]}\n  model.top_mlp: {choice: [[8], [16]]}\n",
         r"space.model.top_mlp: model.arch lr / fm does not read it"),
        ("space:\n  optim.lr: {choice: [0.01, 0.1]}\n"
         "baselines: {fm: {overrides: {model.dropout: 0.1}}}\n",
         r"baselines.fm.overrides: fm does not read model.dropout"),
        ("overrides: {model.arch: lr, model.dropout: 0.1}\nspace:\n  optim.lr: {choice: [0.1]}\n",
         r"overrides.model.dropout: model.arch lr does not read it"),
        ("overrides: {model.arch: fm}\nspace:\n  model.sequence.pooling: {choice: [sum]}\n",
         r"space.model.sequence.pooling: model.arch fm does not read it"),
    ],
)  # fmt: skip
def test_a_key_the_arch_does_not_read_is_refused(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        spaces.load(space_file(tmp_path, body))


def test_dlrm_sweeps_what_it_reads(tmp_path):
    body = "space:\n  model.arch: {choice: [dlrm, lr]}\n  model.top_mlp: {choice: [[8], [16]]}\n"
    assert [d.key for d in spaces.load(space_file(tmp_path, body)).dimensions] == [
        "model.arch",
        "model.top_mlp",
    ]


def test_dlrm_and_finalmlp_sweep_a_sequences_pooling(tmp_path):
    body = ("space:\n  model.arch: {choice: [dlrm, finalmlp]}\n"
            "  model.sequence.pooling: {choice: [sum, attention, transformer]}\n")  # fmt: skip
    keys = [d.key for d in spaces.load(space_file(tmp_path, body)).dimensions]
    assert keys == ["model.arch", "model.sequence.pooling"]


def test_the_registry_is_pure():
    """``recsys.config`` reads ``recsys.archs``: it imports neither torch nor the models."""
    import subprocess
    import sys

    code = (
        "import sys, recsys.archs; "
        "print(sorted(m for m in ('torch', 'recsys.models') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
