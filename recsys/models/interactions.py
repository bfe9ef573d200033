"""Feature interaction ops of DLRM, selectable by name.

Every op takes the bottom-MLP output ``dense: [B, D]`` and the pooled embeddings
``sparse: list of F tensors [B, d_f]`` and returns ``[B, out_dim]``. ``out_dim`` is computed at
construction from the shapes, so the top MLP's input width always follows from the op.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` common dim, ``F' = F + 1`` (dense included).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet


class DotInteraction(nn.Module):
    """Pairwise dot products among ``[dense, e_1..e_F]``, lower triangle, concatenated to dense.

    ``out_dim = D + F'(F'-1)/2``, or ``D + F'(F'+1)/2`` with ``itself=True`` (diagonal kept, as
    facebookresearch/dlrm's ``--arch-interaction-itself``). Requires every ``d_f == D``.
    """

    def __init__(self, num_features: int, dim: int, itself: bool = False) -> None:
        super().__init__()
        n = num_features + 1
        self.offset = 0 if itself else -1
        self.out_dim = dim + (n * (n + 1) // 2 if itself else n * (n - 1) // 2)

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        combined = torch.stack([dense, *sparse], dim=1)  # [B, F', D]
        gram = torch.bmm(combined, combined.transpose(1, 2))  # [B, F', F']
        n = combined.shape[1]
        rows, cols = torch.tril_indices(n, n, offset=self.offset, device=dense.device)
        return torch.cat([dense, gram[:, rows, cols]], dim=1)


class CatInteraction(nn.Module):
    """``[dense, e_1, .., e_F]`` concatenated: ``out_dim = D + sum_f d_f`` (raw dims allowed)."""

    def __init__(self, dim: int, sparse_dims: list[int]) -> None:
        super().__init__()
        self.out_dim = dim + sum(sparse_dims)

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([dense, *sparse], dim=1)


class SumInteraction(nn.Module):
    """``[dense, sum_f e_f]``: ``out_dim = 2 D``. Requires every ``d_f == D``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out_dim = 2 * dim

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([dense, torch.stack(sparse, dim=0).sum(dim=0)], dim=1)


class DCNInteraction(nn.Module):
    """Low-rank cross network (DCN-v2, as in MLPerf DLRM-DCNv2) over ``[dense, e_1..e_F]``.

    ``out_dim = D * F'``. Requires every ``d_f == D``.
    """

    def __init__(self, num_features: int, dim: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        self.out_dim = dim * (num_features + 1)
        self.crossnet = LowRankCrossNet(
            in_features=self.out_dim, num_layers=num_layers, low_rank=low_rank
        )

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        return self.crossnet(torch.cat([dense, *sparse], dim=1))


NEEDS_EQUAL_DIMS = {"dot": True, "sum": True, "dcn": True, "cat": False}


def make_interaction(
    op: str,
    dim: int,
    sparse_dims: list[int],
    *,
    itself: bool = False,
    dcn_layers: int = 2,
    dcn_low_rank: int = 16,
) -> DotInteraction | CatInteraction | SumInteraction | DCNInteraction:
    """Build interaction ``op``; ``sparse_dims`` are the dims the op will see (after projection)."""
    if NEEDS_EQUAL_DIMS.get(op) and any(d != dim for d in sparse_dims):
        raise ValueError(
            f"interaction {op!r} needs every embedding dim == {dim}, got {sparse_dims}"
        )
    num_features = len(sparse_dims)
    if op == "dot":
        return DotInteraction(num_features, dim, itself)
    if op == "cat":
        return CatInteraction(dim, sparse_dims)
    if op == "sum":
        return SumInteraction(dim)
    if op == "dcn":
        return DCNInteraction(num_features, dim, dcn_layers, dcn_low_rank)
    raise ValueError(f"unknown interaction op {op!r}; choose one of {sorted(NEEDS_EQUAL_DIMS)}")
