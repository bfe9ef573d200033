"""Step throughput: this project's training step (TorchRec EBC sharded by DMP, fused FBGEMM
optimizer) against the plain-PyTorch DLRM, same config, data and batch, alternating A/B runs in one
process. Samples/s medians over ``reps`` runs of ``steps`` steps, and the ratio."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import init_world1, median_spread, table, timed
from benchmarks.plain_dlrm import PlainDLRM, to_plain
from recsys.config import ExperimentConfig, SparseLayout
from recsys.data.loader import to_batch
from recsys.data.synthetic import SyntheticRows
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


def compare(case: Case, op: str, qr: bool, steps: int, reps: int) -> list[Any]:
    cfg = config(case, op, qr)
    a, b = ours(cfg, batches(cfg)), plain(cfg, batches(cfg, raw=True))
    for fn in (a, b):  # warm up
        timed(fn, 2)
    ra, rb = [], []
    for _ in range(reps):
        ra.append(case.batch * steps / timed(a, steps))
        rb.append(case.batch * steps / timed(b, steps))
    (ma, sa), (mb, sb) = median_spread(ra), median_spread(rb)
    return [
        case.name,
        op,
        "on" if qr else "off",
        ma,
        f"±{sa:.0f}%",
        mb,
        f"±{sb:.0f}%",
        f"{ma / mb:.2f}x",
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
        "ratio",
    ]
    head = f"1 worker, {threads} thread(s), {reps} alternating A/B runs per row\n\n"
    return head + table(header, rows)


def two_workers(cases: list[Case], ops: list[str], steps: int) -> str:
    """Our step on 2 workers through Ray Train (global samples/s over the training steps)."""
    import tempfile

    from recsys.cluster import connect
    from recsys.train.ray_trainer import Resources, make_trainer

    connect(None, log_to_driver=False)
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
