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


class RowwiseAdagrad(torch.optim.Optimizer):
    """FBGEMM's ``exact_rowwise_adagrad`` on whole tables ``[rows, dim]`` (one state per row):
    ``g' = g + wd * w`` (``l2``; ``decoupled``: ``w *= 1 - lr * wd`` first and ``g' = g``),
    ``state += mean(g'^2)`` over the row, ``w -= lr * g' / (sqrt(state) + eps)``. A row whose
    gradient is zero leaves its state unchanged, as FBGEMM's, which updates only the rows a batch
    reads; ``l2`` decay still moves it (every row, every step: the table is dense)."""

    def __init__(
        self, params: Iterable[nn.Parameter], lr: float, eps: float, weight_decay: float = 0.0,
        decoupled: bool = False,
    ) -> None:  # fmt: skip
        defaults = {"lr": lr, "eps": eps, "weight_decay": weight_decay, "decoupled": decoupled}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                g = p.grad
                if wd and group["decoupled"]:
                    p.mul_(1 - lr * wd)
                elif wd:
                    g = g + wd * p
                state["sum"].add_(g.float().pow(2).mean(dim=1))
                p.addcdiv_(g, (state["sum"].sqrt() + eps).unsqueeze(1).to(p.dtype), value=-lr)
        return loss


def table_optimizer_factory(
    cfg: OptimConfig,
) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    """Torch's counterpart of the fused embedding optimizer, for tables held dense when
    ``optim.dense_tables`` is ``embedding``: at ``embedding_lr`` with ``embedding_weight_decay``
    in its mode (``OptimConfig`` has refused what FBGEMM's optimizer lacks)."""
    lr, eps = cfg.embedding_lr, cfg.eps
    wd, decoupled = cfg.embedding_weight_decay, cfg.embedding_weight_decay_mode == "decoupled"

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        kind = cfg.embedding_optimizer
        if kind == "adam":  # FBGEMM's Adam decays decoupled only: w -= lr * (update + wd * w)
            return torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=wd)
        if kind == "exact_adagrad":
            return torch.optim.Adagrad(params, lr=lr, eps=eps)
        if kind == "exact_sgd":
            return torch.optim.SGD(params, lr=lr)
        return RowwiseAdagrad(params, lr=lr, eps=eps, weight_decay=wd, decoupled=decoupled)

    return make


def is_table(name: str) -> bool:
    """Whether a parameter is an embedding table's weight (``...embedding_bags.<t>.weight``)."""
    return ".embedding_bags." in name and name.endswith(".weight")


def combined_optimizer(model: nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """``model.fused_optimizer`` (DMP's embedding optimizer) + a dense optimizer over every
    parameter not updated in backward (``in_backward_optimizer_filter``). With
    ``optim.dense_tables: embedding`` the tables held dense (data-parallel) get an optimizer of
    their own, the embedding optimizer's torch counterpart (``table_optimizer_factory``)."""
    unfused = dict(in_backward_optimizer_filter(model.named_parameters()))
    tables = {n: p for n, p in unfused.items() if is_table(n)}
    fused: KeyedOptimizer = model.fused_optimizer  # type: ignore[assignment]
    parts: list[tuple[str, KeyedOptimizer]] = [("embedding", fused)]
    if cfg.dense_tables == "embedding" and tables:
        unfused = {n: p for n, p in unfused.items() if n not in tables}
        parts.append(("tables", KeyedOptimizerWrapper(tables, table_optimizer_factory(cfg))))
    parts.append(("dense", KeyedOptimizerWrapper(unfused, dense_optimizer_factory(cfg))))
    return CombinedOptimizer(parts)


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
