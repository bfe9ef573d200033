"""One constructor for every architecture ``model.arch`` names: its class in ``BUILDERS`` (the
registry of names and the keys each reads is ``recsys.archs``, which imports no torch)."""

import torch
from torch import nn

from recsys import archs
from recsys.config import EmbeddingConfig, ModelConfig
from recsys.models.dlrm import DLRM
from recsys.models.finalmlp import FinalMLP
from recsys.models.reference import FactorizationMachine, LogisticRegression

# Each registered architecture's class: ``Class(model, embeddings, num_tasks,
# embedding_device=..., init_seed=...)`` mapping ``(dense [B, I], kjt)`` to logits ``[B, T]``.
BUILDERS: dict[str, type[nn.Module]] = {
    "dlrm": DLRM,
    "finalmlp": FinalMLP,
    "lr": LogisticRegression,
    "fm": FactorizationMachine,
}


def model_class(arch: str) -> type[nn.Module]:
    """The class of ``arch`` (``BUILDERS``); a registered name without one is a programming
    error."""
    archs.get(arch)  # (a ConfigError naming the registered ones)
    if arch not in BUILDERS:
        raise KeyError(
            f"model.arch {arch!r} is registered in recsys.archs with no class in BUILDERS"
        )
    return BUILDERS[arch]


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
