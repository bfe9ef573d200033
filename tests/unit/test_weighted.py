"""Weighted lists (``embeddings.weighted``): a user's ``history`` of item ids carries a weight per
id (``history_weights`` dwell times) and pools to ``sum_j w_j * E[id_j]``. Checked against manual
lookups, through QR (the remainder weighted as its quotient), DLRM (the weights change the scores;
weights of 1 give the unweighted model's), the reference models, the INT8 export (the scripted
model takes the weights, loaded back from its file) and a prepared folder's ``meta.json``."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import ConfigError, EmbeddingConfig, ExperimentConfig, ModelConfig, QRConfig
from recsys.models import build_model, materialize
from recsys.models.dlrm import WithRawIds
from recsys.models.embeddings import SparseArch, qr_split_kjt
from tests.conftest import make_kjt

NAMES = ["user", "item_id", "history", "country"]
ROWS = [50, 300, 300, 20]
SHARED = {"history": "item_id"}
TOL = 0.01  # |p_int8 - p_fp32| (tests/helpers.py assert_int8_export_close)


def emb_config(qr: str | None = None, weighted: list[str] | None = None, **kw) -> EmbeddingConfig:
    qr_cfg = QRConfig(threshold=100, collisions=7, operation=qr) if qr else QRConfig()  # type: ignore[arg-type]
    return EmbeddingConfig(
        num_embeddings=ROWS,
        dim=8,
        feature_names=NAMES,
        weighted=["history"] if weighted is None else weighted,
        qr=qr_cfg,
        **kw,
    )


def with_weights(
    kjt: KeyedJaggedTensor, seed: int = 0, ones: bool = False, scale: float = 1.0
) -> KeyedJaggedTensor:
    """``kjt`` weighted: ``history``'s ids in ``scale * [0.1, 3)`` (or 1 with ``ones``), the
    others' 1."""
    g = torch.Generator().manual_seed(seed)
    weights = [
        (torch.rand(n, generator=g) * 2.9 + 0.1) * scale
        if k == "history" and not ones
        else torch.ones(n)
        for k, n in zip(kjt.keys(), kjt.length_per_key(), strict=True)
    ]
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=kjt.values(),
        weights=torch.cat(weights),
        lengths=kjt.lengths(),
        stride=kjt.stride(),
    )


def bags(arch: SparseArch) -> dict[str, torch.Tensor]:
    return {n: b.weight.detach() for n, b in arch.embedding_bag_collection.embedding_bags.items()}


