"""The reference models (``model.arch: lr | fm``) equal their textbook formulas, computed here
from the models' own weights one sample and one id at a time."""

from __future__ import annotations

import pytest
import torch

from recsys.config import (
    ConfigError,
    EmbeddingConfig,
    ExperimentConfig,
    ModelConfig,
    QRConfig,
    model_tables,
)
from recsys.models import build_model, embedding_report, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.embeddings import table_specs
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close

ROWS = [50, 300, 20, 1000]
DENSE = 3


def emb_config(qr: str | None) -> EmbeddingConfig:
    qr_cfg = QRConfig(threshold=100, collisions=7, operation=qr) if qr else QRConfig()
    return EmbeddingConfig(num_embeddings=ROWS, dim=8, qr=qr_cfg)  # type: ignore[arg-type]


def model_of(
    arch: str, emb: EmbeddingConfig, tasks: int, num_dense: int = DENSE
) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, num_dense=num_dense)
    return materialize(build_model(cfg, emb, tasks, "meta"))


def row(model: torch.nn.Module, emb: EmbeddingConfig, feature: str, i: int) -> torch.Tensor:
    """Feature ``feature``'s row of id ``i``, QR applied, from the model's weights."""
    bags = model.sparse_arch.embedding_bag_collection.embedding_bags
    rows = dict(zip(emb.names(), emb.num_embeddings, strict=True))[feature]
    if not emb.qr.applies_to(rows, feature):
        return bags[f"t_{feature}"].weight[i]
    c = emb.qr.collisions
    q, r = bags[f"t_{feature}_q"].weight[i // c], bags[f"t_{feature}_r"].weight[i % c]
    return q * r if emb.qr.operation == "mult" else q + r


def ids_of(kjt, feature: str, b: int) -> list[int]:
    return kjt[feature].to_dense()[b].tolist()


def bag(model, emb, kjt, feature: str, b: int) -> torch.Tensor:
    """A sample's pooled row of a feature: the sum over its ids (for QR ``mult``, the product of
    the pooled quotient and remainder rows, as ``combine_qr`` defines it)."""
    ids = ids_of(kjt, feature, b)
    if emb.qr.operation == "mult" and emb.qr.applies_to(ROWS[emb.names().index(feature)], feature):
        bags = model.sparse_arch.embedding_bag_collection.embedding_bags
        c = emb.qr.collisions
        q = sum(bags[f"t_{feature}_q"].weight[i // c] for i in ids)
        r = sum(bags[f"t_{feature}_r"].weight[i % c] for i in ids)
        return q * r
    return sum(row(model, emb, feature, i) for i in ids)


CASES = [(None, 1, 3), (None, 2, 3), ("mult", 1, 1), ("add", 2, 3)]  # qr, tasks, ids per bag


@pytest.mark.parametrize(("qr", "tasks", "hot"), CASES)
def test_logistic_regression_is_its_formula(qr, tasks, hot):
    emb = emb_config(qr)
    model = model_of("lr", emb, tasks)
    dense, kjt = torch.randn(5, DENSE), make_kjt(emb.names(), ROWS, batch=5, hot=hot, seed=1)
    got = WithRawIds(model, emb.layout().qr)(dense, kjt)
    w, b0 = model.dense_linear.weight, model.dense_linear.bias
    for b in range(5):
        for t in range(tasks):
            want = b0[t] + w[t] @ dense[b]
            for f in emb.names():
                want = want + bag(model, emb, kjt, f, b)[4 * t : 4 * t + 4].sum()
            torch.testing.assert_close(got[b, t], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("qr", "tasks", "hot"), CASES)
def test_factorization_machine_is_its_formula(qr, tasks, hot):
    emb = emb_config(qr)
    model = model_of("fm", emb, tasks)
    d = emb.dim
    dense, kjt = torch.randn(5, DENSE), make_kjt(emb.names(), ROWS, batch=5, hot=hot, seed=2)
    got = WithRawIds(model, emb.layout().qr)(dense, kjt)
    w, b0, v_dense = model.dense_linear.weight, model.dense_linear.bias, model.dense_factors
    for b in range(5):
        vecs = [dense[b, i] * v_dense[i] for i in range(DENSE)]
        vecs += [bag(model, emb, kjt, f, b)[:d] for f in emb.names()]
        pairs = sum(vecs[i] @ vecs[j] for i in range(len(vecs)) for j in range(i + 1, len(vecs)))
        for t in range(tasks):
            linear = sum(bag(model, emb, kjt, f, b)[d + 4 * t : d + 4 * t + 4].sum()
                         for f in emb.names())  # fmt: skip
            want = b0[t] + w[t] @ dense[b] + linear + pairs
            torch.testing.assert_close(got[b, t], want, atol=1e-4, rtol=1e-4)


# No dense features (``model.num_dense == 0``): no dense linear terms, no dense factors


@pytest.mark.parametrize(("qr", "tasks", "hot"), CASES)
def test_logistic_regression_without_dense_is_its_formula(qr, tasks, hot):
    """``logit_t = b_t + sum_f w_t(id_f)``; ``b`` starts at zero."""
    emb = emb_config(qr)
    model = model_of("lr", emb, tasks, num_dense=0)
    assert not hasattr(model, "dense_linear") and torch.equal(model.bias, torch.zeros(tasks))
    with torch.no_grad():
        model.bias.normal_()  # make the bias count
    dense, kjt = torch.empty(5, 0), make_kjt(emb.names(), ROWS, batch=5, hot=hot, seed=1)
    got = WithRawIds(model, emb.layout().qr)(dense, kjt)
    assert got.shape == (5, tasks)
    for b in range(5):
        for t in range(tasks):
            want = model.bias[t]
            for f in emb.names():
                want = want + bag(model, emb, kjt, f, b)[4 * t : 4 * t + 4].sum()
            torch.testing.assert_close(got[b, t], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("qr", "tasks", "hot"), CASES)
def test_factorization_machine_without_dense_is_its_formula(qr, tasks, hot):
    """``logit_t = b_t + sum_f w_t(id_f) + sum_{f<g} <v_f, v_g>`` over the ``F`` sparse fields."""
    emb = emb_config(qr)
    model = model_of("fm", emb, tasks, num_dense=0)
    assert not hasattr(model, "dense_factors") and not hasattr(model, "dense_linear")
    with torch.no_grad():
        model.bias.normal_()
    d = emb.dim
    dense, kjt = torch.empty(5, 0), make_kjt(emb.names(), ROWS, batch=5, hot=hot, seed=2)
    got = WithRawIds(model, emb.layout().qr)(dense, kjt)
    assert got.shape == (5, tasks)
    for b in range(5):
        vecs = [bag(model, emb, kjt, f, b)[:d] for f in emb.names()]
        pairs = sum(vecs[i] @ vecs[j] for i in range(len(vecs)) for j in range(i + 1, len(vecs)))
        for t in range(tasks):
            linear = sum(bag(model, emb, kjt, f, b)[d + 4 * t : d + 4 * t + 4].sum()
                         for f in emb.names())  # fmt: skip
            want = model.bias[t] + linear + pairs
            torch.testing.assert_close(got[b, t], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["lr", "fm"])
def test_reference_without_dense_exports_as_int8_torchscript(arch):
    """As ``test_reference_exports_as_int8_torchscript``, with a ``[B, 0]`` dense input."""
    emb = emb_config("mult")
    model = WithRawIds(model_of(arch, emb, 1, num_dense=0), emb.layout().qr).eval()
    dense, kjt = torch.empty(64, 0), make_kjt(emb.names(), ROWS, batch=64, seed=3)
    assert_int8_export_close(model, dense, kjt)


def test_reference_tables_are_the_same_features_at_their_own_width():
    emb = emb_config("mult")
    lr = model_tables(ModelConfig(arch="lr"), emb, 2)
    fm = model_tables(ModelConfig(arch="fm"), emb, 1)
    for tables, width in ((lr, 8), (fm, 8 + 4)):
        specs = table_specs(tables)
        assert [(s.name, s.rows) for s in specs] == [(s.name, s.rows) for s in table_specs(emb)]
        assert {s.dim for s in specs} == {width}
    lr_bytes = embedding_report(lr).bytes
    assert lr_bytes == sum(s.rows for s in table_specs(emb)) * 8 * 4  # what a trial reports
    assert ExperimentConfig(model=ModelConfig(arch="lr"), embeddings=emb).tables.dim == 4


@pytest.mark.parametrize(
    ("emb", "key"),
    [
        (EmbeddingConfig(num_embeddings=ROWS, dim=8, md_alpha=0.5), "embeddings.md_alpha"),
        (EmbeddingConfig(num_embeddings=ROWS, dim=8, dims=[8, 4, 8, 4]), "embeddings.dims"),
        (emb_config("concat"), "embeddings.qr.operation"),
    ],
)
def test_what_a_reference_cannot_build_is_named(emb, key):
    for arch in ("lr", "fm"):
        with pytest.raises(ConfigError, match=f"{key}=.*model.arch='{arch}'"):
            ExperimentConfig(model=ModelConfig(arch=arch), embeddings=emb)
    ExperimentConfig(model=ModelConfig(arch="dlrm"), embeddings=emb)  # DLRM builds it


def test_unknown_arch_is_named():
    with pytest.raises(ConfigError, match="model.arch='xgb'"):
        ModelConfig(arch="xgb")  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["lr", "fm"])
def test_reference_exports_as_int8_torchscript(arch):
    """The export's own path (quantize the tables, shard for inference, trace, script)."""
    emb = emb_config("mult")
    model = WithRawIds(model_of(arch, emb, 1), emb.layout().qr).eval()
    dense, kjt = torch.randn(64, DENSE), make_kjt(emb.names(), ROWS, batch=64, seed=3)
    assert_int8_export_close(model, dense, kjt)
