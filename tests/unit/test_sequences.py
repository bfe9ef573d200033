"""User sequences (``sparse.<col>.sequence``, ``embeddings.sequences``, ``model.sequence``): a
history's most recent items in time order, one KJT key per position; the sum, DIN's target
attention and BST's transformer equal their equations written out here from the model's own
weights, row by row; the model exports to INT8 TorchScript with QR on the history's table; bad
schemas, configs and rows are refused by name."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.config import (
    ConfigError,
    EmbeddingConfig,
    ExperimentConfig,
    ModelConfig,
    QRConfig,
    SparseLayout,
)
from recsys.configlib import from_dict
from recsys.data.columns import RaggedColumns
from recsys.data.dataset import check_carried
from recsys.data.errors import DataError
from recsys.data.input.loader import ragged_kjt, to_batch
from recsys.data.schema import DatasetSchema
from recsys.models import build_model, materialize
from recsys.models.dlrm import WithRawIds
from tests.helpers import assert_int8_export_close

NAMES = ["item_id", "history", "country"]
ROWS = [30, 30, 10]
L = 4
HISTORIES = [[3, 5, 7, 9, 11, 13], [2], [], [4, 6, 8, 10], [29, 1]]  # oldest item first


def columns(histories: list[list[int]] = HISTORIES) -> RaggedColumns:
    n = len(histories)
    rng = np.random.default_rng(0)
    items, countries = rng.integers(0, 30, n), rng.integers(0, 10, n)
    lengths = np.stack([np.ones(n, np.int64), [len(h) for h in histories], np.ones(n, np.int64)], 1)
    values = (items, np.array([i for h in histories for i in h], np.int64), countries)
    return RaggedColumns(rng.normal(size=(n, 2)).astype(np.float32), values, lengths,
                         np.zeros((n, 1), np.float32))  # fmt: skip


def tables(qr: bool = False, dim: int = 8) -> EmbeddingConfig:
    return EmbeddingConfig(
        num_embeddings=ROWS, dim=dim, feature_names=NAMES, shared={"history": "item_id"},
        sequences={"history": L}, sequence_targets={"history": "item_id"},
        qr=QRConfig(threshold=20, collisions=7) if qr else QRConfig(),
    )  # fmt: skip


def model_of(pooling: str, heads: int = 1, qr: bool = False) -> torch.nn.Module:
    sequence = {"pooling": pooling, "attention_mlp": [6, 5], "heads": heads}
    cfg = from_dict(ModelConfig, {"num_dense": 2, "bottom_mlp": [4], "top_mlp": [4],
                                  "sequence": sequence})  # fmt: skip
    torch.manual_seed(0)
    return materialize(build_model(cfg, tables(qr), 1, "meta")).eval()


def test_a_sequences_positions_hold_its_latest_items_most_recent_first():
    kjt = ragged_kjt(columns(), tables().layout())
    assert kjt.keys() == ["item_id", "history@0", "history@1", "history@2", "history@3",
                          "country"]  # fmt: skip
    for j in range(L):
        got = kjt[f"history@{j}"]
        want = [h[-1 - j] for h in HISTORIES if len(h) > j]
        assert got.values().tolist() == want
        assert got.lengths().tolist() == [int(len(h) > j) for h in HISTORIES]
    assert kjt.length_per_key() == [5, 4, 3, 2, 2, 5]  # from the host: no device sync


def test_with_qr_every_position_is_split():
    layout = tables(qr=True).layout()
    kjt = ragged_kjt(columns(), layout)
    positions = [f"history@{j}" for j in range(L)]
    assert kjt.keys() == [*layout.id_keys(), "item_id__qr_r", *(k + "__qr_r" for k in positions)]
    assert kjt["history@0__qr_r"].values().tolist() == [13 % 7, 2 % 7, 10 % 7, 1 % 7]
    assert kjt["history@0"].values().tolist() == [13 // 7, 2 // 7, 10 // 7, 1 // 7]


def by_hand(model: torch.nn.Module, b: int, pooling: str) -> torch.Tensor:
    """Row ``b``'s pooled history from the equations, the items read from the table."""
    arch = model.sparse_arch
    table = arch.embedding_bag_collection.embedding_bags["t_item_id"].weight.detach()
    cols = columns()
    e = table[list(reversed(HISTORIES[b][-L:]))]  # [n, d], most recent first
    t = table[int(cols.values[0][b])]
    if pooling == "sum":
        return e.sum(0)
    if pooling == "attention":
        score = arch.poolings["history"].score
        out = torch.zeros_like(t)
        for item in e:
            x = torch.cat([item, t, item - t, item * t])
            for layer in score:
                x = layer(x.unsqueeze(0)).squeeze(0)  # Linear and PReLU, one vector
            out = out + x[0] * item  # not normalised: DIN's weights
        return out
    return transformer_by_hand(arch.poolings["history"], t, e)