# --- the config: weighted features, and sum pooling for every table ---


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weighted": ["histroy"]}, r"embeddings.weighted=\['histroy'\]: 'histroy' is not a feat"),
        ({"weighted": ["history", "history"]}, r"embeddings.weighted=.*\['history'\] named more"),
        (
            {"feature_pooling": {"country": "mean"}},
            r"embeddings.feature_pooling=.*'country' pools by mean, but 'history' is weighted"
            r".*by sum.*weights 1/length",
        ),
        (
            {"feature_pooling": {"history": "mean"}},
            r"embeddings.feature_pooling=.*'history' pools by mean, but 'history' is weighted",
        ),
        ({"pooling": "mean"}, r"embeddings.pooling='mean': 'user' pools by mean, but 'history'"),
    ],
)
def test_what_weights_need_is_refused_naming_the_features(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        emb_config(**kwargs)


def test_mean_pooling_is_fine_without_weights_and_weighted_round_trips():
    emb_config(weighted=[], pooling="mean")
    base = ExperimentConfig.from_dict(
        {"embeddings": {"num_embeddings": ROWS, "feature_names": NAMES}}
    )
    cfg = base.with_overrides({"embeddings.weighted": ["history"]})
    assert cfg.embeddings.weighted == ["history"]
    assert ExperimentConfig.from_dict(cfg.to_dict()).embeddings.weighted == ["history"]
    assert "embeddings.weighted" in ExperimentConfig.all_keys()


# --- a weighted bag pools to sum_j w_j * E[id_j] ---


@pytest.mark.parametrize("shared", [{}, SHARED], ids=["own_table", "shared_table"])
def test_a_weighted_bag_pools_the_weighted_sum_of_its_rows(shared):
    torch.manual_seed(0)
    arch = SparseArch(emb_config(shared=shared))
    plain = SparseArch(emb_config(weighted=[], shared=shared))
    assert arch.embedding_bag_collection.is_weighted()
    assert not plain.embedding_bag_collection.is_weighted()
    kjt = make_kjt(NAMES, ROWS, batch=6, hot=4, seed=1)
    weighted = with_weights(kjt)
    out = dict(zip(NAMES, arch(weighted), strict=True))
    table = bags(arch)["t_" + shared.get("history", "history")]
    hist = weighted["history"]
    for b, (ids, w) in enumerate(zip(hist.to_dense(), hist.to_dense_weights(), strict=True)):
        want = (w[:, None] * table[ids]).sum(0)
        torch.testing.assert_close(out["history"][b], want)
    assert not torch.allclose(out["history"], dict(zip(NAMES, arch(with_weights(kjt, ones=True)),
                                                       strict=True))["history"])  # fmt: skip
    # the unweighted features weigh 1: as the unweighted collection pools them
    for f, got, want in zip(NAMES, arch(weighted), plain(kjt), strict=True):
        if f != "history":
            torch.testing.assert_close(got, want)


def test_a_weighted_bag_trains_its_rows_by_their_weights():
    arch = SparseArch(emb_config())
    kjt = KeyedJaggedTensor(keys=NAMES, values=torch.tensor([3, 5, 7, 9, 1]),
                            weights=torch.tensor([1.0, 1.0, 0.5, 2.5, 1.0]),
                            lengths=torch.tensor([1, 1, 2, 1]), stride=1)  # fmt: skip
    out = dict(zip(NAMES, arch(kjt), strict=True))
    out["history"].sum().backward()
    grad = arch.embedding_bag_collection.embedding_bags["t_history"].weight.grad
    assert grad is not None
    torch.testing.assert_close(grad[7], torch.full((8,), 0.5))
    torch.testing.assert_close(grad[9], torch.full((8,), 2.5))


# --- QR: the remainder ids weigh as their quotients ---


def test_qr_split_keeps_the_weights_and_weighs_a_remainder_as_its_quotient():
    kjt = with_weights(make_kjt(NAMES, ROWS, batch=5, hot=3, seed=3))
    split = qr_split_kjt(kjt, {"item_id": 7, "history": 7})
    scripted = torch.jit.script(qr_split_kjt)(kjt, {"item_id": 7, "history": 7})
    for got in (split, scripted):
        assert got.keys() == [*NAMES, "item_id__qr_r", "history__qr_r"]
        for f in NAMES:
            torch.testing.assert_close(got[f].weights(), kjt[f].weights())
        torch.testing.assert_close(got["history__qr_r"].weights(), kjt["history"].weights())
        torch.testing.assert_close(got["history__qr_r"].values(), kjt["history"].values() % 7)
        torch.testing.assert_close(got["history"].values(), kjt["history"].values() // 7)
    assert qr_split_kjt(make_kjt(NAMES, ROWS, 5), {"history": 7}).weights_or_none() is None


@pytest.mark.parametrize("op", ["mult", "add"])
def test_a_weighted_qr_feature_weighs_both_lookups(op):
    torch.manual_seed(0)
    arch = SparseArch(emb_config(op))
    kjt = with_weights(make_kjt(NAMES, ROWS, batch=4, hot=3, seed=4))
    out = dict(zip(NAMES, arch(qr_split_kjt(kjt, arch.collisions)), strict=True))
    q, r, c = bags(arch)["t_history_q"], bags(arch)["t_history_r"], 7
    hist = kjt["history"]
    for b, (ids, w) in enumerate(zip(hist.to_dense(), hist.to_dense_weights(), strict=True)):
        pq, pr = (w[:, None] * q[ids // c]).sum(0), (w[:, None] * r[ids % c]).sum(0)
        torch.testing.assert_close(out["history"][b], pq * pr if op == "mult" else pq + pr)


# --- the whole model: the weights reach the scores ---

MODEL = {"num_dense": 3, "bottom_mlp": [8], "top_mlp": [8]}


def model_of(emb: EmbeddingConfig, arch: str = "dlrm") -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, **MODEL)  # type: ignore[arg-type]
    return WithRawIds(materialize(build_model(cfg, emb, 1, "meta")), emb.layout().qr).eval()


@pytest.mark.parametrize(("arch", "qr"), [("dlrm", None), ("dlrm", "mult"), ("lr", "add"),
                                          ("fm", None)])  # fmt: skip
def test_weights_change_the_scores_and_ones_give_the_unweighted_models(arch, qr):
    emb = emb_config(qr, shared=SHARED)
    model, plain = model_of(emb, arch), model_of(emb_config(qr, weighted=[], shared=SHARED), arch)
    dense, kjt = torch.randn(16, 3), make_kjt(NAMES, ROWS, batch=16, hot=4, seed=5)
    with torch.no_grad():
        weighted = model(dense, with_weights(kjt))
        other = model(dense, with_weights(kjt, seed=1))
        ones = model(dense, with_weights(kjt, ones=True))
        torch.testing.assert_close(ones, plain(dense, kjt))
    assert (weighted - ones).abs().max() > 1e-3 and (weighted - other).abs().max() > 1e-3


def test_the_loaders_weighted_batch_is_what_the_model_weighs():
    """``to_batch`` of rows with a weighted list: the model's scores equal those of the raw KJT
    weighted by hand."""
    from recsys.data.columns import RaggedColumns
    from recsys.data.input.loader import to_batch

    emb = emb_config("mult", shared=SHARED)
    rng = np.random.default_rng(0)
    lengths = np.stack([np.ones(8, np.int64), np.ones(8, np.int64), rng.integers(0, 5, 8),
                        np.ones(8, np.int64)], axis=1)  # fmt: skip
    values = tuple(rng.integers(0, r, int(lengths[:, f].sum())) for f, r in enumerate(ROWS))
    hist_w = rng.uniform(0.1, 3, int(lengths[:, 2].sum())).astype(np.float32)
    cols = RaggedColumns(rng.normal(size=(8, 3)).astype(np.float32), values, lengths,
                         np.zeros((8, 1)), weights=(None, None, hist_w, None))  # fmt: skip
    batch = to_batch(cols, emb.layout())  # split for training
    raw = KeyedJaggedTensor(keys=NAMES, values=torch.from_numpy(np.concatenate(values)),
                            weights=torch.from_numpy(np.concatenate(
                                [np.ones(len(v), np.float32) if f != 2 else hist_w
                                 for f, v in enumerate(values)])),
                            lengths=torch.from_numpy(lengths.T.reshape(-1)), stride=8)  # fmt: skip
    model = model_of(emb)
    with torch.no_grad():
        got = model.model(batch.dense_features, batch.sparse_features)
        torch.testing.assert_close(got, model(batch.dense_features, raw))


# --- INT8 export: a weighted quantized collection, scripted, saved and loaded back ---


@pytest.mark.parametrize(("arch", "qr"), [("dlrm", None), ("dlrm", "mult"), ("lr", "mult")])
def test_int8_export_of_a_weighted_model_is_close_to_fp32_and_weighs(tmp_path, arch, qr):
    from recsys.serving.export import quantize_and_script

    emb = emb_config(qr, shared=SHARED)
    model = model_of(emb, arch)
    dense, kjt = torch.randn(64, 3), make_kjt(NAMES, ROWS, batch=64, hot=2, seed=6)
    a, b = with_weights(kjt), with_weights(kjt, seed=1, scale=1.5)
    with torch.no_grad():
        want_a, want_b = torch.sigmoid(model(dense, a)), torch.sigmoid(model(dense, b))
    scripted, _ = quantize_and_script(copy.deepcopy(model), "int8", (dense, a))
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    got_a, got_b = torch.sigmoid(loaded(dense, a)), torch.sigmoid(loaded(dense, b))
    assert (got_a - want_a).abs().max() < TOL and (got_b - want_b).abs().max() < TOL
    # the weights reach the exported model: dropped, both batches would score alike (the same ids)
    assert (want_a - want_b).abs().max() > 2e-3 and (got_a - got_b).abs().max() > 2e-3


# --- a prepared folder's meta.json: the weighted lists, and one pooling per table ---


def _meta(sparse: dict, shared: dict | None = None) -> dict:
    meta = {"feature_names": list(sparse), "table_sizes": [ROWS[NAMES.index(n)] for n in sparse],
            "labels": ["click"], "schema": {"sparse": sparse, "dense": {}}}  # fmt: skip
    if shared is not None:
        meta["shared"] = shared
    return meta


def _resolve(monkeypatch, meta: dict) -> ExperimentConfig:
    from recsys.data import dataset

    monkeypatch.setattr(dataset, "prepared_meta", lambda cfg: meta)
    return dataset.resolve(
        ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": ["p"]}})
    )


def test_a_prepared_folders_weighted_lists_come_into_the_config(monkeypatch):
    sparse = {"user": {}, "item_id": {},
              "history": {"multi_hot": True, "table": "item_id", "weights": "history_weights"},
              "country": {"weights": None}}  # fmt: skip
    cfg = _resolve(monkeypatch, _meta(sparse, SHARED))
    assert cfg.embeddings.weighted == ["history"]
    assert cfg.embeddings.shared == SHARED
    assert SparseArch(cfg.tables, device="meta").embedding_bag_collection.is_weighted()
    # an older folder: no "weights" key, nothing weighted
    older = _resolve(monkeypatch, _meta({n: {} for n in NAMES}))
    assert older.embeddings.weighted == []
    # a weighted list beside a mean-pooled list is refused, naming both
    sparse["country"] = {"multi_hot": True, "pooling": "mean"}
    with pytest.raises(ConfigError, match="'country' pools by mean, but 'history' is weighted"):
        _resolve(monkeypatch, _meta(sparse, SHARED))


def test_every_reader_of_a_table_pools_as_its_multi_hot_readers(monkeypatch):
    """A one-hot ``item_id`` (sum) and the multi-hot ``history`` (mean) sharing its table both pool
    by mean (one id: sum == mean); an unshared column keeps its own pooling."""
    sparse = {"user": {"pooling": "mean"}, "item_id": {"pooling": "sum"},
              "history": {"multi_hot": True, "pooling": "mean", "table": "item_id"},
              "country": {"multi_hot": True, "pooling": "sum"}}  # fmt: skip
    cfg = _resolve(monkeypatch, _meta(sparse, SHARED))
    assert cfg.embeddings.feature_pooling == {
        "user": "mean", "item_id": "mean", "history": "mean", "country": "sum"
    }  # fmt: skip
    # the sharer listed first, the multi-hot owner's pooling for a one-hot sharer
    sparse = {"history": {"pooling": "sum", "table": "item_id"},
              "item_id": {"multi_hot": True, "pooling": "mean"}}  # fmt: skip
    cfg = _resolve(monkeypatch, _meta(sparse, SHARED))
    assert cfg.embeddings.feature_pooling == {"history": "mean", "item_id": "mean"}
    # no multi-hot reader: the owner's pooling (sum == mean on one id each)
    sparse = {"item_id": {"pooling": "sum"}, "history": {"pooling": "mean", "table": "item_id"}}
    cfg = _resolve(monkeypatch, _meta(sparse, SHARED))
    assert cfg.embeddings.feature_pooling == {"item_id": "sum", "history": "sum"}


def test_weighted_features_on_data_without_weights_are_refused_before_training():
    """Only a prepared folder's weighted lists carry weights; on synthetic data the weighted
    lookup would fail inside TorchRec at the first batch, so the trainer and the sweep's space
    refuse it first, naming the key and the source."""
    from recsys.data.dataset import check_carried

    cfg = ExperimentConfig().with_overrides({"embeddings.weighted": ["cat_1"]})
    with pytest.raises(
        ConfigError, match=r"embeddings.weighted=\['cat_1'\]: data.source=synthetic"
    ):
        check_carried(cfg)
    check_carried(ExperimentConfig())
