"""Data: samples/s of the readers (raw TSV parse, binary form into batches) against the training
step, to show whether data loading is the bottleneck."""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks.common import table
from recsys.config import SparseLayout, SyntheticConfig
from recsys.data import TrainStream
from recsys.data.binary import load_folder
from recsys.data.criteo import read_tsv
from recsys.data.preprocess import preprocess
from recsys.data.synthetic import generate

ROWS = [100_000] * 26


def run(rows: int = 200_000, batch: int = 2048, path: str | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        if path is None:
            path = os.path.join(tmp, "synthetic.txt")
            generate(SyntheticConfig(num_samples=rows, seed=0), 13, ROWS).write_tsv(path)
        t0 = time.perf_counter()
        cols = read_tsv(path)
        tsv = len(cols) / (time.perf_counter() - t0)
        out = os.path.join(tmp, "npy")
        t0 = time.perf_counter()
        preprocess([path], out, "error", progress=False)
        prep = len(cols) / (time.perf_counter() - t0)
        (day,) = load_folder(out)
        stream = TrainStream(
            day,
            rank=0,
            world_size=1,
            batch_size=batch,
            layout=SparseLayout([f"cat_{i}" for i in range(26)], ROWS),
            seed=0,
            shuffle=True,
        )
        n = max(20, len(day) // batch)
        t0 = time.perf_counter()
        for _ in range(n):
            next(stream)
        binary = n * batch / (time.perf_counter() - t0)
    rows_ = [
        ["raw TSV parse (read_tsv)", tsv],
        ["TSV -> npy preprocessing (count + parse + write)", prep],
        [f"npy (memory-mapped) -> shuffled batches of {batch} (KJT)", binary],
    ]
    return f"{len(cols):,} rows, 13 dense + 26 categorical\n\n" + table(
        ["reader", "samples/s"], rows_
    )
