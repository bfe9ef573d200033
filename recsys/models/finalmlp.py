"""FinalMLP (Mao et al., "FinalMLP: An Enhanced Two-Stream MLP Model for CTR Prediction", AAAI
2023) over the same TorchRec tables as DLRM: sharded, QR and mixed dims, weighted bags.

Shapes: ``B`` batch, ``I`` dense features, ``F`` sparse features with pooled widths ``d_f``,
``W = I + sum_f d_f`` the streams' input width, ``T`` tasks, ``H`` heads.

    x   = [dense, e_1, ..., e_F]                                  [B, W]
    g_k = 2 * sigmoid(Gate_k(c_k))          (c_k learnt, [D])     [W]      k = 1, 2
    o_k = MLP_k(x * g_k)                                          [B, d_k]
    y_t = b_t + w1_t . o_1 + w2_t . o_2 + sum_h o_1^h W_{h,t} o_2^h         [B, T]

``o_k^h`` is head ``h`` of ``o_k`` (its ``d_k / H`` values in order). The dense features enter
the streams as they are (log1p or standardised by preparation), where FuxiCTR embeds each numeric
field as a vector: the same choice as DLRM's bottom MLP input. Plain ``nn.Module`` code:
no Ray, no ``torch.distributed``; sharding is applied from outside.
"""

import math

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import EmbeddingConfig, ModelConfig
from recsys.models.embeddings import SparseArch
from recsys.models.mlp import MLP


class FeatureGate(nn.Module):
    """A stream's feature selection: ``x * 2 sigmoid(gate(c))`` for a learnt context ``c``
    (zeros at first, as FuxiCTR's bias context), one factor per input value.

    Args:
        context: the context vector's width (``embeddings.dim``).
        hidden: the gate MLP's hidden widths.
        width: the input width ``W`` it scales.
    """

    def __init__(self, context: int, hidden: list[int], width: int) -> None:
        super().__init__()
        self.context = nn.Parameter(torch.zeros(1, context))
        self.mlp = MLP(context, hidden)
        self.out = nn.Linear(hidden[-1], width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, W]`` -> ``[B, W]``."""
        return x * (2 * torch.sigmoid(self.out(self.mlp(self.context))))


class BilinearFusion(nn.Module):
    """The streams' multi-head bilinear fusion: per task ``t``, ``b_t + w1_t . o_1 + w2_t . o_2
    + sum_h o_1^h W_{h,t} o_2^h``.

    Args:
        d1, d2: the streams' output widths (each divisible by ``heads``).
        heads: ``H``.
        tasks: ``T``.
    """

    def __init__(self, d1: int, d2: int, heads: int, tasks: int) -> None:
        super().__init__()
        self.heads, self.h1, self.h2 = heads, d1 // heads, d2 // heads
        self.linear1 = nn.Linear(d1, tasks)  # its bias: b
        self.linear2 = nn.Linear(d2, tasks, bias=False)
        self.bilinear = nn.Parameter(torch.empty(heads, tasks, self.h1, self.h2))
        # Xavier normal over the [H h1 h2, T] matrix this is (FuxiCTR's initialisation)
        std = math.sqrt(2.0 / (heads * self.h1 * self.h2 + tasks))
        nn.init.normal_(self.bilinear, std=std)

    def forward(self, o1: torch.Tensor, o2: torch.Tensor) -> torch.Tensor:
        """``o1: [B, d1]``, ``o2: [B, d2]`` -> logits ``[B, T]``."""
        x = o1.reshape(o1.shape[0], self.heads, self.h1)
        y = o2.reshape(o2.shape[0], self.heads, self.h2)
        # the weight through a flat view: its gradient then comes back with the strides of the
        # weight's own layout (einsum's has other strides on the dims of size 1, one head or one
        # task: the same memory, but DDP compares strides and warns that the gradient breaks
        # its layout contract); views both ways, no copy
        weight = self.bilinear.view(-1).view(self.bilinear.shape)  # [H, T, h1, h2]
        pairs = torch.einsum("bhi,htij,bhj->bt", x, weight, y)
        return self.linear1(o1) + self.linear2(o2) + pairs


class FinalMLP(nn.Module):
    """Two gated MLP streams over the dense features and the pooled embeddings, fused per head.

    Args:
        model: ``model.finalmlp`` (streams, gates, heads), ``model.norm``, ``model.dropout``.
        embeddings: the tables (rows, dims, QR, dtype); mixed dims are concatenated as they are.
        num_tasks: logits per sample ``T``.
        embedding_device: where the tables are created (``meta``: sharded or materialized later).
        init_seed: seeds the tables' init (``SparseArch``).

    Example::

        model = FinalMLP(ModelConfig(arch="finalmlp", num_dense=13),
                         EmbeddingConfig(num_embeddings=[100] * 26))
        logits = model(dense, kjt)  # dense: [B, 13], kjt: 26 keys -> logits: [B, 1]
    """

    def __init__(
        self,
        model: ModelConfig,
        embeddings: EmbeddingConfig,
        num_tasks: int = 1,
        embedding_device: torch.device | str | None = None,
        init_seed: int = 0,
    ) -> None:
        super().__init__()
        cfg = model.finalmlp
        self.sparse_arch = SparseArch(embeddings, device=embedding_device, init_seed=init_seed,
                                      sequence=model.sequence, dropout=model.dropout)  # fmt: skip
        width = model.num_dense + sum(self.sparse_arch.out_dims)
        self.gate1 = FeatureGate(embeddings.dim, cfg.gate, width)
        self.gate2 = FeatureGate(embeddings.dim, cfg.gate, width)
        self.stream1 = MLP(width, cfg.stream1, model.norm, model.dropout)
        self.stream2 = MLP(width, cfg.stream2, model.norm, model.dropout)
        self.fusion = BilinearFusion(cfg.stream1[-1], cfg.stream2[-1], cfg.heads, num_tasks)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """``dense: [B, I]`` (``[B, 0]`` without dense features), ``sparse``: KJT with the
        layout's keys (QR features split) -> logits ``[B, T]``."""
        x = torch.cat([dense, *self.sparse_arch(sparse)], dim=1)  # [B, W]
        return self.fusion(self.stream1(self.gate1(x)), self.stream2(self.gate2(x)))
