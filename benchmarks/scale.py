"""Criteo-scale data (issue 13): worker memory against the number of days, a folder larger than
this machine's memory, preprocessing throughput, and hash collisions against vocabularies.

Terabyte-shaped days are generated straight into the binary form (``day_k_*.npy``: 13 float32
dense, 26 uint32 ids, an int32 label per row: 160 bytes a row, as Criteo 1TB preprocessed) and
deleted afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common import table

ROW_BYTES = 13 * 4 + 26 * 4 + 4
TERABYTE_DAY_ROWS = 4_373_472_329 // 24  # Criteo 1TB: 4.37B rows over 24 days


def write_days(folder: str, days: int, rows: int, seed: int = 0, chunk: int = 1 << 22) -> int:
    """``days`` Terabyte-shaped days of ``rows`` rows each; returns the bytes written."""
    from recsys.data.binary import DTYPES, FORMAT, LOG1P, day_paths
    from recsys.data.preprocess import WIDTHS

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(days):
        arrays = {
            p: np.lib.format.open_memmap(path, "w+", DTYPES[p], (rows, WIDTHS[p]))
            for p, path in day_paths(folder, k).items()
        }
        for a in range(0, rows, chunk):
            n = min(chunk, rows - a)
            arrays["dense"][a : a + n] = rng.random((n, 13), dtype=np.float32) * 8
            arrays["sparse"][a : a + n] = rng.integers(0, 2**32, (n, 26), dtype=np.uint32)
            arrays["labels"][a : a + n] = (rng.random((n, 1)) < 0.25).astype(np.int32)
        for arr in arrays.values():
            arr.flush()
        del arrays
    meta = {
        "format": FORMAT,
        "dense_transform": LOG1P,
        "sparse": "hash",
        "files": [{"day": k, "rows": rows} for k in range(days)],
    }
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f)
    return days * rows * ROW_BYTES


def memory_stats() -> dict[str, float]:
    """This process's peak RSS and its current anonymous / file-backed resident memory, MB."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                out[key.lower() + "_mb"] = int(value.split()[0]) / 1024
    return out


def _measured_train(config: dict[str, Any]) -> None:
    """The real Train worker; every report also carries every rank's memory figures."""
    from recsys.distributed import collectives
    from recsys.train import worker

    real = worker.RayReporter.report

    def report(self: Any, metrics: dict[str, Any], folder: str, step: int) -> None:
        ranks = collectives.all_gather_objects(memory_stats())
        real(self, {**metrics, "memory_by_rank": ranks}, folder, step)

    worker.RayReporter.report = report  # type: ignore[method-assign]
    worker.train_func(config)


