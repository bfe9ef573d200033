"""The per-worker training loop: build, shard, train, evaluate, checkpoint, report.

It runs inside any launcher that has set up the process group (Ray Train's ``TorchTrainer`` in
``recsys.train.worker``, or two gloo processes in the tests) and talks to it through a
``Reporter``. The same code runs on CPU (gloo) and GPU (NCCL); only ``WorkerEnv.device`` differs.

One report = one checkpoint + the metrics since the previous one (training-loss history at its real
steps, validation metrics when due). A worker restarted from the last checkpoint therefore never
reports a step twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.data import Columns, Splits, TrainStream, eval_batches, load_splits
from recsys.distributed import checkpoint
from recsys.distributed.checkpoint import TrainState
from recsys.distributed.env import WorkerEnv
from recsys.distributed.sharding import plan_summary, shard
from recsys.models import DLRM, ModelAndLoss, embedding_report
from recsys.models.accounting import BYTES_PER_ELEMENT
from recsys.models.embeddings import table_specs
from recsys.train.metrics import binary_metrics
from recsys.train.optim import LRPolicy, combined_optimizer


class Reporter(Protocol):
    """What the loop needs from its launcher."""

    def checkpoints(self) -> list[Any]:
        """Handles of the checkpoints to resume from, newest first."""

    def open_checkpoint(self, handle: Any) -> contextlib.AbstractContextManager[str]:
        """A local folder holding checkpoint ``handle``."""

    def skip_names_of(self, handle: Any) -> None:
        """Checkpoint ``handle`` is unusable: never reuse its folder name."""

    def checkpoint_dir(self, step: int) -> str:
        """A folder this rank may write its part of the checkpoint of ``step`` into."""

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        """Hand over metrics and the checkpoint folder (all ranks call it, same count)."""


def build(cfg: ExperimentConfig, env: WorkerEnv) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The sharded ``ModelAndLoss``, its combined optimizer and the plan summary."""
    if cfg.embeddings.dtype == "bf16" and env.device.type == "cpu":
        raise ConfigError(
            "embeddings.dtype='bf16': FBGEMM's CPU kernels have no bf16 tables; "
            "use fp16 on CPU (bf16 needs GPU workers)"
        )
    torch.manual_seed(cfg.train.seed)
    model = ModelAndLoss(
        DLRM(cfg.model, cfg.embeddings, len(cfg.loss.tasks), embedding_device="meta"), cfg.loss
    )
    specs = table_specs(cfg.embeddings)
    half = cfg.embeddings.dtype != "fp32"
    dmp = shard(model, env, cfg.sharding, cfg.optim, [s.name for s in specs], half)
    summary = plan_summary(
        dmp.plan,
        {s.name: (s.rows, s.dim) for s in specs},
        BYTES_PER_ELEMENT[cfg.embeddings.dtype],
        env.world_size,
    )
    return dmp, combined_optimizer(dmp, cfg.optim), summary


class Stepper:
    """One training step: plainly, or through TorchRec's ``TrainPipelineSparseDist`` (which
    overlaps the next batch's input distribution with this step's compute)."""

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, pipeline: bool):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.pipeline = TrainPipelineSparseDist(model, optimizer, device) if pipeline else None

    def __call__(self, batches: Iterator[Batch]) -> dict[str, torch.Tensor]:
        if self.pipeline is not None:
            return self.pipeline.progress(batches)
        batch = next(batches).to(self.device, non_blocking=True)
        self.optimizer.zero_grad()
        loss, out = self.model(batch)
        loss.backward()
        self.optimizer.step()
        return out

    @contextlib.contextmanager
    def plain_model(self) -> Iterator[nn.Module]:
        """The model with its original forward (the pipeline rewrites it); in-flight batches
        stay in the pipeline and training resumes where it was."""
        if self.pipeline is None:
            yield self.model
            return
        model = self.pipeline.detach()
        try:
            yield model
        finally:
            self.pipeline.attach(model)


