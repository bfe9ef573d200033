"""The per-worker trainer: build, shard, restore, train, evaluate, checkpoint, report.

    trainer = Trainer(cfg, env, reporter)    # builds everything, resumes from the newest checkpoint
    metrics = trainer.train()                # to cfg.train.steps; the last report's metrics

It runs inside any launcher that has set up the process group (Ray Train's ``TorchTrainer`` in
``recsys.train.worker``, or two gloo processes in the tests) and talks to it through a
``Reporter``. The same code runs on CPU (gloo) and GPU (NCCL); only ``WorkerEnv.device`` differs.

One report = one checkpoint + the metrics since the previous one (training-loss history at its real
steps, validation metrics when due). A worker restarted from the last checkpoint therefore never
reports a step twice.

Batch norm (``model.norm: batch``) normalises over each worker's batch and keeps running statistics
per worker; before every evaluation and checkpoint (``_report_point``) they are replaced by their
mean over the workers (``sync_batch_norm``), so every worker evaluates the same model and the
checkpoint, which holds one copy of them, resumes exactly.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from recsys.config import ExperimentConfig
from recsys.data import shard_range
from recsys.data.dataset import check_carried, with_budget
from recsys.data.input.loader import TrainStream, load_splits, map_position
from recsys.data.input.prefetch import Prefetcher
from recsys.distributed import checkpoint, collectives
from recsys.distributed.env import WorkerEnv, deterministic_kernels
from recsys.models import embedding_report
from recsys.train.build import build
from recsys.train.evaluation import evaluate
from recsys.train.optim import LRPolicy
from recsys.train.reporting import Reporter
from recsys.train.resume import restore
from recsys.train.scoring import Scorer
from recsys.train.solver import FullBatchSolver
from recsys.train.stepper import Stepper, use_pipeline


def pin_batches(device: torch.device) -> bool:
    """Page-locked batches make the host-to-GPU copy asynchronous; CPU-only torch cannot pin."""
    return device.type == "cuda"


def batch_norm_stats(model: nn.Module) -> list[torch.Tensor]:
    """The running means and variances (``[C]`` each) of every batch norm in ``model``, in
    module order (the same on every rank); empty without batch norm."""
    out: list[torch.Tensor] = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            assert m.running_mean is not None and m.running_var is not None
            out += [m.running_mean, m.running_var]
    return out


def sync_batch_norm(model: nn.Module) -> None:
    """Every batch norm's running statistics := their mean over the ranks (in place; a no-op on
    one rank or without batch norm). The mean of the workers' running variances, not the variance
    of all their rows together: in training each worker normalises by its own batch's variance,
    which is what its running variance estimates (timm's ``distribute_bn`` averages alike)."""
    collectives.average_(batch_norm_stats(model))


def paused(step: int, pause_at: int) -> bool:
    """Whether a run with ``train.pause_at`` (0: off) stops at this step's report."""
    return 0 < pause_at <= step


def due(step: int, every: int, last: int) -> bool:
    """Whether something done every ``every`` steps (0: only at the end) is due at ``step``."""
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

    def new_interval(self) -> None:
        self.interval_s, self.interval_steps = 0.0, 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "t_worker_start": self.started,
            "t_report": time.time(),
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "ckpt_s": self.ckpt_s,
        }


