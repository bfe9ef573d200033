"""Feature interaction ops of DLRM, selectable by name.

Every op takes the bottom-MLP output ``dense: [B, D]`` and the pooled embeddings
``sparse: list of F tensors [B, d_f]`` and returns ``[B, out_dim]``. ``out_dim`` is computed at
construction from the shapes, so the top MLP's input width always follows from the op.

Without dense features (``has_dense=False``: ``model.num_dense == 0``, no bottom MLP) an op runs
over ``e_1..e_F`` alone: ``dense`` is ignored (the model passes its ``[B, 0]`` input) and has no
part in ``out_dim``. Whether it is there is fixed at construction, a Python bool: a traced graph
(``torch.fx``, then TorchScript for export) holds one branch only.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` common dim, ``F' = F + 1`` with dense (the
vectors interacted), ``F' = F`` without.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet


class DotInteraction(nn.Module):
    """Pairwise dot products among ``[dense, e_1..e_F]``, lower triangle, concatenated to dense.

    ``out_dim = D + F'(F'-1)/2``, or ``D + F'(F'+1)/2`` with ``itself=True`` (diagonal kept, as
    facebookresearch/dlrm's ``--arch-interaction-itself``). Requires every ``d_f == D``.
    Without dense: the dots among ``e_1..e_F`` alone, ``out_dim = F(F-1)/2`` (``F(F+1)/2``).
    """

    def __init__(
        self, num_features: int, dim: int, itself: bool = False, has_dense: bool = True
    ) -> None:
        super().__init__()
        self.has_dense = has_dense
        n = num_features + 1 if has_dense else num_features
        self.offset = 0 if itself else -1
        pairs = n * (n + 1) // 2 if itself else n * (n - 1) // 2
        self.out_dim = dim + pairs if has_dense else pairs

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        """``dense: [B, D]`` (ignored without dense), ``sparse: F x [B, D]`` -> ``[B, out_dim]``."""
        vectors = [dense, *sparse] if self.has_dense else sparse
        combined = torch.stack(vectors, dim=1)  # [B, F', D]
        gram = torch.bmm(combined, combined.transpose(1, 2))  # [B, F', F']
        n = combined.shape[1]
        rows, cols = torch.tril_indices(n, n, offset=self.offset, device=combined.device)
        if not self.has_dense:
            return gram[:, rows, cols]
        return torch.cat([dense, gram[:, rows, cols]], dim=1)


class CatInteraction(nn.Module):
    """``[dense, e_1, .., e_F]`` concatenated: ``out_dim = D + sum_f d_f`` (raw dims allowed);
    without dense ``[e_1, .., e_F]``: ``out_dim = sum_f d_f``."""

    def __init__(self, dim: int, sparse_dims: list[int], has_dense: bool = True) -> None:
        super().__init__()
        self.has_dense = has_dense
        self.out_dim = (dim if has_dense else 0) + sum(sparse_dims)

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        """``dense: [B, D]`` (ignored without dense), ``sparse: F x [B, d_f]`` ->
        ``[B, out_dim]``."""
        if not self.has_dense:
            return torch.cat(sparse, dim=1)
        return torch.cat([dense, *sparse], dim=1)


class SumInteraction(nn.Module):
    """``[dense, sum_f e_f]``: ``out_dim = 2 D``; without dense ``sum_f e_f``: ``out_dim = D``.
    Requires every ``d_f == D``."""

    def __init__(self, dim: int, has_dense: bool = True) -> None:
        super().__init__()
        self.has_dense = has_dense
        self.out_dim = 2 * dim if has_dense else dim

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        """``dense: [B, D]`` (ignored without dense), ``sparse: F x [B, D]`` -> ``[B, out_dim]``."""
        summed = torch.stack(sparse, dim=0).sum(dim=0)  # [B, D]
        if not self.has_dense:
            return summed
        return torch.cat([dense, summed], dim=1)


class DCNInteraction(nn.Module):
    """Low-rank cross network (DCN-v2, as in MLPerf DLRM-DCNv2) over ``[dense, e_1..e_F]``, or
    over ``[e_1..e_F]`` without dense; ``dropout > 0``: its output is dropped out in training
    (``nn.Dropout``), before the top MLP.

    ``out_dim = D * F'``. Requires every ``d_f == D``.
    """

    def __init__(
        self,
        num_features: int,
        dim: int,
        num_layers: int,
        low_rank: int,
        has_dense: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.has_dense = has_dense
        self.out_dim = dim * (num_features + 1 if has_dense else num_features)
        self.crossnet = LowRankCrossNet(
            in_features=self.out_dim, num_layers=num_layers, low_rank=low_rank
        )
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        """``dense: [B, D]`` (ignored without dense), ``sparse: F x [B, D]`` -> ``[B, D F']``."""
        if not self.has_dense:
            return self.dropout(self.crossnet(torch.cat(sparse, dim=1)))
        return self.dropout(self.crossnet(torch.cat([dense, *sparse], dim=1)))


NEEDS_EQUAL_DIMS = {"dot": True, "sum": True, "dcn": True, "cat": False}


def make_interaction(
    op: str,
    dim: int,
    sparse_dims: list[int],
    *,
    itself: bool = False,
    dcn_layers: int = 2,
    dcn_low_rank: int = 16,
    has_dense: bool = True,
    dropout: float = 0.0,
) -> DotInteraction | CatInteraction | SumInteraction | DCNInteraction:
    """Build interaction ``op``; ``sparse_dims`` are the dims the op will see (after projection);
    ``has_dense=False``: no dense vector, the op runs over the embeddings alone; ``dropout``:
    ``dcn``'s dropout on its output (the other ops have no tower and ignore it). An op with
    nothing to output (``dot`` over one embedding, without dense or ``itself``) is refused."""
    if NEEDS_EQUAL_DIMS.get(op) and any(d != dim for d in sparse_dims):
        raise ValueError(
            f"interaction {op!r} needs every embedding dim == {dim}, got {sparse_dims}"
        )
    num_features = len(sparse_dims)
    if op == "dot":
        if not has_dense and not itself and num_features < 2:
            raise ValueError(
                f"interaction 'dot' without dense features over {num_features} embedding(s) "
                "has no pairs to output: use interaction_itself, another op or more features"
            )
        return DotInteraction(num_features, dim, itself, has_dense)
    if op == "cat":
        return CatInteraction(dim, sparse_dims, has_dense)
    if op == "sum":
        return SumInteraction(dim, has_dense)
    if op == "dcn":
        return DCNInteraction(num_features, dim, dcn_layers, dcn_low_rank, has_dense, dropout)
    raise ValueError(f"unknown interaction op {op!r}; choose one of {sorted(NEEDS_EQUAL_DIMS)}")