def gather(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """Concatenate equal-shaped tensors from every rank (rank order)."""
    if world_size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def evaluate(
    model: nn.Module, split: Columns, cfg: ExperimentConfig, env: WorkerEnv, prefix: str
) -> dict[str, float]:
    """Metrics of ``split`` over all ranks' predictions (padding rows masked out)."""
    logits, labels, valid = [], [], []
    model.eval()
    with torch.no_grad():
        for batch, mask in eval_batches(
            split,
            rank=env.rank,
            world_size=env.world_size,
            batch_size=cfg.train.batch_size,
            table_rows=cfg.embeddings.num_embeddings,
            feature_names=cfg.embeddings.names(),
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


def mean_over_ranks(value: torch.Tensor, world_size: int) -> float:
    value = value.detach().float().reshape(1).clone()
    if world_size > 1:
        dist.all_reduce(value)
    return float(value.item()) / world_size


def run(
    cfg: ExperimentConfig,
    env: WorkerEnv,
    reporter: Reporter,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Train ``cfg`` to ``cfg.train.steps``, resuming from the reporter's newest usable
    checkpoint; returns the last report's metrics."""
    clock = Clock()
    t_start = time.perf_counter()
    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    model, optimizer, summary = build(cfg, env)
    state = restore(reporter, model, optimizer, env, log)
    stream = TrainStream(
        splits.train,
        rank=env.rank,
        world_size=env.world_size,
        batch_size=cfg.train.batch_size,
        table_rows=cfg.embeddings.num_embeddings,
        feature_names=cfg.embeddings.names(),
        seed=cfg.train.seed,
        shuffle=cfg.data.shuffle,
        position=state.data_position,
    )
    use_pipeline = cfg.sharding.pipeline == "on" or (
        cfg.sharding.pipeline == "auto" and env.device.type == "cuda"
    )
    static = {
        **embedding_report(cfg.embeddings).as_metrics(),
        **{f"emb_bytes_rank{r}": b for r, b in summary["embedding_bytes_per_rank"].items()},
        "setup_s": time.perf_counter() - t_start,
    }
    job = Job(
        cfg=cfg,
        env=env,
        reporter=reporter,
        stepper=Stepper(model, optimizer, env.device, use_pipeline),
        policy=LRPolicy(optimizer, cfg.optim),
        stream=stream,
        splits=splits,
        state=state,
        static=static,
        summary=summary,
        log=log,
        clock=clock,
    )
    return _train(job)


def _all_ranks_agree(ok: bool, world_size: int) -> bool:
    flag = torch.tensor([1 if ok else 0])
    if world_size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore(
    reporter: Reporter, model: nn.Module, optimizer: Any, env: WorkerEnv, log: Callable[[str], None]
) -> TrainState:
    """Load the newest usable checkpoint; an incomplete or corrupt one is skipped with a warning
    naming it (all ranks decide together), never a crash loop. No checkpoint: a fresh state."""
    for handle in reporter.checkpoints():
        with reporter.open_checkpoint(handle) as folder:
            reason = ""
            try:
                checkpoint.verify(folder, env.world_size)
            except checkpoint.CheckpointError as e:
                reason = str(e)
            if _all_ranks_agree(not reason, env.world_size):
                state = checkpoint.load(folder, model, optimizer, env.rank, env.world_size)
                log(f"[rank {env.rank}] resumed from step {state.step} ({folder})")
                return state
            why = reason or "unusable on another rank"
            log(f"[rank {env.rank}] warning: skipping checkpoint {folder}: {why}")
            reporter.skip_names_of(handle)
    return TrainState()


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


@dataclass
class Clock:
    """Wall time by phase on this worker (cumulative) and the current report interval."""

    started: float = field(default_factory=time.time)
    train_s: float = 0.0
    eval_s: float = 0.0
    ckpt_s: float = 0.0
    interval_s: float = 0.0
    interval_steps: int = 0

    def tick(self, seconds: float) -> None:
        """One training step took ``seconds``."""
        self.train_s += seconds
        self.interval_s += seconds
        self.interval_steps += 1

    def samples_per_s(self, global_batch: int) -> float:
        return self.interval_steps * global_batch / max(self.interval_s, 1e-9)

    def as_metrics(self) -> dict[str, float]:
        return {
            "t_worker_start": self.started,
            "t_report": time.time(),
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "ckpt_s": self.ckpt_s,
        }


@dataclass
class Job:
    """What one worker's running training holds."""

    cfg: ExperimentConfig
    env: WorkerEnv
    reporter: Reporter
    stepper: Stepper
    policy: LRPolicy
    stream: TrainStream
    splits: Splits
    state: TrainState
    static: dict[str, float]
    summary: dict[str, Any]
    log: Callable[[str], None]
    clock: Clock


def _train(job: Job) -> dict[str, float]:
    tc, env, state, clock = job.cfg.train, job.env, job.state, job.clock
    history: list[tuple[int, float]] = []
    loss_sum, loss_n = torch.zeros((), device=env.device), 0
    metrics: dict[str, float] = {}
    while state.step < tc.steps:
        t0 = time.perf_counter()
        lr_factor = job.policy.apply(state.step)
        loss_sum += job.stepper(job.stream)["loss"].detach()
        loss_n += 1
        state.step += 1
        state.data_position += tc.batch_size
        if state.step % tc.log_every == 0 or state.step == tc.steps:
            loss = mean_over_ranks(loss_sum / loss_n, env.world_size)
            loss_sum.zero_()
            loss_n = 0
            history.append((state.step, loss))
            if not math.isfinite(loss):
                return _diverged(job, loss, history)
            if env.is_main:
                job.log(f"step {state.step}/{tc.steps} loss {loss:.5f} lr x{lr_factor:.3f}")
        clock.tick(time.perf_counter() - t0)
        if not _due(state.step, tc.checkpoint_every, tc.steps):
            continue
        metrics = {
            **job.static,
            "step": state.step,
            "epoch": job.stream.epoch,
            "loss": history[-1][1] if history else float("nan"),
            "samples_per_s": clock.samples_per_s(tc.batch_size * env.world_size),
            "ids_hashed": job.stream.ids_hashed,
            "lr_factor": lr_factor,
        }
        _report_point(job, metrics, history)
        history = []
    return metrics


def _report_point(job: Job, metrics: dict[str, Any], history: list[tuple[int, float]]) -> None:
    """Evaluate when due, then checkpoint and report (the model's plain forward meanwhile)."""
    cfg, env, state, clock = job.cfg, job.env, job.state, job.clock
    with job.stepper.plain_model() as model:
        t0 = time.perf_counter()
        if _due(state.step, cfg.train.eval_every, cfg.train.steps):
            metrics.update(evaluate(model, job.splits.val, cfg, env, "val"))
        if state.step == cfg.train.steps and len(job.splits.test):
            metrics.update(evaluate(model, job.splits.test, cfg, env, "test"))
        t1 = time.perf_counter()
        clock.eval_s += t1 - t0
        metrics.update(clock.as_metrics())
        folder = job.reporter.checkpoint_dir(state.step)
        checkpoint.save(folder, model, job.stepper.optimizer, state, env.rank, env.world_size)
        if env.is_main:
            with open(os.path.join(folder, "sharding_plan.json"), "w") as f:
                json.dump(job.summary, f, indent=2)
        job.reporter.report({**metrics, "loss_history": history}, folder, state.step)
        clock.ckpt_s += time.perf_counter() - t1
        clock.interval_s, clock.interval_steps = 0.0, 0
    if env.is_main and "val_auc" in metrics:
        job.log(f"step {state.step}: val auc {metrics['val_auc']:.4f} ne {metrics['val_ne']:.4f}")


def _diverged(job: Job, loss: float, history: list[tuple[int, float]]) -> dict[str, float]:
    """Stop a trial whose loss is NaN/inf: report it (no checkpoint) and return."""
    step = job.state.step
    if job.env.is_main:
        job.log(f"step {step}: loss is {loss}; stopping this trial as diverged")
    nan = float("nan")  # schedulers and searchers need the metric keys; NaN ranks it last
    metrics = {
        "step": step,
        "loss": loss,
        "diverged": 1.0,
        "loss_history": history,
        **{k: nan for k in ("val_auc", "val_log_loss", "val_ne")},
    }
    job.reporter.report(metrics, "", step)
    return metrics  # type: ignore[return-value]
