"""Evaluation of a (sharded) model on a split: every rank scores its own rows, then the figures of
the whole split are computed from all ranks' predictions (``recsys.train.metrics``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from recsys.config import ExperimentConfig
from recsys.data import RowSource, eval_batches
from recsys.distributed.env import WorkerEnv
from recsys.train.metrics import binary_metrics


def gather(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """Concatenate equal-shaped tensors from every rank (rank order)."""
    if world_size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def evaluate(
    model: nn.Module, split: RowSource, cfg: ExperimentConfig, env: WorkerEnv, prefix: str
) -> dict[str, float]:
    """``{prefix}_auc``, ``{prefix}_log_loss``, ... of ``split`` over all ranks' predictions
    (padding rows masked out); tasks after the first get ``{prefix}_{task}_...``."""
    logits, labels, valid = [], [], []
    model.eval()
    with torch.no_grad():
        for batch, mask in eval_batches(
            split,
            rank=env.rank,
            world_size=env.world_size,
            batch_size=cfg.train.batch_size,
            layout=cfg.embeddings.layout(),
            max_batches=cfg.train.eval_batches,
        ):
            _, out = model(batch.to(env.device, non_blocking=True))
            logits.append(out["logits"].float())
            labels.append(out["labels"].float())
            valid.append(mask.to(env.device))
    model.train()
    keep = gather(torch.cat(valid), env.world_size)
    all_logits = gather(torch.cat(logits), env.world_size)[keep].cpu().numpy()
    all_labels = gather(torch.cat(labels), env.world_size)[keep].cpu().numpy()
    metrics: dict[str, float] = {}
    for t, task in enumerate(cfg.loss.tasks):
        name = prefix if t == 0 else f"{prefix}_{task.name}"
        for k, v in binary_metrics(all_labels[:, t], all_logits[:, t]).items():
            metrics[f"{name}_{k}"] = v
    return metrics
