"""Pooling a user's sequence (``embeddings.sequences``) into one feature: a sum, DIN's target
attention, or BST's transformer over the items and the target (``model.sequence``).

Each pooler takes the sequence's ``L`` position lookups, most recent first, ``items [B, L, d]``
(zeros past a row's history), the positions a row has, ``mask [B, L]`` bool, and the target's
lookup ``target [B, d]`` (the row's candidate, from the same table), and returns ``[B, d]``.

Plain ``nn.Module`` code, as ``recsys.models.dlrm``: no Ray, no ``torch.distributed``.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.config import SequenceConfig


class SumPooling(nn.Module):
    """``sum_j mask_j e_j``: the history as a multi-hot bag."""

    def forward(
        self, items: torch.Tensor, mask: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        return (items * mask.unsqueeze(-1).to(items.dtype)).sum(1)


class TargetAttention(nn.Module):
    """DIN's local activation unit (Zhou et al., KDD 2018, eq. 3): ``a_j = MLP([e_j, t, e_j - t,
    e_j * t])`` (PReLU hidden layers, a linear score), ``out = sum_j mask_j a_j e_j``; the
    scores are not normalised (no softmax), as the paper's.

    Args:
        dim: ``d``, the items' and the target's width.
        hidden: the scoring MLP's hidden widths.
    """

    def __init__(self, dim: int, hidden: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 4 * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.PReLU(h)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.score = nn.Sequential(*layers)

    def forward(
        self, items: torch.Tensor, mask: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        b, length, d = items.shape
        t = target.unsqueeze(1).expand(b, length, d)
        pairs = torch.cat([items, t, items - t, items * t], dim=2)  # [B, L, 4d]
        scores = self.score(pairs.reshape(b * length, 4 * d)).reshape(b, length)  # [B, L]
        weights = scores * mask.to(scores.dtype)
        return (weights.unsqueeze(-1) * items).sum(1)


class TargetTransformer(nn.Module):
    """BST's behaviour sequence transformer (Chen et al., 2019), one layer: the target (position
    0) and the items (positions ``1..L``, most recent first), each plus a learnt position
    embedding, through one ``TransformerEncoderLayer`` (``heads`` heads, feed-forward ``4d``,
    post-norm, ``dropout``); the row's missing positions are masked as keys; the output is the
    target's output vector ``[B, d]``.

    Args:
        dim: ``d``. max_len: ``L``. heads: attention heads (divide ``d``). dropout: as
            ``model.dropout``.
    """

    def __init__(self, dim: int, max_len: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.empty(max_len + 1, dim).normal_(0.0, 0.02))
        self.layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, dropout=dropout, batch_first=True
        )

    def forward(
        self, items: torch.Tensor, mask: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        tokens = torch.cat([target.unsqueeze(1), items], dim=1) + self.position  # [B, L + 1, d]
        keep = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        return self.layer(tokens, src_key_padding_mask=~keep)[:, 0]


def make_pooling(cfg: SequenceConfig | None, dim: int, max_len: int, dropout: float) -> nn.Module:
    """The pooler of one sequence ``dim`` wide and ``max_len`` long (``None``: a sum, the
    reference models')."""
    if cfg is None or cfg.pooling == "sum":
        return SumPooling()
    if cfg.pooling == "attention":
        return TargetAttention(dim, cfg.attention_mlp)
    return TargetTransformer(dim, max_len, cfg.heads, dropout)


LEAF_MODULES = ["TargetTransformer"]  # traced for export as one call (its fast-path checks are
# Python control flow on tensors, which torch.fx cannot trace; TorchScript scripts it whole)
