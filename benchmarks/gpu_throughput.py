"""Step throughput on one GPU: this project's training step against TorchRec's own DLRM
(``torchrec.models.dlrm.DLRM`` in its ``DLRMTrain``), one rank, in the same process, on the same
synthetic batches, alternating runs. ``./run.sh gpu-check throughput`` runs it on a GPU host.

    python -m benchmarks.gpu_throughput --out runs/gpu-check     # Criteo Kaggle shape, cuda:0
    python -m benchmarks.gpu_throughput --tiny --device cpu --steps 3 --warmup 3 --reps 1

The shape (``KAGGLE``): the 26 tables of the ``criteo_kaggle`` experiment (Kaggle's cardinalities,
``recsys.config_registry.KAGGLE_ROWS``, 33.8M rows), dim 128, fp32, batch 16384, 13 dense
features, bottom MLP 512-256-128, top MLP 1024-1024-512-256-1, ``dot`` interaction, as TorchRec's
DLRM example. Each model's tables (weights and row-wise Adagrad state) may take ``TABLE_SHARE`` of
the GPU's memory; where Kaggle's do not fit, every table is capped at the largest row count that
does (``cap_rows``), and the figures say the cap (an H200 or an 80 GB GPU holds them whole).

Both models train the same tables, from ``recsys.models.embeddings.embedding_bag_configs``
(names, sizes, init), planned by TorchRec's ``EmbeddingShardingPlanner`` with the same topology
(this GPU's memory) and constraints (every table ``table_wise`` in FBGEMM's ``fused`` kernel), with
the same fused optimizer (FBGEMM's exact row-wise Adagrad) and dense optimizer (Adagrad), both
driven by ``TrainPipelineSparseDist``, under the same deterministic-kernel setting (on, as our GPU
workers run; ``--no-deterministic`` for off). What differs is what is ours:

- ours: built the way a worker builds it (``recsys.train.build.build``: ``DLRM`` in
  ``ModelAndLoss``, sharded by ``recsys.distributed.sharding``), stepped by the worker's
  ``Stepper`` (``recsys.train.stepper``) with the pipeline on;
- TorchRec's: ``DLRMTrain(DLRM(EmbeddingBagCollection(...)))`` on ``meta``, sharded by
  ``DistributedModelParallel``, its ``CombinedOptimizer`` of ``fused_optimizer`` and a
  ``KeyedOptimizerWrapper``, ``TrainPipelineSparseDist.progress`` (as TorchRec's DLRM example).

Samples/s: the median over ``reps`` alternating runs (ours, TorchRec's, ours, ...) of ``steps``
steps after ``warmup`` steps, ``torch.cuda.synchronize`` at each run's ends.

Goal: ours / TorchRec's samples/s >= 0.9 (``GOAL``); the verdict is computed from the figures.
Both models must have trained (loss finite, dense weights and the first batch's table rows
changed), or the run fails. On CPU (gloo, FBGEMM's CPU kernels: the same fused row-wise Adagrad,
``table_wise``) the tiny shape runs the whole harness in seconds (``tests/unit/
test_gpu_throughput.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import date
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch

from benchmarks.common import init_world1, median_spread, revision, table
from benchmarks.step import batches
from recsys.config import ExperimentConfig
from recsys.config_registry import KAGGLE_ROWS, criteo_kaggle
from recsys.distributed.env import WorkerEnv, backend_for, current, deterministic_kernels
from recsys.models.embeddings import embedding_bag_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 0.9  # ours / TorchRec's DLRM, samples/s
TABLE_SHARE = 0.3  # of the GPU's memory, for each model's tables and their optimizer state
FP32, ROWWISE_STATE = 4, 4  # bytes per table element; per row (row-wise Adagrad's one float)
N_BATCHES = 4  # distinct batches, cycled
FILES = ("gpu-throughput.json", "gpu-throughput.md")


@dataclass(frozen=True)
class Shape:
    """One case.

    Attributes:
        name: how the figures name it.
        rows: each table's rows as the data has them.
        dim: embedding dim ``D`` (also the bottom MLP's output width).
        batch: samples per step.
        bottom: the bottom MLP's widths before its ``D``-wide output layer.
        top: the top MLP's widths before its one-logit output layer.
        cap: rows kept per table at most (None: every table whole).
        num_dense: dense features.
    """

    name: str
    rows: tuple[int, ...]
    dim: int
    batch: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    cap: int | None = None
    num_dense: int = 13

    def __post_init__(self) -> None:
        if not self.rows or min(self.rows) < 1 or self.dim < 1 or self.batch < 1:
            raise ValueError(f"{self.name}: rows, dim and batch must be positive")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"{self.name}: cap must be >= 1, got {self.cap}")

    @property
    def tables(self) -> list[int]:
        """Each table's rows, capped."""
        return [min(r, self.cap) if self.cap else r for r in self.rows]

    def table_bytes(self) -> int:
        """One model's tables in fp32 with row-wise Adagrad's state."""
        return table_bytes(self.tables, self.dim)

    def text(self) -> str:
        capped = sum(r > self.cap for r in self.rows) if self.cap else 0
        cap = f"{capped} capped at {self.cap:,} rows" if capped else "none capped"
        return (
            f"{len(self.rows)} tables ({sum(self.tables):,} rows, {cap}), dim {self.dim}, "
            f"{gib(self.table_bytes())} per model with optimizer state; batch "
            f"{self.batch}, {self.num_dense} dense, bottom MLP "
            f"{'-'.join(map(str, [*self.bottom, self.dim]))}, top MLP "
            f"{'-'.join(map(str, [*self.top, 1]))}, dot"
        )


KAGGLE = Shape("criteo-kaggle", tuple(KAGGLE_ROWS), 128, 16384, (512, 256), (1024, 1024, 512, 256))
TINY = Shape("tiny", (1000,) * 4, 16, 256, (32,), (64, 32))


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def table_bytes(rows: Iterable[int], dim: int) -> int:
    return sum(r * (dim * FP32 + ROWWISE_STATE) for r in rows)


def cap_rows(rows: Iterable[int], dim: int, budget: int) -> int | None:
    """The largest per-table row cap whose tables fit ``budget`` bytes (``table_bytes``); None
    where every table fits whole."""
    rows = list(rows)
    if table_bytes(rows, dim) <= budget:
        return None
    lo, hi = 0, max(rows)  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if table_bytes((min(r, mid) for r in rows), dim) <= budget else (lo, mid)
    if lo == 0:
        raise ValueError(f"{budget} bytes hold not even one row per table")
    return lo


def fitted(shape: Shape, device: torch.device) -> Shape:
    """``shape`` capped to fit ``TABLE_SHARE`` of ``device``'s memory (a GPU's; CPU: as is)."""
    if device.type != "cuda" or shape.cap is not None:
        return shape
    total = torch.cuda.get_device_properties(device).total_memory
    return replace(shape, cap=cap_rows(shape.rows, shape.dim, int(TABLE_SHARE * total)))


def config(shape: Shape, deterministic: bool = True) -> ExperimentConfig:
    """The ``criteo_kaggle`` experiment at ``shape``, on synthetic rows, every table
    ``table_wise`` in the fused kernel, pipeline on."""
    return criteo_kaggle().with_overrides(
        {
            "data.source": "synthetic",
            "data.paths": [],
            "data.synthetic.num_samples": shape.batch * N_BATCHES,
            "embeddings.num_embeddings": shape.tables,
            "embeddings.dim": shape.dim,
            "model.num_dense": shape.num_dense,
            "model.bottom_mlp": list(shape.bottom),
            "model.top_mlp": list(shape.top),
            "model.interaction": "dot",
            "train.batch_size": shape.batch,
            "train.deterministic": deterministic,
            "sharding.default": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]},
            "sharding.pipeline": "on",
        }
    )


