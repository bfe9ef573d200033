"""One constructor for every architecture ``model.arch`` names: the class its registration in
``recsys.archs`` names, imported when a model is built."""

import importlib

import torch
from torch import nn

from recsys import archs
from recsys.config import EmbeddingConfig, ModelConfig


def model_class(arch: str) -> type[nn.Module]:
    """The class registered for ``arch`` (``recsys.archs``: ``"module:Class"``)."""
    module, _, name = archs.get(arch).builder.partition(":")
    cls: type[nn.Module] = getattr(importlib.import_module(module), name)
    return cls


def build_model(
    model: ModelConfig,
    embeddings: EmbeddingConfig,
    num_tasks: int = 1,
    embedding_device: torch.device | str | None = None,
    init_seed: int = 0,
) -> nn.Module:
    """``model.arch``'s module: ``module(dense [B, I], kjt) -> logits [B, T]``; its tables are
    ``model_tables(model, embeddings, num_tasks)``, created on ``embedding_device``."""
    cls = model_class(model.arch)
    return cls(model, embeddings, num_tasks, embedding_device=embedding_device, init_seed=init_seed)
