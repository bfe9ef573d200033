"""A space's references trained as a sweep's baselines phase trains them, without Ray: each of an
arch's trials (``SearchSpace.reference_points``: the default rules) by the product's ``Trainer``
on one gloo rank in a spawned process (``tests.distributed.harness.run_ranks``), the best by
validation kept, its best checkpoint scored on the prepared test rows
(``tests/distributed/test_reference_quality.py``). The planted log they train on is made by the
product's generator and preparation (``recsys.demo.planted``,
``recsys.prepare.pipeline``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np


def planted_prepared(folder: Path, rows: int, val: float = 0.2, test: float = 0.2) -> str:
    """A planted log of ``rows`` rows (seed 0) prepared without Ray into ``folder/prepared``."""
    from recsys.data.schema import DatasetSchema
    from recsys.demo import planted
    from recsys.prepare.pipeline import prepare

    raw = folder / "raw"
    planted.write(str(raw), rows, seed=0, val_fraction=val, test_fraction=test)
    schema = DatasetSchema.from_dict(planted.schema_dict(val, test))
    out = str(folder / "prepared")
    prepare(schema, [str(raw)], out, workers=0, log=lambda s: None)
    return out


def long_tail_prepared(folder: Path, rows: int = 10_000, seed: int = 0) -> str:
    """A Criteo-shaped log with a long tail of rare ids and few rows, prepared without Ray into
    ``folder/prepared`` (80/10/10 by order): 26 categorical fields whose ids are Zipf-distributed
    (exponent 1.2 to 1.95: most ids are seen once), each id with its own effect on the click's
    logit (larger for the first 8 fields), and 13 counts (log1p), 4 of which move the logit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    rng = np.random.default_rng(seed)
    cols, logit = {}, np.full(rows, -1.2)
    for f in range(26):
        ids = np.minimum(rng.zipf(1.2 + 0.03 * f, rows), 50_000)
        effect = rng.normal(0, 0.6 if f < 8 else 0.15, 50_001)
        logit += effect[ids]
        cols[f"C{f + 1}"] = ids
    for i in range(13):
        counts = rng.poisson(rng.gamma(1.0, 5.0, rows))
        logit += (0.3 if i < 4 else 0.0) * np.log1p(counts) * (1 if i % 2 else -1)
        cols[f"I{i + 1}"] = counts
    cols["click"] = (rng.uniform(size=rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), folder / "raw" / "log.parquet")
    schema = DatasetSchema.from_dict({
        "labels": ["click"],
        "dense": {f"I{i + 1}": {"transform": "log1p"} for i in range(13)},
        "sparse": {f"C{f + 1}": {} for f in range(26)},
        "split": {"by": "order", "val_fraction": 0.1, "test_fraction": 0.1},
    })  # fmt: skip
    out = str(folder / "prepared")
    prepare(schema, [str(folder / "raw")], out, workers=0, log=lambda s: None)
    return out


def references_space(folder: Path, prepared: str, archs: list[str]) -> str:
    """A space over ``prepared`` whose baselines are ``archs`` by the default rules."""
    path = folder / "space.yaml"
    path.write_text(
        "base: debug\n"
        f"overrides: {{data.source: prepared, data.paths: [{prepared}]}}\n"
        "space:\n  optim.lr: {choice: [0.05]}\n"
        f"baselines: [{', '.join(archs)}]\n"
    )
    return str(path)


def train_reference_rank(rank: int, world: int, space_path: str, arch: str, root: str) -> dict:
    """Every trial of reference ``arch``, one after the other on this rank; the best by the
    space's validation metric (the earliest of equals, as a sweep's report ranking), its grid
    values, where it peaked and its best checkpoint's AUC on the prepared test rows."""
    import numpy as np
    import torch

    from recsys.data.input.loader import load_splits, to_batch
    from recsys.distributed.env import current
    from recsys.metrics.binary import auc
    from recsys.serving.export import load_fp32, raw_layout
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer
    from recsys.tune import space as spaces

    space = spaces.load(space_path)
    ref = space.references[arch]
    trials: list[dict[str, Any]] = []
    for i, point in enumerate(ref.points(space.base)):
        cfg = space.config_for(point).with_overrides({"train.quiet": True, "data.prefetch": 0})
        reporter = LocalReporter(os.path.join(root, f"{arch}_{i}"), rank)
        trainer = Trainer(cfg, current(use_gpu=False), reporter, log=lambda s: None)
        trainer.train()
        scored = [(r[space.metric], r["step"]) for r in reporter.reports if space.metric in r]
        best = max(scored, key=lambda vs: (vs[0], -vs[1]))
        trials.append({"grid": ref.describe(point), "val": best[0], "step": best[1],
                       "last_step": scored[-1][1], "cfg": trainer.cfg,
                       "checkpoint": reporter.checkpoint_dir(best[1])})  # fmt: skip
    chosen = max(trials, key=lambda t: t["val"])
    cfg = chosen.pop("cfg")
    model = load_fp32(cfg, chosen["checkpoint"])
    test = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).test
    cols = test.read(0, len(test))
    with torch.no_grad():
        b = to_batch(cols, raw_layout(cfg))
        logits = model(b.dense_features, b.sparse_features)[:, 0].float().numpy()
    chosen["test"] = auc(np.asarray(cols.labels[:, 0], np.float64), logits)
    chosen["steps_per_epoch"] = -(-len(trainer.splits.train) // cfg.train.batch_size)
    chosen["tried"] = [(t["grid"], round(t["val"], 4)) for t in trials]
    for t in trials:
        t.pop("cfg", None)
    return chosen
