"""One constructor for every architecture ``model.arch`` names."""

import torch
from torch import nn

from recsys.config import EmbeddingConfig, ModelConfig
from recsys.models.dlrm import DLRM
from recsys.models.reference import FactorizationMachine, LogisticRegression

ARCHS: dict[str, type[nn.Module]] = {
    "dlrm": DLRM,
    "lr": LogisticRegression,
    "fm": FactorizationMachine,
}


def build_model(
    model: ModelConfig,
    embeddings: EmbeddingConfig,
    num_tasks: int = 1,
    embedding_device: torch.device | str | None = None,
    init_seed: int = 0,
) -> nn.Module:
    """``model.arch``'s module: ``module(dense [B, I], kjt) -> logits [B, T]``; its tables are
    ``model_tables(model, embeddings, num_tasks)``, created on ``embedding_device``."""
    cls = ARCHS[model.arch]
    return cls(model, embeddings, num_tasks, embedding_device=embedding_device, init_seed=init_seed)
