"""How a run trains: its optimizers, its loop (epochs, patience, what it monitors), and how its
tables are sharded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from recsys.config.choices import (
    ComputeKernel,
    DenseOptimizer,
    DenseTables,
    EmbeddingDecayMode,
    EmbeddingOptimizer,
    Mode,
    PipelineMode,
    ShardingType,
    Solver,
    monitor_parts,
)
from recsys.configlib import (
    check,
    check_choices,
)


@dataclass
class OptimConfig:
    """Optimizers and the learning-rate policy.

    Attributes:
        embedding_optimizer: FBGEMM optimizer fused into the embedding backward
            (``exact_rowwise_adagrad``, ``exact_adagrad``, ``exact_sgd``, ``adam``).
        embedding_lr: its learning rate.
        dense_optimizer: optimizer of the MLPs and interaction (``adagrad``, ``sgd``, ``adam``).
        lr: dense learning rate (peak of the schedule).
        eps: epsilon of Adagrad/Adam, both fused and dense.
        warmup_steps: linear warmup from 0 to the peak.
        decay_start_step / decay_steps: polynomial decay (power ``decay_power``) to
            ``end_lr_factor * peak`` over ``decay_steps`` steps, as the DLRM reference's
            ``LRPolicyScheduler``. ``decay_steps = 0`` keeps the peak.
        decay_power: the decay's exponent.
        end_lr_factor: the final learning rate as a share of the peak.
        weight_decay: dense weight decay (the ``dense_optimizer``'s own ``weight_decay``: L2, added
            to the gradient). It also applies to a table trained by the dense optimizer: one whose
            ``sharding`` names ``data_parallel`` or the ``dense`` compute kernel. Such a table is
            trained by ``dense_optimizer`` at ``lr``, not at ``embedding_lr``. The planner never
            makes a table data-parallel on its own (TorchRec's would, for small tables on GPUs).
        embedding_weight_decay: weight decay on the embedding tables, applied by the fused FBGEMM
            optimizer in backward (``0``: none). FBGEMM updates only the rows a batch looks up,
            so a row is decayed at the steps that read it, never in between (a rare id is decayed
            less often than a frequent one). How, by ``embedding_weight_decay_mode``. A table
            trained by the dense optimizer (see ``weight_decay``) gets ``weight_decay`` instead.
            CPU workers need ``embeddings.dtype: fp16`` for it: FBGEMM's CPU kernel for fp32
            tables drops the decay (it is refused there, when the worker shards the model);
            GPU workers apply it to tables of every dtype.
        embedding_weight_decay_mode: ``l2``: ``wd * w`` is added to the row's gradient before the
            optimizer sees it (as ``weight_decay`` does for the dense part): for
            ``exact_rowwise_adagrad``, ``g' = g + wd * w``, the row's state ``+= mean(g'^2)``,
            ``w -= lr * g' / (sqrt(state) + eps)``, ``lr`` the scheduled ``embedding_lr``. ``g``
            is the gradient of the loss's mean over the global batch whatever the number of
            workers (TorchRec divides the workers' sum by their number, as DDP averages the dense
            gradients), so one worker and several regularise alike. ``decoupled``: the row is
            shrunk apart from the gradient, ``w *= 1 - lr * wd`` at each update (AdamW's rule;
            the optimizer's state sees the plain gradient). Which optimizer supports which
            (FBGEMM's kernels):
            ``exact_rowwise_adagrad`` both, ``adam`` ``decoupled`` only, ``exact_adagrad`` and
            ``exact_sgd`` none (refused with ``embedding_weight_decay > 0``).
        dense_tables: which optimizer trains a table held dense (data-parallel, TorchRec's
            ``dense`` kernel: every worker a replica, its whole gradient all-reduced). ``dense``:
            the dense optimizer at ``lr`` with ``weight_decay`` (TorchRec's way; the references'
            dense rule). ``embedding``: the embedding optimizer's own rule at ``embedding_lr``
            with ``embedding_weight_decay``, as torch's optimizers run it on the whole table
            (``adam``: Adam, AdamW with ``decoupled`` decay; ``exact_adagrad``: Adagrad;
            ``exact_rowwise_adagrad``: one Adagrad state per row; ``exact_sgd``: SGD), so a
            table trains by the same keys whether FBGEMM fuses its optimizer or not. A worker
            without FBGEMM's fused Adam (a CPU worker) sets it, with the ``dense`` kernel, for
            ``embedding_optimizer: adam`` (``recsys.distributed.preflight``).
    """

    embedding_optimizer: EmbeddingOptimizer = "exact_rowwise_adagrad"
    embedding_lr: float = 0.05
    dense_optimizer: DenseOptimizer = "adagrad"
    lr: float = 0.05
    eps: float = 1e-8
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    end_lr_factor: float = 0.0
    weight_decay: float = 0.0
    embedding_weight_decay: float = 0.0
    embedding_weight_decay_mode: EmbeddingDecayMode = "l2"
    dense_tables: DenseTables = "dense"

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        check(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        check(self.embedding_lr > 0, "optim.embedding_lr", self.embedding_lr, "must be > 0")
        check(self.eps > 0, "optim.eps", self.eps, "must be > 0")
        for name in ("warmup_steps", "decay_start_step", "decay_steps"):
            check(getattr(self, name) >= 0, f"optim.{name}", getattr(self, name), "must be >= 0")
        if self.decay_steps > 0:
            check(
                self.decay_start_step >= self.warmup_steps,
                "optim.decay_start_step",
                self.decay_start_step,
                f"must be >= warmup_steps ({self.warmup_steps})",
            )
        check(0 <= self.end_lr_factor <= 1, "optim.end_lr_factor", self.end_lr_factor, "in [0,1]")
        check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        self._check_embedding_decay()

    def _check_embedding_decay(self) -> None:
        """``embedding_weight_decay`` a number >= 0 that the embedding optimizer supports in
        ``embedding_weight_decay_mode`` (``EMBEDDING_DECAY_MODES``)."""
        wd, mode = self.embedding_weight_decay, self.embedding_weight_decay_mode
        ok = math.isfinite(wd) and wd >= 0
        check(ok, "optim.embedding_weight_decay", wd, "must be a number >= 0 (0: none)")
        if wd == 0:
            return
        opt = self.embedding_optimizer
        modes = EMBEDDING_DECAY_MODES[opt]
        if not modes:
            why = (
                f"optim.embedding_optimizer={opt!r} has no weight decay in FBGEMM: use "
                "exact_rowwise_adagrad (l2 or decoupled) or adam (decoupled), or 0"
            )
            check(False, "optim.embedding_weight_decay", wd, why)
        why = (
            f"optim.embedding_optimizer={opt!r} with optim.embedding_weight_decay={wd!r} "
            f"supports {' or '.join(modes)} only in FBGEMM"
        )
        check(mode in modes, "optim.embedding_weight_decay_mode", mode, why)
        if mode == "decoupled":
            shrink = self.embedding_lr * wd
            why = (
                f"decoupled decay multiplies a row by 1 - embedding_lr * embedding_weight_decay "
                f"= {1 - shrink:.3g} at each update: embedding_lr * embedding_weight_decay must "
                "be < 1"
            )
            check(shrink < 1, "optim.embedding_weight_decay", wd, why)


# Which weight-decay modes FBGEMM's fused optimizers apply (its optimizer codegen): row-wise
# Adagrad both (``weight_decay_mode`` L2 / DECOUPLE), Adam decoupled only (it takes no mode: ``w -=
# lr * (update + wd * w)``), Adagrad and SGD none (their kernels take no ``weight_decay``).
EMBEDDING_DECAY_MODES: dict[str, tuple[EmbeddingDecayMode, ...]] = {
    "exact_rowwise_adagrad": ("l2", "decoupled"),
    "adam": ("decoupled",),
    "exact_adagrad": (),
    "exact_sgd": (),
}


@dataclass
class TrainConfig:
    """The training loop.

    Attributes:
        batch_size: samples per worker per step (the global batch is ``batch_size * world_size``).
        steps: training steps (the data is cycled by epochs if it runs out). With ``epochs`` set
            it is derived (below) and a value given here is replaced.
        epochs: the budget in epochs instead of steps (0: off, ``steps`` counts; fractions
            allowed). One epoch is the training split once over all workers: ``steps_per_epoch
            = ceil(train_rows / (batch_size * world_size))``; ``steps = ceil(epochs *
            steps_per_epoch)``, and ``eval_every`` and ``checkpoint_every`` both become the
            report interval ``max(1, steps_per_epoch // reports_per_epoch)`` (the last step
            always reports). The workers derive them (``recsys.data.dataset.with_budget``, from
            the training rows and their number), and so does a sweep's driver for its table and
            its trials' status; ASHA counts in epochs (its grace period one epoch, its maximum
            ``epochs``). The budget is in samples: a run resumed on another number of workers
            derives again and trains the samples it has left at its new global batch. Every
            report carries ``epochs_done`` (``samples_seen / train_rows``); patience and the
            kept best checkpoint work as with steps.
        reports_per_epoch: with ``epochs``: evaluate, checkpoint and report this many times per
            epoch (at most once a step).
        eval_every: validate every N steps (0: only at the end; with ``epochs``: derived).
        checkpoint_every: checkpoint and report every N steps (0: only at the end; with
            ``epochs``: derived). Metrics are reported together with a checkpoint, so a restarted
            worker never reports a step twice.
        eval_batches: cap on validation batches per evaluation (0: the whole split).
        seed: seeds model init, data order and RNGs.
        log_every: record the training loss every N steps (reported with the next checkpoint).
        monitor / monitor_mode: the validation metric that scores the run and whether higher
            (``max``) or lower is better: ``val_auc``, ``val_log_loss``, ``val_ne`` or
            ``val_accuracy`` (of the first task), ``val_auc/<task>`` (of one task) or
            ``val_auc/mean`` (the tasks' average). Every report carries its best value so far
            (``best_<monitor>``, ``best_step``), the best checkpoints are kept by it, and a sweep
            sets both from its space's ``metric`` and ``mode``.
        patience: stop early after this many reports with validation metrics whose ``monitor``
            did not improve on the best (0: never); the best checkpoint is kept.
        quiet: no per-step loss, validation or stopping lines (sweeps: their driver says as
            each trial starts and ends).
        checkpoint_staging: where a worker stages its checkpoint before Ray uploads it, when the
            run's storage is not a file system (an object store URI); empty: the system's temp
            folder. Its free space is checked before each checkpoint. On a file-system storage
            (a local or mounted path) checkpoints are written there directly, never staged.
        deterministic: GPU workers run deterministic kernels where torch offers them
            (``torch.use_deterministic_algorithms(True, warn_only=True)``,
            ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` for cuBLAS, cuDNN's deterministic mode; not torch's
            filling of new memory, a debugging aid), so a
            resumed run repeats an uninterrupted one and two runs of one seed agree. FBGEMM's
            ``exact_*`` optimizers and its embedding Adam are deterministic by design (rows are
            sorted before their updates). ``false``: torch's faster defaults. CPU kernels are
            deterministic either way.
        solver: ``sgd``: the optimizers above, a batch a step. ``lbfgs``: a full-batch convex
            solver (``recsys.train.solver``): each step one L-BFGS iteration with a line search
            over the whole training split, minimising the mean loss plus ``optim.weight_decay /
            2`` times the squared parameters but the biases; ``steps`` is then the iteration
            cap and a step that changes the objective by under 1e-9 (relative) ends the run
            (``converged``). Logistic regression only (a convex problem: it starts from zero
            weights and reaches its optimum for each L2 strength), every table a replica
            (``sharding``: ``data_parallel``); ``optim.*`` rates and optimizers are unused.
        init_from: a checkpoint folder (or object store URI) a new run starts from: its weights
            and optimizer state (a warm start: ``recsys-retrain`` sets it to the champion's),
            resharded to this run's plan; a table whose rows grew since (a grown vocabulary)
            gets its saved rows and keeps its new rows' initial values. The run's step, data
            position and scores start afresh; a resumed run starts from its own checkpoint.
            Empty: from its initialisation.
        pause_at: stop at the first report at or past this step, its checkpoint written, as a
            run interrupted there (0: off). Started again without it (or with a later one), the
            run resumes from that checkpoint and trains on to ``steps`` with the schedule it
            would have had uninterrupted; started again at or past it, it has nothing to train.
            A sweep's successive halving trains a reference's grid so, a rung at a time.
    """

    batch_size: int = 256
    steps: int = 200
    epochs: float = 0.0
    reports_per_epoch: int = 1
    eval_every: int = 100
    checkpoint_every: int = 100
    eval_batches: int = 0
    seed: int = 0
    log_every: int = 20
    monitor: str = "val_auc"
    monitor_mode: Mode = "max"
    patience: int = 0
    quiet: bool = False
    checkpoint_staging: str = ""
    deterministic: bool = True
    solver: Solver = "sgd"
    init_from: str = ""
    pause_at: int = 0

    def __post_init__(self) -> None:
        check_choices(self, "train")
        monitor_parts(self.monitor)
        check(self.patience >= 0, "train.patience", self.patience, "must be >= 0 (0: off)")
        check(self.pause_at >= 0, "train.pause_at", self.pause_at, "must be >= 0 (0: off)")
        check(self.batch_size >= 1, "train.batch_size", self.batch_size, "must be >= 1")
        check(self.steps >= 1, "train.steps", self.steps, "must be >= 1")
        ok = math.isfinite(self.epochs) and self.epochs >= 0
        check(ok, "train.epochs", self.epochs, "must be a number >= 0 (0: train.steps counts)")
        rpe = self.reports_per_epoch
        check(rpe >= 1, "train.reports_per_epoch", rpe, "must be >= 1")
        for name in ("eval_every", "checkpoint_every", "eval_batches"):
            check(getattr(self, name) >= 0, f"train.{name}", getattr(self, name), "must be >= 0")
        check(self.log_every >= 1, "train.log_every", self.log_every, "must be >= 1")
        if self.eval_every and self.checkpoint_every:
            check(
                self.eval_every % self.checkpoint_every == 0,
                "train.eval_every",
                self.eval_every,
                f"must be a multiple of train.checkpoint_every ({self.checkpoint_every}): "
                "results are reported with checkpoints",
            )


@dataclass
class TableSharding:
    """Constraints on how one table may be sharded (TorchRec ``ParameterConstraints``).

    Attributes:
        sharding_types: allowed types (``table_wise``, ``column_wise``, ``row_wise``,
            ``table_row_wise``, ``data_parallel``); empty = any of these but ``data_parallel``
            (which the dense optimizer would train: see ``optim.weight_decay``), and on CPU
            ``table_wise`` or ``column_wise``.
        compute_kernels: allowed kernels (``fused``, ``dense``); empty = any.
        min_partition: smallest column-wise shard width.
    """

    sharding_types: list[ShardingType] = field(default_factory=list)
    compute_kernels: list[ComputeKernel] = field(default_factory=list)
    min_partition: int | None = None

    def __post_init__(self) -> None:
        check_choices(self, "sharding.<table>")
        if self.min_partition is not None:
            check(self.min_partition >= 4, "min_partition", self.min_partition, "must be >= 4")


@dataclass
class ShardingConfig:
    """How ``DistributedModelParallel`` may shard the tables; the planner picks within this.

    Attributes:
        default: constraints for every table without its own entry in ``tables``.
        tables: per-table constraints by table name (``t_<feature>``, or ``t_<feature>_q`` /
            ``t_<feature>_r`` for QR tables); a table that features share
            (``embeddings.shared``) is named after its owner.
        pipeline: drive training with TorchRec's ``TrainPipelineSparseDist`` (overlaps input
            distribution with compute on GPU). ``auto``: on GPU only.
    """

    default: TableSharding = field(default_factory=TableSharding)
    tables: dict[str, TableSharding] = field(default_factory=dict)
    pipeline: PipelineMode = "auto"

    def __post_init__(self) -> None:
        check_choices(self, "sharding")
