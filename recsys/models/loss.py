"""Losses and the ``ModelAndLoss`` wrapper.

``ModelAndLoss(batch)`` returns ``(loss, outputs)``, with ``outputs`` holding logits, labels and
weights, so training and evaluation never re-derive them. That is also the contract of TorchRec's
train pipelines (``loss, output = model(batch)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.datasets.utils import Batch

from recsys.config import LossConfig


def sample_weights(labels: torch.Tensor, w0: float, w1: float) -> torch.Tensor:
    """Per-sample weights: ``w0`` for negatives, ``w1`` for positives (labels in {0, 1})."""
    return w0 + (w1 - w0) * labels


def task_loss(
    kind: str, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Mean loss of one task. ``logits``, ``labels``, ``weights``: ``[B]``.

    ``bce``/``wbce``: ``mean(w * BCEWithLogits(logit, y))`` (numerically stable, on logits).
    ``mse``: ``mean(w * (sigmoid(logit) - y) ** 2)``, as the DLRM reference's MSE on probabilities.
    """
    if kind == "mse":
        elementwise = (torch.sigmoid(logits) - labels) ** 2
    else:
        elementwise = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (weights * elementwise).mean()


class Loss(nn.Module):
    """Weighted multi-task loss: ``sum_t weight_t * task_loss(logits[:, t], labels[:, col_t])``."""

    def __init__(self, cfg: LossConfig) -> None:
        super().__init__()
        self.kind = cfg.kind
        self.w0, self.w1 = cfg.weights if cfg.kind == "wbce" else (1.0, 1.0)
        self.columns = [t.label_column for t in cfg.tasks]
        self.task_weights = [t.weight for t in cfg.tasks]

    def select_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """``[B]`` or ``[B, L]`` data labels -> ``[B, T]`` task labels."""
        labels = labels.float()
        if labels.dim() == 1:
            labels = labels.unsqueeze(1)
        if max(self.columns) >= labels.shape[1]:
            raise ValueError(
                f"loss.tasks use label columns {self.columns}, data has {labels.shape[1]}"
            )
        c = self.columns
        if c == list(range(c[0], c[0] + len(c))):  # a view, as every shipped task list is
            return labels[:, c[0] : c[0] + len(c)]
        # integer columns one by one, not ``labels[:, c]``: indexing a CUDA tensor with a list
        # builds its index on the host and copies it over, which waits for the device each step
        return torch.stack([labels[:, i] for i in c], dim=1)

    def forward(
        self, logits: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``logits: [B, T]``, data ``labels`` -> (scalar loss, outputs). A row whose label is
        NaN is no training row: it adds nothing to the loss or its gradient (the full-batch
        solver's padding, ``recsys.train.solver``); the mean is still over ``B``."""
        y = self.select_labels(labels)
        valid = ~torch.isnan(y)
        y = torch.where(valid, y, torch.zeros_like(y))
        w = sample_weights(y, self.w0, self.w1) * valid
        total = logits.new_zeros(())
        for t, tw in enumerate(self.task_weights):
            total = total + tw * task_loss(self.kind, logits[:, t], y[:, t], w[:, t])
        return total, {"loss": total.detach(), "logits": logits.detach(), "labels": y, "weights": w}


class ModelAndLoss(nn.Module):
    """Wraps a model and its loss: ``forward(batch) -> (loss, {loss, logits, labels, weights})``."""

    def __init__(self, model: nn.Module, loss: LossConfig) -> None:
        super().__init__()
        self.model = model
        self.loss = Loss(loss)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        return self.loss(logits.float(), batch.labels)
