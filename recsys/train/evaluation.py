"""Evaluation of a (sharded) model on a split: every rank scores its own rows and adds their
sufficient statistics to a ``MetricState`` on its device; one all-reduce sums the states, and
every rank reads the whole split's figures off the sum. A rank's time and memory grow with its own
rows only, not with the split or the number of ranks (``recsys.train.metrics``).

Evaluation changes nothing that training reads: FBGEMM's training TBE advances its optimizer step
counter (``iter``, the bias correction of embedding Adam and LAMB) on every forward, evaluation
included, so ``evaluate`` puts every counter back afterwards (``step_counters_kept``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from recsys.config import MEAN_TASK, MONITORED, ExperimentConfig
from recsys.data import RowSource
from recsys.data.input.loader import eval_batches, eval_groups
from recsys.distributed import collectives
from recsys.distributed.checkpoint import step_counter_modules
from recsys.distributed.env import WorkerEnv
from recsys.train.metrics import GroupAUC, MetricState, bits_for


def evaluate(
    model: nn.Module, split: RowSource, cfg: ExperimentConfig, env: WorkerEnv, prefix: str
) -> dict[str, float]:
    """``{prefix}_auc``, ``{prefix}_log_loss``, ``{prefix}_auc_error_bound``, ... of ``split``
    over all ranks (padding rows masked out), of the first task; with the data's ``group_by``
    also ``{prefix}_gauc`` and ``{prefix}_gauc_left_out`` (``GroupAUC``); with several tasks
    also ``{prefix}_{metric}/{task}`` for each task and ``{prefix}_{metric}/mean`` (their
    average)."""
    rows = len(split)
    if cfg.train.eval_batches:
        rows = min(rows, cfg.train.eval_batches * cfg.train.batch_size * env.world_size)
    tasks = len(cfg.loss.tasks)
    state = MetricState(tasks, env.device, bits_for(rows))
    ranking = GroupAUC(tasks, env.device) if cfg.data.group_by else None
    plan = {"rank": env.rank, "world_size": env.world_size, "batch_size": cfg.train.batch_size,
            "max_batches": cfg.train.eval_batches}  # fmt: skip
    groups = eval_groups(split, **plan) if ranking is not None else None
    model.eval()
    with torch.no_grad(), step_counters_kept(model):
        for batch, mask in eval_batches(split, layout=cfg.embeddings.layout(), **plan):
            _, out = model(batch.to(env.device, non_blocking=True))
            logits, labels = out["logits"].float(), out["labels"].float()
            valid = mask.to(env.device, non_blocking=True)  # (pageable: staged, no device wait)
            state.update(logits, labels, valid)
            if ranking is not None and groups is not None:
                ranking.update(next(groups), logits, labels, valid)
    model.train()
    tensors = state.tensors()
    if ranking is not None:
        ranking.finish(env.world_size)
        tensors += ranking.tensors()
    for tensor in tensors:
        collectives.sum_(tensor)
    per_task = [state.compute(t) | (ranking.compute(t) if ranking else {}) for t in range(tasks)]
    return task_metrics(per_task, cfg.loss.names(), prefix)


@contextlib.contextmanager
def step_counters_kept(model: nn.Module) -> Iterator[None]:
    """Restore, on exit, the optimizer step counter of every FBGEMM training TBE in ``model``:
    its ``iter`` buffer (what checkpoints hold) and ``iter_cpu`` (what its kernels read; synced
    from ``iter`` only while it is 0), both advanced by every forward, in eval mode too
    (``fbgemm_gpu/split_table_batched_embeddings_ops_training.py``, ``forward``)."""
    saved: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
    for m in step_counter_modules(model):
        it, it_cpu = getattr(m, "iter"), getattr(m, "iter_cpu")  # noqa: B009 (buffers)
        saved.append((m, it.detach().clone(), it_cpu.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for m, it, it_cpu in saved:
                getattr(m, "iter").copy_(it)  # noqa: B009 (a buffer, not a method)
                m.iter_cpu = it_cpu


def task_metrics(
    per_task: list[dict[str, float]], names: list[str], prefix: str
) -> dict[str, float]:
    """The report's names of per-task figures: the first task's unsuffixed, and with several
    tasks each one's as ``{prefix}_{metric}/{task}`` plus ``{prefix}_{metric}/mean``."""
    metrics = {f"{prefix}_{k}": v for k, v in per_task[0].items()}
    if len(per_task) > 1:
        for name, figures in zip(names, per_task, strict=True):
            metrics.update({f"{prefix}_{k}/{name}": v for k, v in figures.items()})
        for k in MONITORED:
            if k in per_task[0]:
                metrics[f"{prefix}_{k}/{MEAN_TASK}"] = sum(f[k] for f in per_task) / len(per_task)
    return metrics