@dataclass
class Model:
    """One model under test: ``step()`` trains a step and returns its loss (a tensor on the
    device); ``module`` the sharded model (``DistributedModelParallel``)."""

    step: Callable[[], torch.Tensor]
    module: nn.Module


def ours(cfg: ExperimentConfig, env: WorkerEnv, data: list[Batch]) -> Model:
    """Our model and step, built as a worker builds them (``recsys.train.trainer.Trainer``)."""
    from recsys.train.build import build
    from recsys.train.stepper import Stepper, use_pipeline

    built = build(cfg, env)
    pipelined = use_pipeline(cfg.sharding, env.device)
    stepper = Stepper(built.model, built.optimizer, env.device, pipelined)
    it = itertools.cycle(data)
    return Model(lambda: stepper(it)["loss"], built.model)


def torchrec_dlrm(cfg: ExperimentConfig, env: WorkerEnv, data: list[Batch]) -> Model:
    """TorchRec's DLRM over the same tables, sharded and stepped as TorchRec's DLRM example does,
    with our planner settings and optimizers (``recsys.distributed.sharding.planner`` is
    TorchRec's planner told this machine and the constraints; ``sharders`` carry the fused
    optimizer)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from recsys.distributed.sharding import Machine, planner, sharders
    from recsys.train.optim import dense_optimizer_factory

    torch.manual_seed(cfg.train.seed)
    tables = embedding_bag_configs(cfg.embeddings, cfg.train.seed)
    emb, model = cfg.embeddings, cfg.model
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables, device=torch.device("meta")),
        dense_in_features=model.num_dense,
        dense_arch_layer_sizes=[*model.bottom_mlp, emb.dim],
        over_arch_layer_sizes=[*model.top_mlp, 1],
        dense_device=env.device,
    )
    train_model = DLRMTrain(dlrm)
    names = [t.name for t in tables]
    p, _ = planner(cfg.sharding, names, Machine.of(env), 1, 1, cfg.train.batch_size)
    plan = p.collective_plan(train_model, sharders(cfg.optim), dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(
        module=train_model, device=env.device, plan=plan, sharders=sharders(cfg.optim)
    )
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        dense_optimizer_factory(cfg.optim),
    )
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    pipeline = TrainPipelineSparseDist(dmp, optimizer, env.device)
    it = itertools.cycle(data)
    return Model(lambda: pipeline.progress(it)[0], dmp)


def one_rank_group(device: torch.device) -> None:
    """A one-rank process group on a free local port: NCCL on a GPU, gloo on CPU (as a worker's)."""
    init_world1(backend_for(device.type == "cuda"))


def plan_kinds(module: nn.Module) -> dict[str, int]:
    """Tables per ``sharding_type/compute_kernel`` in the model's plan."""
    kinds: dict[str, int] = {}
    for module_plan in module.plan.plan.values():  # type: ignore[union-attr,operator]
        for ps in module_plan.values():
            kind = f"{ps.sharding_type}/{ps.compute_kernel}"
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def table_ids(cfg: ExperimentConfig, batch: Batch) -> dict[str, torch.Tensor]:
    """Per table, the distinct rows ``batch`` looks up in it."""
    kjt = batch.sparse_features
    return {
        t.name: torch.unique(torch.cat([kjt[f].values() for f in t.feature_names]))
        for t in embedding_bag_configs(cfg.embeddings)
    }


def table_rows(module: nn.Module, ids: dict[str, torch.Tensor]) -> torch.Tensor:
    """The rows ``ids[table]`` of every table in ``module``'s state, concatenated (on the host)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    parts = []
    for key, value in module.state_dict().items():
        table = key.rsplit(".", 2)[-2] if key.endswith(".weight") else ""
        if ".embedding_bags." not in key or table not in ids:
            continue
        if isinstance(value, ShardedTensor):
            shards = [(s.metadata.shard_offsets, s.tensor) for s in value.local_shards()]
        else:
            shards = [([0, 0], value)]
        for (r0, _), t in shards:
            rows = ids[table].to(t.device)
            rows = rows[(rows >= r0) & (rows < r0 + t.shape[0])] - r0
            parts.append(t[rows].detach().float().flatten().cpu())
    return torch.cat(parts)


def dense_weights(module: nn.Module) -> torch.Tensor:
    """Every dense parameter (neither a table nor trained in backward), concatenated (on the
    host)."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    named = in_backward_optimizer_filter(module.named_parameters())
    params = [p for n, p in named if ".embedding_bags." not in n]
    return torch.cat([p.detach().float().flatten().cpu() for p in params])


def timed_steps(
    step: Callable[[], torch.Tensor], steps: int, device: torch.device
) -> tuple[float, torch.Tensor]:
    """Seconds for ``steps`` steps (the device synchronised at both ends) and the last loss."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _: None)
    sync(device)
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(steps):
        loss = step()
    sync(device)
    return time.perf_counter() - t0, loss


@dataclass
class Side:
    """One model's figures.

    Attributes:
        samples_per_s: the median over the runs. spread_pct: (max - min) / median of the runs.
        runs: samples/s of each run. loss_first / loss_last: of the first and the last step.
        dense_change / table_change: the largest absolute change of a dense weight and of a table
            row the first batch looks up, from before the first step to after the last.
        plan: tables per ``sharding_type/compute_kernel``.
    """

    samples_per_s: float
    spread_pct: float
    runs: list[float]
    loss_first: float
    loss_last: float
    dense_change: float
    table_change: float
    plan: dict[str, int]

    @property
    def trained(self) -> bool:
        finite = math.isfinite(self.loss_first) and math.isfinite(self.loss_last)
        return finite and self.dense_change > 0 and self.table_change > 0


@dataclass
class Result:
    """The figures of one run: each model's (``Side``), their ratio and the goal's verdict."""

    shape: dict[str, Any]
    device: str
    warmup: int
    steps: int
    reps: int
    deterministic: bool
    ours: Side
    torchrec: Side
    peak_memory_bytes: int | None
    machine: dict[str, str] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ours.samples_per_s / self.torchrec.samples_per_s

    @property
    def goal_met(self) -> bool:
        return self.ratio >= GOAL

    def verdict(self) -> str:
        met = "met" if self.goal_met else "missed"
        trained = "both trained" if self.ours.trained and self.torchrec.trained else (
            "NOT TRAINED: " + ", ".join(
                n for n, s in (("ours", self.ours), ("TorchRec's", self.torchrec)) if not s.trained
            )
        )  # fmt: skip
        return (
            f"ours / TorchRec's DLRM samples/s: {self.ratio:.2f}x "
            f"(goal >= {GOAL}: {met}); {trained}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ratio": self.ratio,
            "goal": GOAL,
            "goal_met": self.goal_met,
            "trained": {"ours": self.ours.trained, "torchrec": self.torchrec.trained},
            "verdict": self.verdict(),
        }


def measure(
    shape: Shape,
    device: torch.device,
    *,
    warmup: int = 10,
    steps: int = 50,
    reps: int = 3,
    deterministic: bool = True,
) -> Result:
    """Both models at ``shape`` on ``device`` (a one-rank process group must exist:
    ``one_rank_group``); ``warmup`` >= 1."""
    cfg = config(shape, deterministic)
    if cfg.train.deterministic:
        deterministic_kernels(device)  # as the worker does, before any CUDA work; for both
    env = current(use_gpu=device.type == "cuda")
    if env.device != device:
        raise ValueError(f"device {device}: a one-rank worker runs on {env.device}")
    data, theirs = same_batches(cfg, device)
    models = [ours(cfg, env, data), torchrec_dlrm(cfg, env, theirs)]
    ids = table_ids(cfg, data[0])
    before = [(dense_weights(m.module), table_rows(m.module, ids)) for m in models]
    first = [float(m.step()) for m in models]
    for m in models:
        timed_steps(m.step, warmup - 1, device)
    runs: list[list[float]] = [[], []]
    last = [torch.zeros(()), torch.zeros(())]
    for _ in range(reps):  # alternating: ours, TorchRec's, ours, ...
        for i, m in enumerate(models):
            seconds, last[i] = timed_steps(m.step, steps, device)
            runs[i].append(shape.batch * steps / seconds)
    sides = [
        figures(m, r, (f, float(loss)), b, ids)
        for m, r, f, loss, b in zip(models, runs, first, last, before, strict=True)
    ]
    det = cfg.train.deterministic and device.type == "cuda"  # deterministic_kernels: GPU only
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Result(
        {**asdict(shape), "tables": shape.tables, "text": shape.text()},
        str(device), warmup, steps, reps, det, sides[0], sides[1], peak, machine(device),
    )  # fmt: skip


def same_batches(cfg: ExperimentConfig, device: torch.device) -> tuple[list[Batch], list[Batch]]:
    """``N_BATCHES`` synthetic batches as ours reads them (labels ``[B, 1]``) and as
    ``DLRMTrain`` does (labels ``[B]``); page-locked for a GPU, as the worker's loader has them."""
    data = batches(cfg, n=N_BATCHES)
    theirs = [Batch(b.dense_features, b.sparse_features, b.labels[:, 0].contiguous()) for b in data]
    if device.type == "cuda":
        data, theirs = [b.pin_memory() for b in data], [b.pin_memory() for b in theirs]
    return data, theirs


def figures(
    model: Model,
    runs: list[float],
    losses: tuple[float, float],
    before: tuple[torch.Tensor, torch.Tensor],
    ids: dict[str, torch.Tensor],
) -> Side:
    """One model's ``Side``: its runs, first and last loss, and how far its dense weights and
    table rows (``before``) moved."""
    med, spread = median_spread(runs)
    dense_change = float((dense_weights(model.module) - before[0]).abs().max())
    table_change = float((table_rows(model.module, ids) - before[1]).abs().max())
    plan = plan_kinds(model.module)
    return Side(med, spread, runs, *losses, dense_change, table_change, plan)


def machine(device: torch.device) -> dict[str, str]:
    """The device, the versions, the date and the commit the figures were measured on."""
    import fbgemm_gpu
    import torchrec

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = f"{props.name}, {props.total_memory / 2**30:.1f} GiB"
    else:
        name = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {
        "device": name,
        "torch": torch.__version__,
        "torchrec": torchrec.__version__,
        "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "unknown"),
        "date": date.today().isoformat(),
        "commit": revision(ROOT).text(),
    }


def markdown(result: Result, command: str) -> str:
    """The figures as BENCHMARKS.md's GPU section takes them: a heading, what ran, a table, the
    verdict."""
    m, o, t = result.machine, result.ours, result.torchrec
    peak = result.peak_memory_bytes
    header = ["config", "ours samples/s", "spread", "TorchRec DLRM samples/s", "spread",
              "ours / TorchRec", "goal", "verdict"]  # fmt: skip
    row = [result.shape["name"], o.samples_per_s, f"±{o.spread_pct:.0f}%", t.samples_per_s,
           f"±{t.spread_pct:.0f}%", f"{result.ratio:.2f}x", f">= {GOAL}",
           "met" if result.goal_met else "missed"]  # fmt: skip
    plans = "; ".join(
        f"{name}: " + ", ".join(f"{n} {k}" for k, n in sorted(s.plan.items()))
        for name, s in (("ours", o), ("TorchRec's", t))
    )
    return "\n".join(
        [
            "## gpu throughput",
            "",
            f"{m['date']}, {m['device']}; torch {m['torch']}, torchrec {m['torchrec']}, "
            f"fbgemm_gpu {m['fbgemm_gpu']}; {m['commit']}; `{command}`.",
            "",
            f"Our training step (`recsys.train.build`, the worker's `Stepper`) against TorchRec's "
            f"`torchrec.models.dlrm.DLRM` (in `DLRMTrain`), one rank on {result.device}, the same "
            f"process and batches: {result.shape['text']}. Both: the same tables and plan "
            f"({plans}), FBGEMM's fused exact row-wise Adagrad, dense Adagrad, "
            f"`TrainPipelineSparseDist`, deterministic kernels "
            f"{'on' if result.deterministic else 'off'}. Medians of {result.reps} alternating "
            f"runs of {result.steps} steps after {result.warmup} warm-up steps"
            + (f"; peak GPU memory {gib(peak)}." if peak is not None else "."),
            "",
            table(header, [row]),
            "",
            result.verdict(),
        ]
    )


def write(result: Result, folder: str, command: str) -> list[str]:
    """``gpu-throughput.json`` and ``gpu-throughput.md`` in ``folder``; their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, name) for name in FILES]
    with open(paths[0], "w") as f:
        json.dump({**result.as_dict(), "command": command}, f, indent=2)
    with open(paths[1], "w") as f:
        f.write(markdown(result, command) + "\n")
    return paths


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda: cuda:0")
    p.add_argument("--tiny", action="store_true", help="4 tables of 1000 rows, dim 16, batch 256")
    p.add_argument("--cap", type=int, help="rows per table at most (default: what fits)")
    p.add_argument("--warmup", type=int, default=10, help="steps of each before timing (>= 1)")
    p.add_argument("--steps", type=int, default=50, help="steps per timed run")
    p.add_argument("--reps", type=int, default=3, help="alternating runs of each")
    p.add_argument("--no-deterministic", action="store_true", help="deterministic kernels off")
    p.add_argument("--out", help="write gpu-throughput.json and .md in this folder")
    args = p.parse_args(argv)
    if min(args.warmup, args.steps, args.reps) < 1:
        p.error("--warmup, --steps and --reps must be >= 1")
    return args


def quiet() -> None:
    """TorchRec's planner and DMP warn about their own deprecations on every build."""
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: torch sees no GPU (--device cpu runs on CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    shape = TINY if args.tiny else KAGGLE
    shape = fitted(replace(shape, cap=args.cap) if args.cap else shape, device)
    one_rank_group(device)
    try:
        result = measure(shape, device, warmup=args.warmup, steps=args.steps, reps=args.reps,
                         deterministic=not args.no_deterministic)  # fmt: skip
    finally:
        dist.destroy_process_group()
    command = "python -m benchmarks.gpu_throughput " + " ".join(argv or sys.argv[1:])
    print(markdown(result, command.strip()))
    if args.out:
        print("written: " + ", ".join(write(result, args.out, command.strip())))
    print(result.verdict())
    return 0 if result.ours.trained and result.torchrec.trained else 1


if __name__ == "__main__":
    sys.exit(main())
