"""The baseline: DLRM written the way facebookresearch/dlrm's ``dlrm_s_pytorch.py`` does it.

One ``nn.EmbeddingBag(mode="sum", sparse=True)`` per table (two for a QR table, combined after
pooling as its ``QREmbeddingBag``), the same MLPs and interaction as ours, and
``torch.optim.Adagrad`` on everything (sparse gradients for the tables). Inputs are per-table
``(indices, offsets)``, as its ``lS_i`` / ``lS_o``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import EmbeddingConfig, ModelConfig
from recsys.models.embeddings import combine_qr
from recsys.models.interactions import make_interaction


class PlainQREmbeddingBag(nn.Module):
    def __init__(self, rows: int, dim: int, collisions: int, operation: str) -> None:
        super().__init__()
        dq, dr = (dim - dim // 2, dim // 2) if operation == "concat" else (dim, dim)
        self.c, self.operation = collisions, operation
        self.q = nn.EmbeddingBag(math.ceil(rows / collisions), dq, mode="sum", sparse=True)
        self.r = nn.EmbeddingBag(collisions, dr, mode="sum", sparse=True)

    def forward(self, idx: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        q = self.q(torch.div(idx, self.c, rounding_mode="floor"), offsets)
        return combine_qr(q, self.r(torch.remainder(idx, self.c), offsets), self.operation)


class PlainDLRM(nn.Module):
    """``forward(dense [B, I], [(indices, offsets)] * F) -> logits [B, 1]``."""

    def __init__(self, model: ModelConfig, emb: EmbeddingConfig) -> None:
        super().__init__()
        bags: list[nn.Module] = []
        for name, rows in zip(emb.names(), emb.num_embeddings, strict=True):
            if emb.qr.applies_to(rows, name):  # (a table per feature: no shared tables here)
                bags.append(PlainQREmbeddingBag(rows, emb.dim, emb.qr.collisions, emb.qr.operation))
            else:
                bags.append(nn.EmbeddingBag(rows, emb.dim, mode="sum", sparse=True))
        self.emb = nn.ModuleList(bags)
        self.bot = MLP(model.num_dense, [*model.bottom_mlp, emb.dim])
        self.interaction = make_interaction(model.interaction, emb.dim, [emb.dim] * len(bags))
        top_in = self.interaction.out_dim
        self.top = nn.Sequential(
            MLP(top_in, model.top_mlp) if model.top_mlp else nn.Identity(),
            nn.Linear(model.top_mlp[-1] if model.top_mlp else top_in, 1),
        )

    def forward(
        self, dense: torch.Tensor, sparse: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        ly = [bag(idx, off) for bag, (idx, off) in zip(self.emb, sparse, strict=True)]
        return self.top(self.interaction(self.bot(dense), ly))


def to_plain(kjt: KeyedJaggedTensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A KJT as per-table ``(indices, offsets)``."""
    out = []
    for key in kjt.keys():
        jt = kjt[key]
        out.append((jt.values(), jt.offsets()[:-1]))
    return out