def transformer_by_hand(pool: torch.nn.Module, t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """BST's layer for the target token: attention over the target and the row's items only."""
    layer = pool.layer
    x = torch.cat([t[None], e]) + pool.position[: len(e) + 1]  # [n + 1, d]
    d = x.shape[1]
    heads = layer.self_attn.num_heads
    wq, wk, wv = layer.self_attn.in_proj_weight.chunk(3)
    bq, bk, bv = layer.self_attn.in_proj_bias.chunk(3)
    q, k, v = x[0] @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    h = d // heads
    parts = []
    for i in range(heads):
        s = slice(i * h, (i + 1) * h)
        a = torch.softmax(k[:, s] @ q[s] / math.sqrt(h), 0)
        parts.append(a @ v[:, s])
    attn = layer.self_attn.out_proj(torch.cat(parts))
    y = layer.norm1(x[0] + attn)
    return layer.norm2(y + layer.linear2(torch.relu(layer.linear1(y))))


POOLINGS = [("sum", 1), ("attention", 1), ("transformer", 1), ("transformer", 2)]


@pytest.mark.parametrize(("pooling", "heads"), POOLINGS)
def test_each_pooling_equals_its_equations(pooling, heads):
    model = model_of(pooling, heads)
    kjt = ragged_kjt(columns(), tables().layout())
    with torch.no_grad():
        pooled = model.sparse_arch(kjt)[1]  # [B, d]: history's
        for b in range(len(HISTORIES)):
            want = by_hand(model, b, pooling)
            torch.testing.assert_close(pooled[b], want, atol=1e-5, rtol=1e-4)
    if pooling == "attention":
        assert pooled[2].abs().max() == 0  # no history: nothing to attend to


@pytest.mark.parametrize("pooling", ["attention", "transformer"])
def test_it_exports_as_int8_torchscript_with_qr_on_the_history_table(pooling):
    model = model_of(pooling, qr=True)
    raw = SparseLayout(NAMES, ROWS, sequences={"history": L})  # serving's: raw ids by position
    histories = [list(np.random.default_rng(i).integers(0, 30, i % 9)) for i in range(64)]
    batch = to_batch(columns(histories), raw)
    wrapped = WithRawIds(model, tables(qr=True).layout().split()).eval()
    assert_int8_export_close(wrapped, batch.dense_features, batch.sparse_features)


def test_a_dlrm_with_target_attention_learns_which_history_matches_the_candidate():
    """Clicked when the candidate is among the last two history items: attention pooling fits
    it where the history's sum cannot tell which item is the candidate."""
    from recsys.config import LossConfig
    from recsys.models import ModelAndLoss

    rng = np.random.default_rng(1)
    n = 512
    histories = [list(rng.integers(1, 30, rng.integers(2, 7))) for _ in range(n)]
    cols = columns(histories)
    items = rng.integers(1, 30, n)
    hit = rng.random(n) < 0.5
    items[hit] = [h[-1 - rng.integers(0, 2)] for h, m in zip(histories, hit, strict=True) if m]
    items[~hit] = [next(i for i in rng.integers(1, 30, 50) if i not in h[-2:])
                   for h, m in zip(histories, hit, strict=True) if not m]  # fmt: skip
    cols = RaggedColumns(cols.dense, (items, *cols.values[1:]), cols.lengths,
                         hit[:, None].astype(np.float32))  # fmt: skip
    batch = to_batch(cols, tables().layout())
    model = ModelAndLoss(model_of("attention").train(), LossConfig())
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(150):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.3  # the chance level is log 2 = 0.69


# ---------------------------------------------------------------------------------------------
# Refusals


def base_schema(history: dict) -> dict:
    return {
        "labels": ["click"],
        "sparse": {"item_id": {}, "category": {}, "tags": {"multi_hot": True},
                   "history": {"multi_hot": True, "table": "item_id", **history}},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ({"multi_hot": False, "sequence": {}}, "a sequence is a list: multi_hot: true"),
        ({"max_len": 5, "sequence": {}}, "sparse.history.max_len=5: not with sequence"),
        ({"pooling": "mean", "sequence": {}}, "sparse.history.pooling='mean': not with sequence"),
        ({"sequence": {"max_len": 0}}, "sequence.max_len=0: must be >= 1"),
        ({"sequence": {"target": "category"}}, "must share the sequence's table (item_id)"),
        ({"sequence": {"target": "tags"}}, "the target is the row's candidate: a one-hot"),
        ({"sequence": {"target": "item"}}, "not another sparse column (did you mean 'item_id'?)"),
        ({"sequence": {"order_by": "item_id"}}, "is already used"),
    ],
)
def test_a_bad_sequence_in_a_schema_is_refused_by_name(history, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DatasetSchema.from_dict(base_schema(history))


def test_attention_needs_a_target_and_the_transformers_heads_divide_the_width():
    emb = {"num_embeddings": ROWS, "dim": 8, "feature_names": NAMES,
           "shared": {"history": "item_id"}, "sequences": {"history": L}}  # fmt: skip
    with pytest.raises(ConfigError, match="attention pooling compares sequence 'history'"):
        ExperimentConfig.from_dict({"embeddings": emb})
    ExperimentConfig.from_dict({"embeddings": emb, "model": {"sequence": {"pooling": "sum"}}})
    ExperimentConfig.from_dict({"embeddings": emb, "model": {"arch": "lr"}})  # sums: no target
    emb["sequence_targets"] = {"history": "item_id"}
    transformer = {"sequence": {"pooling": "transformer", "heads": 3}}
    with pytest.raises(ConfigError, match="model.sequence.heads=3: sequence 'history' is 8 wide"):
        ExperimentConfig.from_dict({"embeddings": emb, "model": transformer})
    with pytest.raises(
        ConfigError, match="'history' reads the table of 'item_id', 'country' that of 'country'"
    ):
        EmbeddingConfig(**{**emb, "sequence_targets": {"history": "country"}})
    clash = {**emb, "feature_names": ["item_id", "history", "history@2"]}
    with pytest.raises(ConfigError, match=r"\['history@2'\] would be both a feature and one of"):
        EmbeddingConfig(**clash)
    sequence_cfg = {"embeddings": {**emb, "sequence_targets": {"history": "item_id"}}}
    with pytest.raises(ConfigError, match="data.source=synthetic carries no ordered lists"):
        check_carried(ExperimentConfig.from_dict(sequence_cfg))


def test_order_times_that_do_not_match_the_items_are_refused_naming_column_and_row(tmp_path):
    from recsys.prepare.pipeline import prepare

    schema = DatasetSchema.from_dict({
        "labels": ["click"], "split": {"val_fraction": 0.0, "test_fraction": 0.0},
        "sparse": {"item_id": {},
                   "history": {"multi_hot": True, "table": "item_id",
                               "sequence": {"max_len": 2, "order_by": "history_ts"}}},
    })  # fmt: skip
    frame = pd.DataFrame({
        "click": [0, 1, 0], "item_id": ["a", "b", "c"],
        "history": [["a", "b"], ["c"], ["a", "b", "c"]],
        "history_ts": [[1.0, 2.0], [5.0], [3.0, 1.0]],
    })  # fmt: skip
    frame.to_parquet(tmp_path / "log.parquet")
    with pytest.raises(DataError, match=r"history_ts.*row 2.*as many times as history has ids"):
        prepare(schema, [str(tmp_path / "log.parquet")], str(tmp_path / "out"), workers=0,
                log=lambda s: None)  # fmt: skip
    assert not (tmp_path / "out" / "meta.json").exists()


def test_prepared_and_served_rows_keep_the_latest_items_by_time(tmp_path):
    """``order_by`` sorts each history (ties in the list's order) before the most recent
    ``max_len`` are kept; preparation and serving give the same position keys."""
    from recsys.data.prepared.folder import load_splits
    from recsys.prepare.like import load_fitted
    from recsys.prepare.pipeline import prepare
    from recsys.serving.scorer import tabular_batch

    schema = DatasetSchema.from_dict({
        "labels": ["click"], "split": {"by": "order", "val_fraction": 0.0, "test_fraction": 0.0},
        "sparse": {"item_id": {"identity": True, "hash_buckets": 100},
                   "history": {"multi_hot": True, "table": "item_id",
                               "sequence": {"max_len": 2, "order_by": "history_ts",
                                            "target": "item_id"}}},
    })  # fmt: skip
    frame = pd.DataFrame({
        "click": [0, 1, 0, 1], "item_id": [1, 2, 3, 4],
        "history": [[5, 7, 9], [8], [], [11, 12, 13]],
        "history_ts": [[30.0, 10.0, 20.0], [4.0], [], [7.0, 7.0, 6.0]],
    })  # fmt: skip
    frame.to_parquet(tmp_path / "log.parquet")
    out = str(tmp_path / "out")
    prepare(schema, [str(tmp_path / "log.parquet")], out, workers=0, log=lambda s: None)
    layout = SparseLayout(["item_id", "history"], [100, 100], sequences={"history": 2})
    prepared = to_batch(load_splits([out], 0, [100, 100]).train.read(0, 4), layout)
    served = tabular_batch(frame.drop(columns=["click"]), load_fitted(out), [100, 100])
    for kjt in (prepared.sparse_features, served.sparse_features):
        # time order: [7, 9, 5], [8], [], [13, 11, 12] (11 and 12 tie: list order)
        assert kjt["history@0"].values().tolist() == [5, 8, 12]
        assert kjt["history@1"].values().tolist() == [9, 11]
        assert kjt["history@1"].lengths().tolist() == [1, 0, 0, 1]


# ---------------------------------------------------------------------------------------------
# The logs with histories


def test_the_demo_logs_history_times_run_newest_first_before_the_event(tmp_path):
    import pyarrow.parquet as pq

    from tests.conftest import write_demo

    files = write_demo(str(tmp_path), rows=400, files=1)
    t = pq.read_table(files[0]).to_pandas()
    for ts, items, event in zip(t["history_ts"], t["history"], t["event_ts"], strict=True):
        assert len(ts) == len(items)
        assert all(a > b for a, b in itertools.pairwise(ts))  # newest first
        assert len(ts) == 0 or ts[0] < event.timestamp()


def test_the_planted_history_log_prepares_and_its_click_depends_on_the_recent_items(tmp_path):
    """The same seed gives the same rows; the oracle is far above chance; the schema's sequence
    keeps the latest items by time (the list is newest first)."""
    from recsys.data.prepared.folder import load_splits
    from recsys.demo import histories, planted
    from recsys.prepare.pipeline import prepare

    a, b = histories.table(3000), histories.table(3000)
    assert a.equals(b)
    frame = a.to_pandas()
    assert planted.oracle_auc(frame) > 0.75
    path = histories.write(str(tmp_path / "raw"), 3000)
    schema = DatasetSchema.from_dict(histories.schema_dict())
    meta = prepare(schema, [str(tmp_path / "raw")], str(tmp_path / "out"), workers=0,
                   log=lambda s: None)  # fmt: skip
    assert path.endswith("log.parquet") and meta["schema"]["sparse"]["history"]["sequence"]
    train = load_splits([str(tmp_path / "out")], 0, meta["table_sizes"]).train
    cols = train.read(0, 50)
    lengths = cols.lengths[:, 2]
    assert lengths.max() == histories.RECENT and (lengths <= histories.RECENT).all()
    assert (lengths == np.minimum([len(h) for h in frame["history"][:50]], 8)).all()