def train_on(folder: str, steps: int, workers: int, shuffle: bool) -> dict[str, Any]:
    """``steps`` steps of a small DLRM on ``folder`` with ``workers`` Ray Train workers."""
    from recsys.config_registry import criteo_kaggle
    from recsys.train.ray_trainer import Resources, make_trainer

    cfg = criteo_kaggle().with_overrides(
        {
            "data.paths": [folder],
            "data.shuffle": shuffle,
            "data.val_fraction": 0.0005,
            "data.test_fraction": 0.0005,
            "embeddings.num_embeddings": [100_000] * 26,
            "embeddings.dim": 16,
            "model.bottom_mlp": [64, 16],
            "model.top_mlp": [64, 32],
            "train.steps": steps,
            "train.batch_size": 2048,
            "train.checkpoint_every": 0,
            "train.eval_every": 0,
            "train.eval_batches": 4,
            "train.log_every": steps,
            "train.quiet": True,
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(
            cfg,
            Resources(workers, False, 0.95),
            name="scale",
            storage_path=tmp,
            train_loop=_measured_train,
        )
        t0 = time.perf_counter()
        metrics = dict(trainer.fit().metrics or {})
        metrics["wall_s"] = time.perf_counter() - t0
    return metrics


def memory_vs_days(rows_per_day: int, steps: int) -> str:
    """Peak memory of a worker training on 2 vs 8 Terabyte-shaped days (same rows per day)."""
    from recsys.cluster import connect

    connect(None, log_to_driver=False)
    out, rows = {}, []
    for days in (2, 8):
        folder = tempfile.mkdtemp(prefix=f"tb{days}-")
        try:
            size = write_days(folder, days, rows_per_day)
            for shuffle in (False, True):
                m = train_on(folder, steps, 2, shuffle)
                mem = m["memory_by_rank"]
                out[(days, shuffle)] = max(r["peak_rss_mb"] for r in mem)
                peaks = [f"{r['peak_rss_mb']:.0f}" for r in mem]
                ends = [f"{r['rssanon_mb']:.0f} / {r['rssfile_mb']:.0f}" for r in mem]
                rows.append(
                    [days, f"{size / 2**30:.1f}", "on" if shuffle else "off", *peaks, *ends]
                )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    ratios = [out[(8, s)] / out[(2, s)] for s in (False, True)]
    head = (
        f"2 workers, {steps} steps of 2048 rows, {rows_per_day:,} rows per day. Peak RSS "
        f"ratio 8 days / 2 days: {ratios[0]:.2f} (time order), {ratios[1]:.2f} (shuffled); "
        "goal <= 1.2\n\n"
    )
    header = [
        "days",
        "GiB on disk",
        "shuffle",
        "rank 0 peak RSS MB",
        "rank 1 peak RSS MB",
        "rank 0 anon / file MB (end)",
        "rank 1 anon / file MB (end)",
    ]
    return head + table(header, rows)


def larger_than_memory(gib: float, steps: int, days: int = 8) -> str:
    """``steps`` steps with 2 workers on a folder of ``gib`` GiB (more than this machine's RAM)."""
    from recsys.cluster import connect, host_memory_bytes

    connect(None, log_to_driver=False)
    rows_per_day = int(gib * 2**30 / ROW_BYTES / days)
    folder = tempfile.mkdtemp(prefix="big-", dir=os.environ.get("RECSYS_BENCH_DIR"))
    try:
        t0 = time.perf_counter()
        size = write_days(folder, days, rows_per_day)
        written = time.perf_counter() - t0
        m = train_on(folder, steps, 2, shuffle=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    mem = m["memory_by_rank"]
    rows = [
        [r, f"{x['peak_rss_mb']:.0f}", f"{x['rssanon_mb']:.0f}", f"{x['rssfile_mb']:.0f}"]
        for r, x in enumerate(mem)
    ]
    head = (
        f"{size / 2**30:.1f} GiB in {days} days ({days * rows_per_day:,} rows; this machine: "
        f"{host_memory_bytes() / 2**30:.1f} GiB of memory), written in {written:.0f} s; "
        f"{m['step']} steps of 2048 rows per worker, time order, 2 workers: "
        f"{m['samples_per_s']:,.0f} samples/s, {m['wall_s']:.0f} s for the whole trial\n\n"
    )
    return head + table(["rank", "peak RSS MB", "anon MB (end)", "file-backed MB (end)"], rows)


def _tsv(path: str, rows: int, copies: int) -> None:
    from recsys.config import SyntheticConfig
    from recsys.data.synthetic import generate

    part = path + ".part"
    generate(SyntheticConfig(num_samples=rows, seed=0), 13, [100_000] * 26).write_tsv(part)
    with open(path, "wb") as out, open(part, "rb") as f:
        block = f.read()
        for _ in range(copies):
            out.write(block)
    os.remove(part)


def _reference_rate(path: str, lines: int) -> float:
    """Rows/s of the per-row reference parser (the preprocessing before this change) on the
    first ``lines`` lines, with the same array conversion it did."""
    from recsys.data.criteo import parse_row, transform_dense

    t0 = time.perf_counter()
    with open(path) as f:
        parsed = [parse_row(line, 13, 26) for _, line in zip(range(lines), f, strict=False)]
    transform_dense(np.asarray([p[1] for p in parsed], dtype=np.int64))
    np.asarray([p[2] for p in parsed], dtype=np.uint32)
    return lines / (time.perf_counter() - t0)


def preprocessing(rows: int, copies: int, chunk_mb: float) -> str:
    import ray

    from recsys.cluster import connect
    from recsys.data.preprocess import preprocess

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.tsv")
        _tsv(path, rows, copies)
        n, size = rows * copies, os.path.getsize(path)
        results: list[list[Any]] = [
            ["per-row reference parser (before)", 1, _reference_rate(path, 200_000)]
        ]
        t0 = time.perf_counter()
        preprocess([path], os.path.join(tmp, "out0"), "error", False, workers=0)
        results.append(["single process (workers=0)", 1, n / (time.perf_counter() - t0)])
        warm: dict[int, float] = {}
        for w in (1, 2):
            ray.shutdown()
            connect(None, num_cpus=w, log_to_driver=False)
            for run in ("first run: starts Ray's workers", "second run, same Ray"):
                out = os.path.join(tmp, f"out{w}")
                t0 = time.perf_counter()
                preprocess([path], out, "error", False, workers=w, chunk_mb=chunk_mb)
                rate = n / (time.perf_counter() - t0)
                results.append([f"Ray tasks, {w} worker process(es), {run}", w, rate])
                warm[w] = rate
                shutil.rmtree(out)
        ray.shutdown()
    one, two = warm[1], warm[2]
    day = TERABYTE_DAY_ROWS
    head = (
        f"one plain file of {n:,} rows ({size / 2**20:.0f} MB), {chunk_mb:g} MB chunks. Scaling "
        f"from 1 to 2 processes (second runs, Ray's workers already started): {two / one:.2f}x "
        f"(goal >= 1.8x). Per process: {one:,.0f} rows/s "
        f"against the reference parser's {float(results[0][2]):,.0f} rows/s here (73k in "
        "BENCHMARKS.md "
        f"before). Extrapolated, not measured: a Terabyte day ({day / 1e6:.0f}M rows) takes "
        f"{day / one / 3600:.2f} h with 1 process, {day / two / 3600:.2f} h with 2, "
        f"{day / (one * 16) / 60:.0f} min on a 16-core node if it scaled linearly\n\n"
    )
    return head + table(["path", "processes", "rows/s"], results)


def collisions(seed: int = 0) -> str:
    """Distinct values (Criteo Kaggle's per-feature cardinalities) hashed into tables of the same
    size: the share that share a row with another value, by values and by traffic (power-law
    frequencies). With a vocabulary every kept value has a row of its own (0 by construction:
    checked here on the ids the vocabulary gives)."""
    from recsys.config_registry import KAGGLE_ROWS
    from recsys.data import vocab

    rng = np.random.default_rng(seed)
    rows, shares = [], []
    for f, n in enumerate(KAGGLE_ROWS):
        hashes = np.unique(rng.integers(1, 2**32, int(n * 1.001) + 8, dtype=np.uint64))[:n]
        weight = np.arange(1, len(hashes) + 1, dtype=np.float64) ** -1.1
        weight = rng.permutation(weight / weight.sum())
        bucket = (hashes % n).astype(np.int64)
        shared = np.bincount(bucket, minlength=n)[bucket] > 1
        ids = vocab.Vocab(hashes.astype(np.uint32)).ids(hashes.astype(np.uint32))
        vocab_shared = len(ids) - len(np.unique(ids))
        shares.append((shared.mean(), weight[shared].sum()))
        rows.append(
            [f"C{f + 1}", n, f"{shared.mean():.1%}", f"{weight[shared].sum():.1%}", vocab_shared]
        )
    by_values = statistics.median(s[0] for s in shares)
    head = (
        f"median over the 26 features: {by_values:.1%} of distinct values share a table row "
        "under hash mod rows; 0 with a vocabulary\n\n"
    )
    header = [
        "feature",
        "cardinality = table rows",
        "values colliding (hash)",
        "traffic colliding (hash)",
        "ids shared (vocabulary)",
    ]
    return head + table(header, rows)
