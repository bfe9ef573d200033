"""Dense optimizer beside the fused embedding optimizer, and the DLRM LR policy."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from recsys.config import OptimConfig


def dense_optimizer_factory(
    cfg: OptimConfig,
) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if cfg.dense_optimizer == "adagrad":
            return torch.optim.Adagrad(
                params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay
            )
        if cfg.dense_optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    return make


def combined_optimizer(model: nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """``model.fused_optimizer`` (DMP's embedding optimizer) + a dense optimizer over every
    parameter not updated in backward (``in_backward_optimizer_filter``)."""
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        dense_optimizer_factory(cfg),
    )
    fused: KeyedOptimizer = model.fused_optimizer  # type: ignore[assignment]
    return CombinedOptimizer([("embedding", fused), ("dense", dense)])


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak LR at ``step`` (0-based), as DLRM's ``LRPolicyScheduler``:
    linear warmup over ``warmup_steps``, constant until ``decay_start_step``, then polynomial
    decay (power ``decay_power``) over ``decay_steps`` to ``end_lr_factor``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay_steps and step >= cfg.decay_start_step:
        done = min(step - cfg.decay_start_step, cfg.decay_steps)
        remaining = (1 - done / cfg.decay_steps) ** cfg.decay_power
        return cfg.end_lr_factor + (1 - cfg.end_lr_factor) * remaining
    return 1.0


class LRPolicy:
    """Sets every param group's LR to ``base_lr * lr_factor(step)`` before each step.

    Fused embedding optimizers read their LR from ``param_groups`` on ``step``, so one policy
    drives both. Stateless apart from the step, which the checkpoint carries.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> None:
        self.optimizer, self.cfg = optimizer, cfg
        self.base = [g["lr"] for g in optimizer.param_groups]

    def apply(self, step: int) -> float:
        factor = lr_factor(step, self.cfg)
        for group, base in zip(self.optimizer.param_groups, self.base, strict=True):
            group["lr"] = base * factor
        return factor
