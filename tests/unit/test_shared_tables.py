"""Tables that several features read (``embeddings.shared``): a user's ``history`` of item ids
looks them up in ``item_id``'s table. One TorchRec table per owner, read by all its features, each
pooled on its own; checked against manual lookups in the owner's rows, through QR, training, the
reference models, the accounting and the INT8 export."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import (
    ConfigError,
    EmbeddingConfig,
    ExperimentConfig,
    ModelConfig,
    QRConfig,
    model_tables,
)
from recsys.models import DLRM, build_model, embedding_report, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.embeddings import SparseArch, qr_split_kjt, table_specs
from tests.conftest import make_kjt
from tests.helpers import assert_int8_export_close

NAMES = ["user", "item_id", "history", "country"]
ROWS = [50, 300, 300, 20]
SHARED = {"history": "item_id"}


def emb_config(
    qr: str | None = None, shared: dict[str, str] | None = None, **kw
) -> EmbeddingConfig:
    qr_cfg = QRConfig(threshold=100, collisions=7, operation=qr) if qr else QRConfig()  # type: ignore[arg-type]
    return EmbeddingConfig(
        num_embeddings=kw.pop("num_embeddings", ROWS),
        dim=8,
        feature_names=NAMES,
        shared=SHARED if shared is None else shared,
        qr=qr_cfg,
        **kw,
    )


def bags(arch: SparseArch) -> dict[str, torch.Tensor]:
    return {n: b.weight for n, b in arch.embedding_bag_collection.embedding_bags.items()}


def kjt_of(ids: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    """Bags per feature (``ids[f][b]``: sample ``b``'s ids), keys in ``NAMES`` order."""
    values, lengths = [], []
    for f in NAMES:
        for bag in ids[f]:
            values += bag
            lengths.append(len(bag))
    return KeyedJaggedTensor(
        keys=NAMES,
        values=torch.tensor(values),
        lengths=torch.tensor(lengths),
        stride=len(ids[NAMES[0]]),
    )


# --- the config: what sharing needs, refused naming both features ---


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shared": {"histroy": "item_id"}}, r"shared.histroy='item_id': 'histroy' is not a"),
        ({"shared": {"history": "item"}}, r"'history' would read the table of 'item', which is"),
        ({"shared": {"history": "history"}}, r"'history' cannot share its own table"),
        (
            {"shared": {"history": "item_id", "item_id": "user"}, "num_embeddings": [50] * 4},
            r"'history' reads the table of 'item_id', which reads the table of 'user'.*chains",
        ),
        ({"shared": {"history": "user"}}, r"num_embeddings.*'history'.*'user'.*history 300, us"),
        ({"dims": [8, 8, 4, 8]}, r"embeddings.dims.*'history'.*'item_id'.*history 4, item_id 8"),
        (
            {"feature_pooling": {"history": "mean"}},
            r"feature_pooling.*'history'.*'item_id'.*history mean, item_id sum",
        ),
    ],
)
def test_what_sharing_needs_is_refused_naming_both_features(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        emb_config(**kwargs)


def test_equal_rows_give_equal_mixed_dims_and_shared_is_a_dotted_map_key():
    emb = emb_config(md_alpha=0.5)
    dims = dict(zip(NAMES, emb.table_dims(), strict=True))
    assert dims["history"] == dims["item_id"] != dims["country"]
    base = ExperimentConfig.from_dict(
        {"embeddings": {"num_embeddings": ROWS, "feature_names": NAMES}}
    )
    cfg = base.with_overrides({"embeddings.shared.history": "item_id"})
    assert cfg.embeddings.shared == SHARED
    assert ExperimentConfig.from_dict(cfg.to_dict()).embeddings.shared == SHARED  # round trip


def test_a_constraint_on_a_sharers_table_names_the_owners():
    data = {"embeddings": {"num_embeddings": ROWS, "feature_names": NAMES, "shared": SHARED}}
    with pytest.raises(ConfigError, match=r"t_history.*'history' reads the table of 'item_id'.*"
                                          r"constrain t_item_id"):  # fmt: skip
        ExperimentConfig.from_dict({**data, "sharding": {"tables": {"t_history": {}}}})
    ExperimentConfig.from_dict({**data, "sharding": {"tables": {"t_item_id": {}}}})


# --- one table, read by every feature that shares it ---


def test_one_table_lists_the_owner_and_its_sharers():
    specs = table_specs(emb_config())
    assert [(s.name, s.features, s.rows) for s in specs] == [
        ("t_user", ("user",), 50),
        ("t_item_id", ("item_id", "history"), 300),
        ("t_country", ("country",), 20),
    ]
    qr = table_specs(emb_config("mult"))
    assert [(s.name, s.features) for s in qr if s.owner == "item_id"] == [
        ("t_item_id_q", ("item_id", "history")),
        ("t_item_id_r", ("item_id__qr_r", "history__qr_r")),
    ]
    # the layout still gives every feature its own keys (the data path is unchanged)
    assert emb_config("mult").layout().keys() == [*NAMES, "item_id__qr_r", "history__qr_r"]


def test_a_sharer_listed_before_its_owner_reads_the_owners_table():
    names = ["history", "user", "item_id"]
    emb = EmbeddingConfig(num_embeddings=[300, 50, 300], feature_names=names, shared=SHARED)
    assert [(s.name, s.features) for s in table_specs(emb)] == [
        ("t_user", ("user",)),
        ("t_item_id", ("item_id", "history")),
    ]


def test_sharer_pools_the_owners_rows():
    torch.manual_seed(0)
    arch = SparseArch(emb_config())
    w = bags(arch)["t_item_id"].detach()
    assert set(bags(arch)) == {"t_user", "t_item_id", "t_country"}
    ids = {"user": [[1], [2]], "item_id": [[5, 7], [299]], "history": [[5, 7], [3, 4, 299]],
           "country": [[0], [19]]}  # fmt: skip
    out = dict(zip(NAMES, arch(kjt_of(ids)), strict=True))
    for b, bag in enumerate(ids["history"]):
        torch.testing.assert_close(out["history"][b], w[bag].sum(0))
    torch.testing.assert_close(out["history"][0], out["item_id"][0])  # same ids, same rows
    assert not torch.allclose(out["history"][1], out["item_id"][1])  # pooled on its own


def test_a_sharers_gradient_trains_the_rows_its_owner_reads():
    torch.manual_seed(0)
    arch = SparseArch(emb_config())
    ids = {"user": [[1]], "item_id": [[5]], "history": [[5, 9]], "country": [[0]]}
    kjt = kjt_of(ids)
    before = dict(zip(NAMES, (o.detach() for o in arch(kjt)), strict=True))
    out = dict(zip(NAMES, arch(kjt), strict=True))
    out["history"].sum().backward()  # a loss on the sharer alone
    weight = bags(arch)["t_item_id"]
    assert weight.grad is not None
    assert set(weight.grad.abs().sum(1).nonzero().flatten().tolist()) == {5, 9}
    with torch.no_grad():
        weight -= 0.5 * weight.grad
    after = dict(zip(NAMES, (o.detach() for o in arch(kjt)), strict=True))
    assert not torch.allclose(after["item_id"], before["item_id"])  # the owner's row 5 moved
    assert not torch.allclose(after["history"], before["history"])
    torch.testing.assert_close(after["user"], before["user"])
    torch.testing.assert_close(after["item_id"][0], weight.detach()[5])


def test_both_features_add_their_gradients_on_a_row_they_share():
    torch.manual_seed(0)
    arch = SparseArch(emb_config())
    kjt = kjt_of({"user": [[1]], "item_id": [[5]], "history": [[5]], "country": [[0]]})
    out = dict(zip(NAMES, arch(kjt), strict=True))
    (out["item_id"].sum() + 2 * out["history"].sum()).backward()
    grad = bags(arch)["t_item_id"].grad
    assert grad is not None
    torch.testing.assert_close(grad[5], torch.full((8,), 3.0))


@pytest.mark.parametrize("op", ["mult", "add", "concat"])
def test_a_shared_table_is_qr_split_for_all_its_features(op):
    torch.manual_seed(0)
    emb = emb_config(op) if op != "concat" else dataclasses.replace(emb_config(op), dim=16)
    arch = SparseArch(emb)
    c = emb.qr.collisions
    kjt = make_kjt(NAMES, ROWS, batch=6, seed=4)
    out = dict(zip(NAMES, arch(qr_split_kjt(kjt, arch.collisions)), strict=True))
    q, r = bags(arch)["t_item_id_q"].detach(), bags(arch)["t_item_id_r"].detach()
    assert q.shape[0] == math.ceil(300 / c) and r.shape[0] == c
    assert not {"t_history_q", "t_history_r"} & set(bags(arch))
    for f in ("item_id", "history"):
        for b, i in enumerate(kjt[f].values().tolist()):  # one id per bag
            qi, ri = q[i // c], r[i % c]
            want = {"mult": qi * ri, "add": qi + ri, "concat": torch.cat([qi, ri])}[op]
            torch.testing.assert_close(out[f][b], want)


# --- what counts tables counts a shared one once ---


def test_a_shared_table_is_counted_once():
    shared, apart = embedding_report(emb_config()), embedding_report(emb_config(shared={}))
    assert shared.params == apart.params - 300 * 8
    assert shared.bytes == apart.bytes - 300 * 8 * 4 and shared.bytes < apart.bytes
    assert [t.features for t in shared.tables][1] == ("item_id", "history")
    with_qr = embedding_report(emb_config("mult"))
    assert with_qr.params == (50 + math.ceil(300 / 7) + 7 + 20) * 8
    assert with_qr.params_full == shared.params


def test_the_planner_places_and_counts_a_shared_table_once():
    from recsys.distributed.sharding import Machine
    from recsys.tune import feasibility

    def verdict(shared: dict[str, str]) -> feasibility.Verdict:
        emb = {"num_embeddings": [50, 20_000, 20_000, 20], "feature_names": NAMES,
               "shared": shared, "dim": 16}  # fmt: skip
        cfg = ExperimentConfig.from_dict({"embeddings": emb, "model": {"num_dense": 3}})
        return feasibility.check(cfg, {}, Machine("cpu", None, 4 * 2**30), 1, 1)

    shared, apart = verdict(SHARED), verdict({})
    assert shared.ok and apart.ok
    assert shared.numbers["emb_bytes"] == apart.numbers["emb_bytes"] - 20_000 * 16 * 4
    assert shared.numbers["plan_bytes_per_worker"] < apart.numbers["plan_bytes_per_worker"]


def test_dlrm_with_mixed_dims_projects_a_shared_tables_features_alike():
    emb = emb_config("mult", md_alpha=0.5)
    model = materialize(DLRM(ModelConfig(num_dense=3, bottom_mlp=[8], top_mlp=[8]), emb,
                             embedding_device="meta"))  # fmt: skip
    assert {"item_id", "history"} <= set(model.sparse_arch.projections)
    kjt = make_kjt(NAMES, ROWS, batch=4, hot=3)
    logits = WithRawIds(model, emb.layout().qr)(torch.randn(4, 3), kjt)
    assert logits.shape == (4, 1) and torch.isfinite(logits).all()


# --- the reference models read the shared table too ---


@pytest.mark.parametrize("qr", [None, "mult"])
def test_logistic_regression_weighs_a_sharers_ids_by_the_owners_rows(qr):
    emb = emb_config(qr)
    tables = model_tables(ModelConfig(arch="lr"), emb, 2)
    assert [s.name for s in table_specs(tables)] == [s.name for s in table_specs(emb)]
    torch.manual_seed(0)
    model = materialize(build_model(ModelConfig(arch="lr", num_dense=3), emb, 2, "meta"))
    dense, kjt = torch.randn(5, 3), make_kjt(NAMES, ROWS, batch=5, hot=3, seed=1)
    got = WithRawIds(model, emb.layout().qr)(dense, kjt)
    w = {n: t.detach() for n, t in bags(model.sparse_arch).items()}
    c = emb.qr.collisions

    def pooled(f: str, b: int) -> torch.Tensor:
        ids = kjt[f].to_dense()[b].tolist()
        owner = emb.shared.get(f, f)
        if f in ("user", "country") or qr is None:
            return sum(w[f"t_{owner}"][i] for i in ids)
        return sum(w[f"t_{owner}_q"][i // c] for i in ids) * sum(w[f"t_{owner}_r"][i % c]
                                                               for i in ids)  # fmt: skip

    for b in range(5):
        for t in range(2):
            want = model.dense_linear.bias[t] + model.dense_linear.weight[t] @ dense[b]
            want = want + sum(pooled(f, b)[4 * t : 4 * t + 4].sum() for f in NAMES)
            torch.testing.assert_close(got[b, t], want, atol=1e-5, rtol=1e-5)


def test_factorization_machine_builds_and_trains_on_a_shared_table():
    emb = emb_config("add")
    torch.manual_seed(0)
    model = materialize(build_model(ModelConfig(arch="fm", num_dense=3), emb, 1, "meta"))
    assert set(bags(model.sparse_arch)) == {"t_user", "t_item_id_q", "t_item_id_r", "t_country"}
    logits = WithRawIds(model, emb.layout().qr)(torch.randn(4, 3), make_kjt(NAMES, ROWS, 4))
    logits.sum().backward()
    assert logits.shape == (4, 1) and bags(model.sparse_arch)["t_item_id_q"].grad is not None


# --- INT8 export keeps one table for the features that share it ---


@pytest.mark.parametrize(("arch", "qr"), [("dlrm", None), ("dlrm", "mult"), ("lr", "mult")])
def test_int8_export_of_a_shared_table_scores_like_fp32(arch, qr):
    from recsys.serving.export import quantize_and_script

    dense, kjt = torch.randn(64, 3), make_kjt(NAMES, ROWS, batch=64, hot=2, seed=3)

    def model_of(e: EmbeddingConfig) -> torch.nn.Module:
        torch.manual_seed(0)
        cfg = ModelConfig(arch=arch, num_dense=3, bottom_mlp=[8], top_mlp=[8])
        return WithRawIds(materialize(build_model(cfg, e, 1, "meta")), e.layout().qr).eval()

    emb = emb_config(qr)
    model = model_of(emb)
    assert_int8_export_close(copy.deepcopy(model), dense, kjt)
    # the quantized collection holds the shared table once: fewer bytes than two tables
    shared_bytes = quantize_and_script(model, "int8", (dense, kjt))[1]
    apart = model_of(dataclasses.replace(emb, shared={}))
    assert shared_bytes < quantize_and_script(apart, "int8", (dense, kjt))[1]


# --- a prepared folder's meta.json says which features share a table ---


def _meta(**extra) -> dict:
    sparse = {n: {"pooling": "mean" if n in ("item_id", "history") else "sum"} for n in NAMES}
    return {"feature_names": NAMES, "table_sizes": ROWS, "labels": ["click"],
            "schema": {"sparse": sparse, "dense": {}}, **extra}  # fmt: skip


@pytest.mark.parametrize(("meta", "shared"), [(_meta(shared=SHARED), SHARED), (_meta(), {})])
def test_a_prepared_folders_shared_tables_come_into_the_config(monkeypatch, meta, shared):
    from recsys.data import dataset

    monkeypatch.setattr(dataset, "prepared_meta", lambda cfg: meta)
    base = ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": ["p"]}})
    cfg = dataset.resolve(base)
    assert cfg.embeddings.shared == shared  # an older folder without "shared": none
    assert cfg.embeddings.pooling_of("history") == "mean"
    specs = table_specs(cfg.tables)
    assert len(specs) == 4 - len(shared)


def test_table_sizes_a_config_keeps_must_give_a_sharer_its_owners_rows(monkeypatch):
    from recsys.data import dataset

    monkeypatch.setattr(dataset, "prepared_meta", lambda cfg: _meta(shared=SHARED))
    data = {"data": {"source": "prepared", "paths": ["p"]}}
    sized = {"embeddings": {"feature_names": NAMES, "num_embeddings": [50, 200, 200, 20]}}
    cfg = dataset.resolve(ExperimentConfig.from_dict({**data, **sized}))  # a sweep's own sizes
    assert cfg.embeddings.num_embeddings == [50, 200, 200, 20]
    sized["embeddings"]["num_embeddings"] = [50, 200, 300, 20]
    with pytest.raises(ConfigError, match="'history' reads the table of 'item_id'.*history 300"):
        dataset.resolve(ExperimentConfig.from_dict({**data, **sized}))
