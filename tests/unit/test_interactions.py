"""Interaction ops against explicit math on tiny seeded inputs."""

from __future__ import annotations

import pytest
import torch

from recsys.models.interactions import make_interaction

B, F, D = 3, 4, 5


@pytest.fixture
def inputs() -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, D, generator=g), [torch.randn(B, D, generator=g) for _ in range(F)]


@pytest.mark.parametrize("itself", [False, True])
def test_dot_equals_hand_computed_pairs(inputs, itself):
    dense, sparse = inputs
    out = make_interaction("dot", D, [D] * F, itself=itself)(dense, sparse)
    vecs = [dense, *sparse]
    expected = []
    for i in range(F + 1):  # row-major lower triangle, as torch.tril_indices orders it
        for j in range(i + 1 if itself else i):
            expected.append((vecs[i] * vecs[j]).sum(dim=1))
    expected_full = torch.cat([dense, torch.stack(expected, dim=1)], dim=1)
    n = F + 1
    pairs = n * (n + 1) // 2 if itself else n * (n - 1) // 2
    assert out.shape == (B, D + pairs)
    torch.testing.assert_close(out, expected_full)


def test_cat_and_sum(inputs):
    dense, sparse = inputs
    cat = make_interaction("cat", D, [D] * F)
    torch.testing.assert_close(cat(dense, sparse), torch.cat([dense, *sparse], dim=1))
    assert cat.out_dim == D * (F + 1)
    summed = make_interaction("sum", D, [D] * F)
    torch.testing.assert_close(
        summed(dense, sparse), torch.cat([dense, sparse[0] + sparse[1] + sparse[2] + sparse[3]], 1)
    )
    assert summed.out_dim == 2 * D


def test_cat_with_raw_mixed_dims():
    dense = torch.randn(B, D)
    sparse = [torch.randn(B, 4), torch.randn(B, 8)]
    cat = make_interaction("cat", D, [4, 8])
    assert cat(dense, sparse).shape == (B, cat.out_dim) == (B, D + 12)


def test_dcn_width_and_shape(inputs):
    dense, sparse = inputs
    dcn = make_interaction("dcn", D, [D] * F, dcn_layers=2, dcn_low_rank=3)
    assert dcn(dense, sparse).shape == (B, dcn.out_dim) == (B, D * (F + 1))


@pytest.mark.parametrize("op", ["dot", "sum", "dcn"])
def test_equal_dim_ops_refuse_mixed_dims(op):
    with pytest.raises(ValueError, match="needs every embedding dim"):
        make_interaction(op, D, [D, 8])


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown interaction op 'dott'"):
        make_interaction("dott", D, [D])


# No dense features (``model.num_dense == 0``): the ops run over e_1..e_F alone, the [B, 0] dense
# input ignored.


@pytest.fixture
def embeddings_only() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``dense: [B, 0]`` (what the loader gives without dense features), ``sparse: F x [B, D]``."""
    g = torch.Generator().manual_seed(1)
    return torch.empty(B, 0), [torch.randn(B, D, generator=g) for _ in range(F)]


@pytest.mark.parametrize("itself", [False, True])
def test_dot_without_dense_is_the_pairs_among_embeddings(embeddings_only, itself):
    dense, sparse = embeddings_only
    dot = make_interaction("dot", D, [D] * F, itself=itself, has_dense=False)
    expected = []
    for i in range(F):  # row-major lower triangle over e_1..e_F only, nothing concatenated
        for j in range(i + 1 if itself else i):
            expected.append((sparse[i] * sparse[j]).sum(dim=1))
    pairs = F * (F + 1) // 2 if itself else F * (F - 1) // 2
    assert dot.out_dim == pairs
    torch.testing.assert_close(dot(dense, sparse), torch.stack(expected, dim=1))


def test_cat_and_sum_without_dense(embeddings_only):
    dense, sparse = embeddings_only
    cat = make_interaction("cat", D, [D] * F, has_dense=False)
    torch.testing.assert_close(cat(dense, sparse), torch.cat(sparse, dim=1))
    assert cat.out_dim == D * F
    mixed = make_interaction("cat", D, [4, 8], has_dense=False)
    assert mixed(dense, [torch.randn(B, 4), torch.randn(B, 8)]).shape == (B, mixed.out_dim)
    assert mixed.out_dim == 12
    summed = make_interaction("sum", D, [D] * F, has_dense=False)
    torch.testing.assert_close(summed(dense, sparse), sparse[0] + sparse[1] + sparse[2] + sparse[3])
    assert summed.out_dim == D


def test_dcn_without_dense_is_the_cross_net_over_the_embeddings(embeddings_only):
    """``x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l`` from ``x_0 = [e_1..e_F]: [B, D F]``."""
    dense, sparse = embeddings_only
    dcn = make_interaction("dcn", D, [D] * F, dcn_layers=2, dcn_low_rank=3, has_dense=False)
    net = dcn.crossnet
    with torch.no_grad():
        for b in net.bias:
            b.normal_()  # zeros at init: make the bias count
    x0 = torch.cat(sparse, dim=1)
    x = x0
    for w, v, b in zip(net.W_kernels, net.V_kernels, net.bias, strict=True):
        x = x0 * (x @ v.T @ w.T + b) + x
    assert dcn.out_dim == D * F
    torch.testing.assert_close(dcn(dense, sparse), x)


def test_dot_without_dense_needs_a_pair():
    with pytest.raises(ValueError, match="has no pairs"):
        make_interaction("dot", D, [D], has_dense=False)
    assert make_interaction("dot", D, [D], itself=True, has_dense=False).out_dim == 1


def test_every_configurable_op_is_built():
    """Each op that ``model.interaction`` accepts (``INTERACTIONS``) has its rule and builds."""
    from recsys.config import INTERACTIONS
    from recsys.models.interactions import NEEDS_EQUAL_DIMS, make_interaction

    assert set(NEEDS_EQUAL_DIMS) == set(INTERACTIONS)
    for op in INTERACTIONS:
        assert make_interaction(op, 8, [8, 8, 8]).out_dim > 0
