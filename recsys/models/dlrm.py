"""DLRM over TorchRec types: ``KeyedJaggedTensor`` in, logits out.

Plain ``nn.Module`` code: no Ray, no ``torch.distributed``. The same model runs unsharded in a unit
test and sharded by ``DistributedModelParallel`` in a worker (sharding is applied from outside, by
``recsys.distributed``).

Shapes: ``B`` batch, ``I`` dense features, ``F`` sparse features, ``D`` common embedding dim,
``T`` tasks.

Without dense features (``model.num_dense == 0``: ``I = 0``) there is no bottom MLP: the
interaction runs over the ``F`` embeddings alone (``recsys.models.interactions``) and the
``[B, 0]`` dense input is ignored. Decided at construction: a traced model holds one path only.
"""

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import EmbeddingConfig, ModelConfig
from recsys.models.embeddings import SparseArch, qr_split_kjt
from recsys.models.interactions import NEEDS_EQUAL_DIMS, make_interaction
from recsys.models.mlp import MLP
from recsys.models.multitask import task_layers


class DLRM(nn.Module):
    """Bottom MLP, embedding tables, an interaction, a top MLP; no bottom MLP when
    ``model.num_dense == 0`` (the interaction is over the embeddings alone, ``bottom_mlp`` unused).

    Every MLP layer is ``Linear -> norm -> ReLU -> dropout`` (``recsys.models.mlp``; ``model.norm``
    and ``model.dropout``), the bottom MLP's ``D``-wide output layer included; the top MLP's final
    ``Linear`` to the ``T`` logits has neither. ``dcn`` drops out its cross network's output too.

    Args:
        model: architecture (MLP widths, interaction op, norm, dropout).
        embeddings: the tables (rows, dims, QR, dtype).
        num_tasks: logits per sample ``T`` (one per loss task).
        embedding_device: where the tables are created; ``meta`` defers their allocation to
            ``DistributedModelParallel`` (or ``materialize``). The dense layers are always real.
        init_seed: seeds the tables' init: each table's values depend on this seed, its name and
            each element's place, never on how it is sharded.

    Example::

        model = DLRM(ModelConfig(num_dense=13), EmbeddingConfig(num_embeddings=[100] * 26))
        logits = model(dense, kjt)  # dense: [B, 13], kjt: 26 keys -> logits: [B, 1]

        clicks = DLRM(ModelConfig(num_dense=0), EmbeddingConfig(num_embeddings=[100] * 26))
        logits = clicks(torch.empty(B, 0), kjt)  # no dense features -> logits: [B, 1]
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
        dim = embeddings.dim
        project = NEEDS_EQUAL_DIMS[model.interaction] and embeddings.mixed
        self.has_dense = model.num_dense > 0
        self.dense_arch = (
            MLP(model.num_dense, [*model.bottom_mlp, dim], model.norm, model.dropout)
            if self.has_dense
            else None
        )
        self.sparse_arch = SparseArch(
            embeddings,
            project_to=dim if project else None,
            device=embedding_device,
            init_seed=init_seed,
            sequence=model.sequence,
            dropout=model.dropout,
        )
        self.interaction = make_interaction(
            model.interaction,
            dim,
            self.sparse_arch.out_dims,
            itself=model.interaction_itself,
            dcn_layers=model.dcn_layers,
            dcn_low_rank=model.dcn_low_rank,
            has_dense=self.has_dense,
            dropout=model.dropout,
        )
        # the top MLP and a logit per task, or experts with a gate and tower per task
        self.over_arch = task_layers(model, self.interaction.out_dim, num_tasks)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """``dense: [B, I]``, ``sparse``: KJT with the layout's keys (``EmbeddingConfig.layout``:
        the F features, QR ones split) -> logits ``[B, T]``. ``I = 0``: ``dense`` is ignored."""
        if self.dense_arch is None:  # no dense features: the interaction ignores ``dense``
            return self.over_arch(self.interaction(dense, self.sparse_arch(sparse)))
        dense_out = self.dense_arch(dense)  # [B, D]
        pooled = self.sparse_arch(sparse)  # F x [B, d_f]
        return self.over_arch(self.interaction(dense_out, pooled))


# A leaf for torch.fx, in the module that calls it (fx.wrap patches this module's globals): the
# export traces the model with WithRawIds in front and keeps the split as one scripted call.
torch.fx.wrap("qr_split_kjt")


class WithRawIds(nn.Module):
    """``model(dense, raw_kjt)`` for a model that reads the split KJT: the QR features' ids are
    split in front of it (``qr_split_kjt``; scriptable), as the data path splits them for
    training. For export, serving and tests, where raw ids arrive. No QR feature: a pass-through.

    (This file has no ``from __future__ import annotations``: TorchScript needs the forward's
    annotations as types, not strings, once fx has traced it.)
    """

    def __init__(self, model: nn.Module, collisions: dict[str, int]) -> None:
        super().__init__()
        self.model = model
        self.collisions = collisions

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        if not self.collisions:  # decided when traced: no split in the graph at all
            return self.model(dense, sparse)
        return self.model(dense, qr_split_kjt(sparse, self.collisions))


def materialize(model: nn.Module, device: torch.device | str = "cpu") -> nn.Module:
    """Allocate and initialise embedding tables created on ``meta``, then move the model to
    ``device``. This is the unsharded path; ``DistributedModelParallel`` does it when sharding."""
    for module in model.modules():
        if not isinstance(module, EmbeddingBagCollection):
            continue
        if not any(p.is_meta for p in module.parameters()):
            continue
        module.to_empty(device=device)
        for table in module.embedding_bag_configs():
            assert table.init_fn is not None
            table.init_fn(module.embedding_bags[table.name].weight)
    return model.to(device)