class Trainer:
    """One worker's training of ``cfg``.

    Args:
        cfg: the experiment.
        env: this worker's ranks and device (``recsys.distributed.env.current``).
        reporter: checkpoints and reports (Ray Train, or ``LocalReporter``).
        log: progress lines (rank 0 prints the loss; every rank its resume/skip notices).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        env: WorkerEnv,
        reporter: Reporter,
        log: Callable[[str], None] = print,
    ) -> None:
        t_start = time.perf_counter()
        self.cfg, self.env, self.reporter, self.log = cfg, env, reporter, log
        self.clock = Clock()
        if cfg.train.deterministic:
            deterministic_kernels(env.device)
        check_carried(cfg)
        self.splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
        built = build(cfg, env)
        self.plan = built.plan
        self.state = restore(reporter, built.model, built.optimizer, env, log)
        self.resume_note = self._reshard_position()
        if not self.state.saved_world_size and cfg.train.init_from:  # a new run, warm
            self.resume_note = warm(cfg.train.init_from, built, env, log)
        # a budget in epochs made steps for these workers and the samples still left
        self.cfg = cfg = with_budget(
            cfg, len(self.splits.train), env.world_size, self.state.step, self.state.samples_seen
        )
        self.stream = TrainStream(
            self.splits.train,
            rank=env.rank,
            world_size=env.world_size,
            batch_size=cfg.train.batch_size,
            layout=cfg.embeddings.layout(),
            seed=cfg.train.seed,
            shuffle=cfg.data.shuffle,
            position=self.state.data_position,
            pin_memory=pin_batches(env.device),
        )
        self.batches = (
            Prefetcher(self.stream, cfg.data.prefetch, env.device)
            if cfg.data.prefetch
            else self.stream
        )
        pipelined = use_pipeline(cfg.sharding, env.device)
        self.stepper = Stepper(built.model, built.optimizer, env.device, pipelined)
        self.policy = LRPolicy(built.optimizer, cfg.optim)
        per_rank = self.plan["embedding_bytes_per_rank"]
        self.static = {
            **embedding_report(cfg.tables).as_metrics(),
            **{f"emb_bytes_rank{r}": b for r, b in per_rank.items()},
            "setup_s": time.perf_counter() - t_start,
            "train_steps": cfg.train.steps,  # the step it trains to (a sweep's status reads it)
        }
        self.history: list[tuple[int, float]] = []  # (step, loss) since the last report
        self.cost_mark = t_start  # the run's cost is counted up to here (``_cost``)
        self.scorer = Scorer.of(cfg.train)
        self.stopped_early = False
        self.converged = False  # a full-batch solver's run ends there (``train.solver``)
        self.solver = None
        if cfg.train.solver == "lbfgs":
            self.solver = FullBatchSolver(built.model, self.splits.train, cfg, env)
            if self.state.step == 0 and not cfg.train.init_from:
                self.solver.start_from_zero()

    def _reshard_position(self) -> str:
        """Carry a checkpoint of another number of workers or another plan to this one: the data
        position by ``map_position``; returns the notice for the log and the first report ('' if
        neither changed)."""
        start, stop = shard_range(len(self.splits.train), self.env.rank, self.env.world_size)
        state, rows = self.state, stop - start
        saved = state.saved_world_size
        if state.shard_rows and state.shard_rows != rows:
            state.data_position = map_position(state.data_position, state.shard_rows, rows)
        state.shard_rows = rows
        if not saved or (saved == self.env.world_size and not state.remapped):
            return ""
        note = resume_note(state, self.env.world_size, self.cfg.train.batch_size)
        if self.env.is_main:
            self.log(f"warning: {note}")
        return note

    def train(self) -> dict[str, Any]:
        """Train to ``cfg.train.steps``; returns the last report's metrics. A run restored at or
        past its last step (a sweep resumed right after the trial's last checkpoint) has nothing
        to train: it reports its stored best and finishes."""
        try:
            return self._train()
        finally:
            if isinstance(self.batches, Prefetcher):
                self.batches.close()

    def checkpoint_bytes(self) -> int:
        """About what this rank's checkpoint takes: its table bytes three times (weights and up
        to two optimizer moments) and the dense layers three times."""
        tables = int(self.plan["embedding_bytes_per_rank"].get(self.env.rank, 0))
        dense = sum(
            p.numel() * p.element_size()
            for n, p in self.stepper.model.named_parameters()
            if "embedding_bags" not in n
        )
        return 3 * (tables + dense)

    @property
    def epoch(self) -> int:
        """Epochs of this worker's rows consumed by training (the stream may be ahead)."""
        return self.state.data_position // len(self.stream.shard)

    def _train(self) -> dict[str, Any]:
        tc = self.cfg.train
        if self.state.step >= tc.steps or paused(self.state.step, tc.pause_at):
            return self._nothing_left()
        loss_sum, loss_n = torch.zeros((), device=self.env.device), 0
        metrics: dict[str, Any] = {}
        while self.state.step < tc.steps:
            t0 = time.perf_counter()
            if self.solver is not None:
                lr_factor = 1.0
                loss_sum += self._solver_step()
            else:
                lr_factor = self.policy.apply(self.state.step)
                loss_sum += self.stepper(self.batches)["loss"].detach()
                self.state.data_position += tc.batch_size
                self.state.samples_seen += tc.batch_size * self.env.world_size
            loss_n += 1
            self.state.step += 1
            if due(self.state.step, tc.log_every, tc.steps):
                loss = collectives.mean_over_ranks(loss_sum / loss_n)
                loss_sum.zero_()
                loss_n = 0
                if not self._record_loss(loss, lr_factor):
                    return self._diverged(loss)
            self.clock.tick(time.perf_counter() - t0)
            if due(self.state.step, tc.checkpoint_every, tc.steps) or self.converged:
                metrics = self._report_point(lr_factor)
                if self.stopped_early or self.converged or paused(self.state.step, tc.pause_at):
                    break
        return metrics

    def _solver_step(self) -> torch.Tensor:
        """One iteration of the full-batch solver: its objective where it started; every row
        each of its passes read counts as a training sample."""
        assert self.solver is not None
        before = self.solver.evaluations
        value, self.converged = self.solver.step()
        self.state.samples_seen += self.solver.rows * (self.solver.evaluations - before)
        return torch.tensor(value, device=self.env.device)

    def _record_loss(self, loss: float, lr_factor: float) -> bool:
        """Keep the loss for the next report; False if it is NaN/inf."""
        self.history.append((self.state.step, loss))
        if not math.isfinite(loss):
            return False
        if self.env.is_main and not self.cfg.train.quiet:
            steps = self.cfg.train.steps
            self.log(f"step {self.state.step}/{steps} loss {loss:.5f} lr x{lr_factor:.3f}")
        return True

    def _interval_metrics(self, lr_factor: float) -> dict[str, Any]:
        global_batch = self.cfg.train.batch_size * self.env.world_size
        return {
            **self.static,
            **self._take_note(),
            "step": self.state.step,
            "epoch": self.epoch,
            "epochs_done": self.state.samples_seen / len(self.splits.train),
            "loss": self.history[-1][1] if self.history else float("nan"),
            "samples_per_s": self.clock.samples_per_s(global_batch),
            "ids_hashed": self.stream.ids_hashed,
            "lr_factor": lr_factor,
        }

    def _cost(self, advance: bool = True) -> dict[str, float]:
        """What the run has cost so far, over all its attempts (kept in the checkpoint): wall
        seconds since the first worker started (setup, training, evaluation, checkpoints; time
        an attempt lost after its last checkpoint is not counted), those seconds times the
        workers (GPU-seconds on GPU workers) and the training samples seen by all ranks.
        ``advance``: count the time since the last call (not for a report without a
        checkpoint, whose time no checkpoint keeps)."""
        now = time.perf_counter()
        elapsed, self.cost_mark = now - self.cost_mark, now
        if advance:
            self.state.wall_s += elapsed
            self.state.worker_s += elapsed * self.env.world_size
        return {
            "wall_s": self.state.wall_s,
            "worker_s": self.state.worker_s,
            "samples_seen": float(self.state.samples_seen),
        }

    def _take_note(self) -> dict[str, str]:
        """The resume notice, in the first report after the resume only."""
        note, self.resume_note = self.resume_note, ""
        return {"resume_note": note} if note else {}

    def _report_point(self, lr_factor: float) -> dict[str, Any]:
        """Evaluate when due, then checkpoint and report (the model's plain forward meanwhile)."""
        cfg, env, step = self.cfg, self.env, self.state.step
        metrics = self._interval_metrics(lr_factor)
        with self.stepper.plain_model() as model:
            t0 = time.perf_counter()
            sync_batch_norm(model)  # one set of statistics: evaluated, then checkpointed
            if due(step, cfg.train.eval_every, cfg.train.steps) or self.converged:
                # (a solver's last report, off the grid too: the model it ends with, scored)
                metrics.update(evaluate(model, self.splits.val, cfg, env, "val"))
            metrics.update(self.scorer.update(self.state, metrics))
            self.stopped_early = self.scorer.should_stop(self.state) and not self.converged
            last = step == cfg.train.steps or self.stopped_early or self.converged
            if last and len(self.splits.test):
                metrics.update(evaluate(model, self.splits.test, cfg, env, "test"))
            if self.stopped_early:
                metrics["early_stopped"] = 1.0
            if self.converged:
                metrics["converged"] = 1.0
            t1 = time.perf_counter()
            self.clock.eval_s += t1 - t0
            metrics.update(self.clock.as_metrics())
            metrics.update(self._cost())
            folder = self._save(model)
            self.reporter.report({**metrics, "loss_history": self.history}, folder, step)
            self.clock.ckpt_s += time.perf_counter() - t1
        self.history = []
        self.clock.new_interval()
        if not env.is_main or cfg.train.quiet:  # (a sweep's driver says how each trial ended)
            return metrics
        if "val_auc" in metrics:
            self.log(f"step {step}: val auc {metrics['val_auc']:.4f} ne {metrics['val_ne']:.4f}")
        if self.converged and self.solver is not None:
            self.log(f"step {step}: the solver converged (objective {self.solver.last:.6g})")
        if self.stopped_early:
            s = self.scorer
            self.log(
                f"step {step}: {s.monitor} has not improved for {s.patience} reports (best "
                f"{self.state.best:.5g} at step {self.state.best_step}); stopped early"
            )
        return metrics

    def _save(self, model: torch.nn.Module) -> str:
        folder = self.reporter.checkpoint_dir(self.state.step)
        env = self.env
        checkpoint.save(
            folder, model, self.stepper.optimizer, self.state, env.rank, env.world_size, env.device
        )
        if env.is_main:
            with open(os.path.join(folder, "sharding_plan.json"), "w") as f:
                json.dump(self.plan, f, indent=2)
        return folder

    def _nothing_left(self) -> dict[str, Any]:
        """The report of a run with no step left: its stored best, no new checkpoint."""
        metrics = {
            **self.static,
            **self._take_note(),
            "step": self.state.step,
            "epoch": self.epoch,
            "epochs_done": self.state.samples_seen / len(self.splits.train),
            "loss_history": [],
            **self._cost(advance=False),
            **self.scorer.update(self.state, {}),
        }
        if self.env.is_main:
            tc = self.cfg.train
            at = (f"train.steps={tc.steps}" if self.state.step >= tc.steps
                  else f"train.pause_at={tc.pause_at}")  # fmt: skip
            self.log(f"step {self.state.step}: already at {at}; nothing left to train")
        self.reporter.report(metrics, "", self.state.step)
        return metrics

    def _diverged(self, loss: float) -> dict[str, Any]:
        """Stop a trial whose loss is NaN/inf: report it (no checkpoint) and return."""
        step = self.state.step
        if self.env.is_main:
            self.log(f"step {step}: loss is {loss}; stopping this trial as diverged")
        nan = float("nan")  # schedulers and searchers need the metric keys; NaN ranks it last
        metrics = {
            **self.static,
            "step": step,
            "loss": loss,
            "diverged": 1.0,
            "loss_history": self.history,
            **{k: nan for k in ("val_auc", "val_log_loss", "val_ne")},
            **self.scorer.update(self.state, {}),
        }
        self.reporter.report(metrics, "", step)
        return metrics


