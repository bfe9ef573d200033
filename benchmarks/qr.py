"""QR trade-off: embedding bytes against validation AUC / log loss, full tables vs QR with
collisions 2, 4, 8, 16 and each combine op; same data, steps and seed. Each configuration trains
with the product's own loop (DMP, fused optimizer) in one process."""

from __future__ import annotations

import tempfile
from typing import Any

from benchmarks.common import init_world1, table
from recsys.config import ExperimentConfig
from recsys.config_registry import criteo_kaggle, debug
from recsys.data.dataset import source_for, with_data
from recsys.distributed.env import current
from recsys.train.reporting import LocalReporter
from recsys.train.trainer import Trainer


def base(data: str | None, steps: int) -> ExperimentConfig:
    if data is None:
        cfg = debug().with_overrides({"data.synthetic.num_samples": 100_000})
        threshold = 1000
    else:
        cfg = with_data(
            criteo_kaggle(),
            {
                "data.source": source_for(data),
                "data.paths": [data],
                "embeddings.dim": 16,
                "model.bottom_mlp": [64, 32],
                "model.top_mlp": [64, 32],
            },
        )
        threshold = 10_000
    return cfg.with_overrides(
        {
            "train.steps": steps,
            "train.batch_size": 256,
            "train.checkpoint_every": 0,
            "train.eval_every": 0,
            "embeddings.qr.threshold": threshold,
            "sharding.default": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]},
        }
    )


def train(cfg: ExperimentConfig) -> dict[str, Any]:
    init_world1()
    with tempfile.TemporaryDirectory() as tmp:
        return Trainer(
            cfg, current(use_gpu=False), LocalReporter(tmp, 0), log=lambda s: None
        ).train()


def sweep(data: str | None, steps: int, collisions: list[int], ops: list[str]) -> str:
    cfg = base(data, steps)
    variants = [("full", 1, "-")] + [(f"QR c={c}", c, op) for c in collisions for op in ops]
    rows = []
    for name, c, op in variants:
        qr: dict[str, Any] = (
            {"embeddings.qr.collisions": c} if c > 1 else {"embeddings.qr.threshold": None}
        )
        if op != "-":
            qr["embeddings.qr.operation"] = op
        m = train(cfg.with_overrides(qr))
        rows.append(
            [
                name,
                op,
                m["emb_bytes"] / 2**20,
                m["emb_compression"],
                m["val_auc"],
                m["val_log_loss"],
            ]
        )
    src = data or "synthetic (100k rows, debug tables)"
    head = f"{src}, {steps} steps of 256, QR on tables above {cfg.embeddings.qr.threshold} rows\n\n"
    header = ["tables", "op", "emb MB", "compression", "val AUC", "val log loss"]
    return head + table(header, rows)
