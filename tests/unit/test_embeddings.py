"""QR and mixed-dim embeddings against manual lookups."""

from __future__ import annotations

import math

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import ConfigError, EmbeddingConfig, QRConfig, md_dims
from recsys.models import embedding_report, materialize
from recsys.models.embeddings import SparseArch, qr_split_kjt, table_specs
from tests.conftest import make_kjt


def lookup(arch: SparseArch, kjt: KeyedJaggedTensor) -> list[torch.Tensor]:
    """The arch on raw ids: QR features split first, as the data path (or export) does."""
    return arch(qr_split_kjt(kjt, arch.collisions))


def weights(arch: SparseArch, table: str) -> torch.Tensor:
    return arch.embedding_bag_collection.embedding_bags[table].weight.detach()


def one_hot_kjt(keys: list[str], ids: list[list[int]]) -> KeyedJaggedTensor:
    """Feature f of sample b holds the single id ids[f][b]."""
    flat = [i for per_key in ids for i in per_key]
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor(flat),
        lengths=torch.ones(len(flat), dtype=torch.long),
        stride=len(ids[0]),
    )


@pytest.mark.parametrize("op", ["mult", "add", "concat"])
def test_qr_lookup_equals_manual(op):
    rows, c = 103, 8  # 103 is not a multiple of 8: the last quotient row is partial
    cfg = EmbeddingConfig(
        num_embeddings=[rows, 5], dim=16, qr=QRConfig(threshold=50, collisions=c, operation=op)
    )
    torch.manual_seed(0)
    arch = SparseArch(cfg)
    ids = [0, 1, 7, 8, 55, rows - 1]  # table edges included
    out = lookup(arch, one_hot_kjt(["cat_0", "cat_1"], [ids, [0, 1, 2, 3, 4, 4]]))
    q, r = weights(arch, "t_cat_0_q"), weights(arch, "t_cat_0_r")
    assert q.shape[0] == math.ceil(rows / c) and r.shape[0] == c
    for b, i in enumerate(ids):
        qi, ri = q[i // c], r[i % c]
        expected = {"mult": qi * ri, "add": qi + ri, "concat": torch.cat([qi, ri])}[op]
        torch.testing.assert_close(out[0][b], expected)
    # the small table is untouched: a plain lookup
    torch.testing.assert_close(out[1], weights(arch, "t_cat_1")[[0, 1, 2, 3, 4, 4]])


def test_qr_multi_hot_combines_after_pooling():
    """Documented choice (dlrm issue 366): pool each table, then combine."""
    cfg = EmbeddingConfig(
        num_embeddings=[64], dim=8, qr=QRConfig(threshold=10, collisions=4, operation="mult")
    )
    torch.manual_seed(0)
    arch = SparseArch(cfg)
    kjt = KeyedJaggedTensor(
        keys=["cat_0"], values=torch.tensor([5, 22]), lengths=torch.tensor([2]), stride=1
    )
    q, r = weights(arch, "t_cat_0_q"), weights(arch, "t_cat_0_r")
    pooled_then_mult = (q[1] + q[5]) * (r[1] + r[2])
    torch.testing.assert_close(lookup(arch, kjt)[0][0], pooled_then_mult)
    per_id = q[1] * r[1] + q[5] * r[2]
    assert not torch.allclose(pooled_then_mult, per_id)


@pytest.mark.parametrize("op", ["add", "concat"])
def test_qr_multi_hot_linear_ops_equal_per_id_combine(op):
    cfg = EmbeddingConfig(
        num_embeddings=[64], dim=8, qr=QRConfig(threshold=10, collisions=4, operation=op)
    )
    arch = SparseArch(cfg)
    kjt = KeyedJaggedTensor(
        keys=["cat_0"], values=torch.tensor([5, 22, 63]), lengths=torch.tensor([3]), stride=1
    )
    q, r = weights(arch, "t_cat_0_q"), weights(arch, "t_cat_0_r")
    per = [(q[i // 4], r[i % 4]) for i in (5, 22, 63)]
    if op == "add":
        expected = sum(a + b for a, b in per)
    else:
        expected = torch.cat([sum(a for a, _ in per), sum(b for _, b in per)])
    torch.testing.assert_close(lookup(arch, kjt)[0][0], expected)


def test_qr_split_kjt_keeps_lengths_and_order():
    kjt = make_kjt(["a", "b"], [100, 10], batch=3, hot=3)
    split = qr_split_kjt(kjt, {"a": 7})
    assert split.keys() == ["a", "b", "a__qr_r"]
    a, b, ar = (split[k] for k in ["a", "b", "a__qr_r"])
    orig = kjt["a"].values()
    torch.testing.assert_close(a.values(), orig // 7)
    torch.testing.assert_close(ar.values(), orig % 7)
    torch.testing.assert_close(ar.lengths(), kjt["a"].lengths())
    torch.testing.assert_close(b.values(), kjt["b"].values())


def test_qr_param_counts_match_formula():
    rows, c, d = [1000, 20, 333], 10, 8
    cfg = EmbeddingConfig(num_embeddings=rows, dim=d, qr=QRConfig(threshold=100, collisions=c))
    rep = embedding_report(cfg)
    expected = (math.ceil(1000 / c) + c) * d + 20 * d + (math.ceil(333 / c) + c) * d
    assert rep.params == expected
    assert rep.params_full == sum(rows) * d
    assert rep.bytes == expected * 4
    assert [t.name for t in rep.tables] == [
        "t_cat_0_q",
        "t_cat_0_r",
        "t_cat_1",
        "t_cat_2_q",
        "t_cat_2_r",
    ]


def test_qr_off_builds_one_table_per_feature():
    cfg = EmbeddingConfig(num_embeddings=[1000, 20], dim=8)
    assert [s.name for s in table_specs(cfg)] == ["t_cat_0", "t_cat_1"]
    assert embedding_report(cfg).compression == 1.0


def test_md_rule_gives_documented_dims():
    assert md_dims([10, 1000, 100000], dim=64, alpha=0.5) == [64, 8, 4]
    assert md_dims([100, 400, 1600], dim=32, alpha=0.5) == [32, 16, 8]
    assert md_dims([5, 5000], dim=16, alpha=0.0) == [16, 16]
    cfg = EmbeddingConfig(num_embeddings=[100, 400, 1600], dim=32, md_alpha=0.5)
    assert cfg.table_dims() == [32, 16, 8] and cfg.mixed


def test_mixed_dims_project_to_common_dim():
    cfg = EmbeddingConfig(num_embeddings=[10, 20], dim=16, dims=[16, 8])
    arch = SparseArch(cfg, project_to=16)
    out = arch(make_kjt(["cat_0", "cat_1"], [10, 20], batch=4))
    assert [o.shape for o in out] == [(4, 16), (4, 16)]
    assert list(arch.projections) == ["cat_1"]


def test_meta_build_then_materialize():
    cfg = EmbeddingConfig(num_embeddings=[10, 20], dim=8)
    arch = SparseArch(cfg, device="meta")
    assert all(p.is_meta for p in arch.parameters())
    materialize(arch)
    w = weights(arch, "t_cat_0")
    assert not w.is_meta and w.abs().max() <= math.sqrt(1 / 10) and w.abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_embeddings": []}, "needs at least one table"),
        ({"num_embeddings": [10, 0]}, r"num_embeddings\[1\]=0"),
        ({"dim": 6}, "embeddings.dim=6"),
        ({"dims": [8]}, "needs 8 dims"),
        ({"qr": QRConfig(threshold=5, collisions=4, operation="concat"), "dim": 12}, "% 8"),
        ({"dims": [8] * 8, "md_alpha": 0.5}, "exclusive"),
    ],
)
def test_bad_embedding_configs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EmbeddingConfig(**kwargs)


def test_bad_qr_configs():
    with pytest.raises(ConfigError, match="qr.collisions=0"):
        QRConfig(threshold=10, collisions=0)
    with pytest.raises(ConfigError, match="qr.operation='max'"):
        QRConfig(operation="max")  # type: ignore[arg-type]


def test_tables_are_data_parallel_only_where_pinned_and_half_tables_never():
    from recsys.config import ShardingConfig, TableSharding
    from recsys.distributed.sharding import constraints

    for half in (True, False):
        free = constraints(ShardingConfig(), ["t_a", "t_b"], "cpu", half=half)
        assert [c.sharding_types for c in free.values()] == [["table_wise", "column_wise"]] * 2
    pinned = ShardingConfig(tables={"t_a": TableSharding(["data_parallel"])})
    assert constraints(pinned, ["t_a"], "cpu")["t_a"].sharding_types == ["data_parallel"]
    dp = ShardingConfig(tables={"t_a": TableSharding(["data_parallel"])})
    with pytest.raises(
        ConfigError,
        match=r"sharding.tables.t_a: data_parallel \(the dense kernel\) cannot hold fp16",
    ):
        constraints(dp, ["t_a"], "cpu", half=True)