def warm(folder: str, built: Any, env: WorkerEnv, log: Callable[[str], None]) -> str:
    """Start from the checkpoint at ``folder`` (``train.init_from``; a URI is downloaded); the
    notice for the first report."""
    from recsys.runtime.storage import local_folder

    with local_folder(folder) as local:
        checkpoint.verify(local)
        notes = checkpoint.warm_start(local, built.model, built.optimizer)
    note = f"warm-started from {folder}" + (f" ({'; '.join(notes)})" if notes else "")
    if env.is_main:
        log(note)
    return note


def resume_note(state: checkpoint.TrainState, world_size: int, batch_size: int) -> str:
    """The notice of a resume on another number of workers or another plan (``state`` as
    restored; ``batch_size`` per worker)."""
    saved = state.saved_world_size
    note = f"resumed at step {state.step} on {world_size} workers from a checkpoint of {saved}: "
    if state.remapped:
        note += (
            "tables resharded exactly; the row-wise optimizer state of "
            f"{', '.join(state.remapped)} mapped to this plan's column shards (a row's state is "
            "the column-weighted mean of its saved shards' states: exact where shards merge, "
            "each part starting from the whole shard's where one splits); the rest of the "
            "optimizer state resharded exactly"
        )
    else:
        note += "tables and optimizer state resharded exactly"
    if saved != world_size:
        note += (
            "; the data position kept its epoch and the fraction done (rows of the current epoch "
            f"may repeat or be skipped); ranks {saved} and up got fresh RNG seeds; the global "
            f"batch is now {batch_size * world_size} (was {batch_size * saved})"
        )
    return note
