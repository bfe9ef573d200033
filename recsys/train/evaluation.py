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
from recsys.data.input.loader import eval_batches
from recsys.distributed import collectives
from recsys.distributed.checkpoint import step_counter_modules
from recsys.distributed.env import WorkerEnv
from recsys.train.metrics import MetricState, bits_for


def evaluate(
    model: nn.Module, split: RowSource, cfg: ExperimentConfig, env: WorkerEnv, prefix: str
) -> dict[str, float]:
    """``{prefix}_auc``, ``{prefix}_log_loss``, ``{prefix}_auc_error_bound``, ... of ``split``
    over all ranks (padding rows masked out), of the first task; with several tasks also
    ``{prefix}_{metric}/{task}`` for each task and ``{prefix}_{metric}/mean`` (their average)."""
    rows = len(split)
    if cfg.train.eval_batches:
        rows = min(rows, cfg.train.eval_batches * cfg.train.batch_size * env.world_size)
    state = MetricState(len(cfg.loss.tasks), env.device, bits_for(rows))
    model.eval()
    with torch.no_grad(), step_counters_kept(model):
        for batch, mask in eval_batches(
            split,
            rank=env.rank,
            world_size=env.world_size,
            batch_size=cfg.train.batch_size,
            layout=cfg.embeddings.layout(),
            max_batches=cfg.train.eval_batches,
        ):
            _, out = model(batch.to(env.device, non_blocking=True))
            state.update(out["logits"].float(), out["labels"].float(), mask.to(env.device))
    model.train()
    for tensor in state.tensors():
        collectives.sum_(tensor)
    return task_metrics([state.compute(t) for t in range(len(cfg.loss.tasks))],
                        cfg.loss.names(), prefix)  # fmt: skip


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
            metrics[f"{prefix}_{k}/{MEAN_TASK}"] = sum(f[k] for f in per_task) / len(per_task)
    return metrics
