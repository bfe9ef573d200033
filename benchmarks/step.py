"""Step throughput: this project's training step (TorchRec EBC sharded by DMP, fused FBGEMM
optimizer) against the plain-PyTorch DLRM and against the machine's floor, same config, data and
batch, alternating runs in one process. Samples/s medians over ``reps`` runs of ``steps`` steps.

The floor: the step's dense GEMMs alone (bottom MLP, interaction, top MLP; forward and backward,
no embeddings, no optimizer) at the same batch and threads, timed the same way; its FLOPs are
counted by ``torch.utils.flop_counter`` and its achieved FLOP/s reported. ``ours / floor`` is how
much longer our whole step takes than those GEMMs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import init_world1, median_spread, table, timed
from benchmarks.plain_dlrm import PlainDLRM, to_plain
from recsys.config import ExperimentConfig, SparseLayout
from recsys.data.input.loader import to_batch
from recsys.data.input.synthetic import SyntheticRows
from recsys.distributed.env import current
from recsys.train.build import build
from recsys.train.stepper import Stepper


@dataclass(frozen=True)
class Case:
    name: str
    tables: int
    rows: int
    dim: int
    batch: int
    bottom: list[int]
    top: list[int]


SMALL = Case("small", 8, 10_000, 16, 512, [64, 32], [64, 32])
CRITEO = Case("criteo-shaped", 26, 100_000, 64, 2048, [512, 256], [512, 256])


def config(case: Case, op: str, qr: bool) -> ExperimentConfig:
    return ExperimentConfig.from_dict(
        {
            "embeddings": {
                "num_embeddings": [case.rows] * case.tables,
                "dim": case.dim,
                "qr": {"threshold": case.rows // 2, "collisions": 4} if qr else {},
            },
            "model": {"bottom_mlp": case.bottom, "top_mlp": case.top, "interaction": op},
            "data": {"synthetic": {"num_samples": case.batch * 4, "seed": 0}},
            "train": {"batch_size": case.batch},
            "sharding": {
                "default": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]}
            },
        }
    )


def batches(cfg: ExperimentConfig, raw: bool = False, n: int = 4) -> list[Any]:
    """``n`` batches; ``raw``: QR features not split (the plain model splits them itself; ours
    reads them split, as the data path builds them on the host)."""
    rows = SyntheticRows(cfg.data.synthetic, 13, cfg.embeddings.num_embeddings)
    layout = cfg.embeddings.layout()
    if raw:
        layout = SparseLayout(layout.names, layout.rows)
    b = cfg.train.batch_size
    return [to_batch(rows.read(i * b, (i + 1) * b), layout) for i in range(n)]


def ours(cfg: ExperimentConfig, data: list[Any]) -> Any:
    init_world1()
    built = build(cfg, current(use_gpu=False))
    model, optimizer = built.model, built.optimizer
    stepper = Stepper(model, optimizer, torch.device("cpu"), pipeline=False)
    it = iter(data * 1_000_000)
    return lambda: stepper(it)


def plain(cfg: ExperimentConfig, data: list[Any]) -> Any:
    torch.manual_seed(0)
    model = PlainDLRM(cfg.model, cfg.embeddings)
    opt = torch.optim.Adagrad(model.parameters(), lr=cfg.optim.lr)
    prepared = [(b.dense_features, to_plain(b.sparse_features), b.labels[:, 0]) for b in data]
    state = {"i": 0}

    def step() -> None:
        dense, sparse, y = prepared[state["i"] % len(prepared)]
        state["i"] += 1
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(dense, sparse)[:, 0], y)
        loss.backward()
        opt.step()

    return step


def dense_floor(cfg: ExperimentConfig) -> tuple[Any, float]:
    """The dense GEMMs of one step, forward and backward, and their FLOPs per step."""
    from torch.utils.flop_counter import FlopCounterMode
    from torchrec.modules.mlp import MLP

    from recsys.models.interactions import make_interaction

    torch.manual_seed(0)
    emb, model, b = cfg.embeddings, cfg.model, cfg.train.batch_size
    bottom = MLP(model.num_dense, [*model.bottom_mlp, emb.dim])
    interaction = make_interaction(model.interaction, emb.dim, [emb.dim] * emb.num_features)
    top = torch.nn.Sequential(MLP(interaction.out_dim, model.top_mlp),
                              torch.nn.Linear(model.top_mlp[-1], 1))  # fmt: skip
    dense = torch.randn(b, model.num_dense)
    pooled = [torch.randn(b, emb.dim, requires_grad=True) for _ in range(emb.num_features)]

    def step() -> None:
        top(interaction(bottom(dense), pooled)).sum().backward()

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return step, float(counter.get_total_flops())


def compare(case: Case, op: str, qr: bool, steps: int, reps: int) -> list[Any]:
    cfg = config(case, op, qr)
    floor, flops = dense_floor(cfg)
    fns = [ours(cfg, batches(cfg)), plain(cfg, batches(cfg, raw=True)), floor]
    for fn in fns:  # warm up
        timed(fn, 2)
    rates: list[list[float]] = [[], [], []]
    for _ in range(reps):  # alternating: ours, plain, floor, ours, ...
        for fn, out in zip(fns, rates, strict=True):
            out.append(case.batch * steps / timed(fn, steps))
    (ma, sa), (mb, sb), (mf, sf) = (median_spread(r) for r in rates)
    return [
        case.name,
        op,
        "on" if qr else "off",
        ma,
        f"±{sa:.0f}%",
        mb,
        f"±{sb:.0f}%",
        f"{ma / mb:.2f}x",
        mf,
        f"±{sf:.0f}%",
        f"{mf * flops / case.batch / 1e9:.1f}",
        f"{mf / ma:.2f}x",
    ]


def run(cases: list[Case], ops: list[str], steps: int | None, reps: int, threads: int) -> str:
    torch.set_num_threads(threads)
    rows = [
        compare(c, op, qr, steps or (40 if c.batch < 1024 else 6), reps)
        for c in cases
        for op in ops
        for qr in (False, True)
    ]
    header = [
        "config",
        "op",
        "QR",
        "ours samples/s",
        "spread",
        "plain samples/s",
        "spread",
        "ours / plain",
        "floor samples/s",
        "spread",
        "floor GFLOP/s",
        "ours / floor (time)",
    ]
    head = (
        f"1 worker, {threads} thread(s), {reps} alternating runs per row (ours, plain, floor); "
        "floor: the dense GEMMs alone, forward + backward\n\n"
    )
    return head + table(header, rows)


def two_workers(cases: list[Case], ops: list[str], steps: int) -> str:
    """Our step on 2 workers through Ray Train (global samples/s over the training steps)."""
    import tempfile

    from recsys.runtime.cluster import connect
    from recsys.train.ray_trainer import Resources, make_trainer

    connect("local", log_to_driver=False)
    rows = []
    for case in cases:
        for op in ops:
            cfg = config(case, op, qr=False).with_overrides(
                {
                    "data.synthetic.num_samples": case.batch * (2 * steps + 8),
                    "data.val_fraction": 0.02,
                    "data.test_fraction": 0.0,
                    "train.steps": steps,
                    "train.checkpoint_every": 0,
                    "train.eval_every": 0,
                    "train.eval_batches": 1,
                }
            )
            with tempfile.TemporaryDirectory() as tmp:
                trainer = make_trainer(
                    cfg, Resources(2, False, 0.95), name="bench", storage_path=tmp
                )
                m = trainer.fit().metrics or {}
            rows.append([case.name, op, 2, m["samples_per_s"]])
    head = f"2 workers (Ray Train, gloo), {steps} steps, global samples/s\n\n"
    return head + table(["config", "op", "workers", "ours samples/s"], rows)
