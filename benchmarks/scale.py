"""Criteo-scale data (issue 13): worker memory against the number of days, a folder larger than
this machine's memory, preprocessing throughput, and hash collisions against vocabularies.

Terabyte-shaped days are generated straight into a prepared folder (one training shard per day:
13 float32 dense, 26 uint32 ids, an int8 label per row, 157 bytes a row; a small validation and
test shard) and deleted afterwards.
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
from benchmarks.goals import (
    PARSER_ROWS_S,
    at_least,
    preprocess_rate,
    preprocess_scaling,
    shown,
    worker_memory_by_days,
)

ROW_BYTES = 13 * 4 + 26 * 4 + 1
TERABYTE_DAY_ROWS = 4_373_472_329 // 24  # Criteo 1TB: 4.37B rows over 24 days


def write_days(folder: str, days: int, rows: int, seed: int = 0, chunk: int = 1 << 22) -> int:
    """A prepared folder (``schemas/criteo_kaggle.yaml``'s columns, ids hashed into 100k rows)
    with one training shard of ``rows`` rows per day; returns the bytes written."""
    from recsys.data.prepared.meta import FORMAT
    from recsys.data.schema import DatasetSchema

    rng = np.random.default_rng(seed)
    shards: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
    parts = [("train", k, rows) for k in range(days)] + [
        ("val", days, 4096),
        ("test", days + 1, 4096),
    ]
    for split, k, n_rows in parts:
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        stem = os.path.join(folder, split, f"part-{k:05d}")
        arrays = {
            "dense": np.lib.format.open_memmap(f"{stem}.dense.npy", "w+", "<f4", (n_rows, 13)),
            "ids": np.lib.format.open_memmap(f"{stem}.ids.npy", "w+", "<u4", (n_rows, 26)),
            "labels": np.lib.format.open_memmap(f"{stem}.labels.npy", "w+", "i1", (n_rows, 1)),
        }
        for a in range(0, n_rows, chunk):
            n = min(chunk, n_rows - a)
            arrays["dense"][a : a + n] = rng.random((n, 13), dtype=np.float32) * 8
            arrays["ids"][a : a + n] = rng.integers(1, 100_001, (n, 26), dtype=np.uint32)
            arrays["labels"][a : a + n] = (rng.random((n, 1)) < 0.25).astype(np.int8)
        for arr in arrays.values():
            arr.flush()
        del arrays
        shards[split].append({"name": f"part-{k:05d}", "rows": n_rows, "ids": {}})
    schema = DatasetSchema.load("criteo_kaggle").to_dict()
    for spec in schema["sparse"].values():
        spec["hash_buckets"] = 100_000
    meta = {
        "format": FORMAT, "schema": schema, "sources": [], "shards": shards,
        "rows": {s: sum(x["rows"] for x in v) for s, v in shards.items()},
        "feature_names": list(schema["sparse"]), "table_sizes": [100_001] * 26,  # + missing row
        "labels": ["label"], "vocab": {}, "dense_stats": {}, "id_types": {},
    }  # fmt: skip
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
    from recsys.data.dataset import with_data
    from recsys.train.ray_trainer import Resources, make_trainer

    cfg = with_data(
        criteo_kaggle(),
        {
            "data.paths": [folder],
            "data.shuffle": shuffle,
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
        },
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
    from recsys.runtime.cluster import connect

    connect("local", log_to_driver=False)
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
        "goal <= 1.2: "
        + worker_memory_by_days({"in time order": ratios[0], "with shuffling": ratios[1]})
        + "\n\n"
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
    from recsys.runtime.cluster import connect, host_memory_bytes

    connect("local", log_to_driver=False)
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
    from recsys.data.input.synthetic import generate

    part = path + ".part"
    generate(SyntheticConfig(num_samples=rows, seed=0), 13, [100_000] * 26).write_tsv(part)
    with open(path, "wb") as out, open(part, "rb") as f:
        block = f.read()
        for _ in range(copies):
            out.write(block)
    os.remove(part)


def preprocessing(rows: int, copies: int, chunk_mb: float) -> str:
    """One plain Criteo file through the one path, with vocabularies (``criteo_kaggle``: a fit
    pass and a write pass) and hashed (every feature ``hash_buckets``: one pass), in one process
    without Ray and on a local Ray of 1 and 2 worker processes (Ray started beforehand)."""
    import ray

    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare
    from recsys.runtime.cluster import connect

    kaggle = DatasetSchema.load("criteo_kaggle")
    hashed = kaggle.to_dict()
    for spec in hashed["sparse"].values():
        spec["hash_buckets"] = 1_000_000
    schemas = {
        "vocabularies (2 passes)": kaggle,
        "hashed (1 pass)": DatasetSchema.from_dict(hashed),
    }
    results: list[list[Any]] = []
    rates: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.tsv")
        _tsv(path, rows, copies)
        n, size = rows * copies, os.path.getsize(path)
        for w in (0, 1, 2):
            if w:
                connect("local", num_cpus=w, log_to_driver=False)
            for name, schema in schemas.items():
                out = os.path.join(tmp, "out")
                t0 = time.perf_counter()
                prepare(schema, [path], out, workers=w, chunk_mb=chunk_mb, log=lambda s: None)
                rates[(name, w)] = rate = n / (time.perf_counter() - t0)
                where = "one process, no Ray" if w == 0 else f"Ray, {w} worker process(es)"
                results.append([name, where, max(w, 1), rate, rate / max(w, 1)])
                shutil.rmtree(out)
            ray.shutdown()
    day = TERABYTE_DAY_ROWS
    one = rates[("hashed (1 pass)", 0)]
    head = (
        f"one plain file of {n:,} rows ({size / 2**20:.0f} MB), {chunk_mb:g} MB pieces. "
        f"Extrapolated, not measured: a Terabyte day ({day / 1e6:.0f}M rows, hashed) takes "
        f"{day / one / 3600:.2f} h in one process, {day / (one * 16) / 60:.0f} min on a 16-core "
        "node if it scaled linearly\n\n"
    )
    body = table(["ids", "path", "processes", "rows/s", "rows/s per process"], results)
    return head + body + "\n\n" + preprocessing_goals(rates, list(schemas))


def preprocessing_goals(rates: dict[tuple[str, int], float], names: list[str]) -> str:
    """The goals' table of ``preprocessing``'s rows/s (by schema name and workers, 0: one
    process without Ray), verdicts from ``benchmarks.goals``."""
    by = {w: {name: rates[(name, w)] for name in names} for w in (0, 1, 2)}

    def times(r: float) -> str:
        return shown(r, lambda x: at_least(x, 1.7), 2, sign=False) + "x"

    ray = ", ".join(f"{k} {times(by[2][k] / by[1][k])}" for k in names)
    alone = ", ".join(f"{k} {times(by[2][k] / by[0][k])}" for k in names)
    per = ", ".join(f"{k} {by[0][k]:,.0f}" for k in names)
    rows = [
        [f"rows/s in one process >= {PARSER_ROWS_S:,} (the earlier Criteo parser's)", per,
         preprocess_rate(by[0])],
        ["2 Ray workers >= 1.7x one Ray worker and >= 1.7x one process (no Ray)",
         f"against one Ray worker: {ray}; against one process: {alone}",
         preprocess_scaling(by[2], by[1], by[0])],
    ]  # fmt: skip
    return table(["goal", "figure", "verdict"], rows)


def collisions(seed: int = 0) -> str:
    """Distinct values (Criteo Kaggle's per-feature cardinalities) hashed into tables of the same
    size: the share that share a row with another value, by values and by traffic (power-law
    frequencies). With a vocabulary every kept value has a row of its own (0 by construction:
    checked here on the ids the vocabulary gives)."""
    from recsys.config_registry import KAGGLE_ROWS
    from recsys.prepare.ids import Vocabulary

    rng = np.random.default_rng(seed)
    rows, shares = [], []
    for f, n in enumerate(KAGGLE_ROWS):
        hashes = np.unique(rng.integers(1, 2**32, int(n * 1.001) + 8, dtype=np.uint64))[:n]
        weight = np.arange(1, len(hashes) + 1, dtype=np.float64) ** -1.1
        weight = rng.permutation(weight / weight.sum())
        bucket = (hashes % n).astype(np.int64)
        shared = np.bincount(bucket, minlength=n)[bucket] > 1
        ids = Vocabulary(hashes).ids(hashes, np.zeros(len(hashes), bool))
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
