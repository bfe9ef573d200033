"""Data: samples/s of Criteo text prepared through the one path (``schemas/criteo_kaggle.yaml``,
one process) and of a prepared folder's shards into shuffled batches, against the training step,
to show whether data loading is the bottleneck."""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks.common import table
from recsys.config import ExperimentConfig, SyntheticConfig
from recsys.data.dataset import resolve
from recsys.data.input.loader import TrainStream, load_splits
from recsys.data.input.synthetic import generate
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import prepare

ROWS = [100_000] * 26


def run(rows: int = 200_000, batch: int = 2048, path: str | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        if path is None:
            path = os.path.join(tmp, "synthetic.txt")
            generate(SyntheticConfig(num_samples=rows, seed=0), 13, ROWS).write_tsv(path)
        out = os.path.join(tmp, "prepared")
        t0 = time.perf_counter()
        meta = prepare(DatasetSchema.load("criteo_kaggle"), [path], out, workers=0,
                       log=lambda s: None)  # fmt: skip
        n = sum(meta["rows"].values())
        prep = n / (time.perf_counter() - t0)
        cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [out]}}))
        train = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings).train
        stream = TrainStream(train, rank=0, world_size=1, batch_size=batch,
                             layout=cfg.embeddings.layout(), seed=0, shuffle=True)  # fmt: skip
        steps = max(20, len(train) // batch)
        t0 = time.perf_counter()
        for _ in range(steps):
            next(stream)
        batches = steps * batch / (time.perf_counter() - t0)
    rows_ = [
        ["Criteo text -> prepared folder (count + fit + write, one process)", prep],
        [f"prepared shards (memory-mapped) -> shuffled batches of {batch} (KJT)", batches],
    ]
    return f"{n:,} rows, 13 dense + 26 categorical\n\n" + table(["reader", "samples/s"], rows_)
