"""Your own data: preparation throughput on Ray against a single process, its memory with Ray's
object store capped, and the training step with multi-hot against one-hot.

- ``prepare``: the demo click log (``recsys.demo.clicklogs``, 2 multi-hot columns, string ids)
  written as Parquet, then prepared by ``recsys.prepare.pipeline`` (a) in one process without
  Ray (``workers=0``: the same pieces and passes, pyarrow + numpy in a loop) and (b) on a local Ray
  with 1 and with ``workers`` worker processes; rows/s and the time per phase of each, and that
  every output is byte-identical.
- ``memory``: (b) on input larger than the memory it may use: the object store capped
  (``--object-store-mb``); the peak proportional set size (PSS: shared pages counted once) of
  the preparing process and every process under it (raylet, workers, object store), sampled every
  0.2 s from ``/proc``, against the cap the run was given.
- ``multihot``: one rank (gloo, world 1, DMP with the fused optimizer) training a DLRM with 8
  features, batch 512: every bag one id, against bags of geometric lengths with mean 20; time per
  step and per id, and the host batch building (``to_batch``) per batch.

The data set is generated in a temporary folder and deleted afterwards.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

from benchmarks.common import median_spread, table
from benchmarks.goals import multihot_cost, own_data_prepare

SCHEMA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schemas", "clicklogs.yaml")


# ---------------------------------------------------------------------------------------------
# Memory of a process tree, from /proc


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        path = f"/proc/{pid}/task/{task}/children"
        if os.path.isfile(path):
            with open(path) as f:
                out += [int(c) for c in f.read().split()]
    return out


def tree_pss(root: int) -> dict[str, int]:
    """Bytes of PSS of ``root`` and all its descendants by process (``pid name``; processes
    gone meanwhile are left out)."""
    out, stack, seen = {}, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        out[f"{pid} {name}"] = int(line.split()[1]) * 1024
                        break
            stack += _children(pid)
        except OSError:
            continue
    return out


class PeakMemory:
    """Samples ``tree_pss`` of process ``root`` (default: this one) every ``every`` seconds while
    in a ``with``."""

    def __init__(self, every: float = 0.2, root: int | None = None) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self.root = os.getpid() if root is None else root
        self.at_peak: dict[str, int] = {}  # PSS by process at the peak

    def __enter__(self) -> PeakMemory:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = tree_pss(self.root)
            if sum(now.values()) > self.peak:
                self.peak, self.at_peak = sum(now.values()), now
            self._stop.wait(self.every)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _same_output(a: str, b: str) -> bool:
    """Every shard file and the vocabularies byte-identical, and ``meta.json`` equal but for the
    sources."""
    import json

    for folder in ("train", "val", "test", "vocab"):
        names = sorted(os.listdir(os.path.join(a, folder)))
        if names != sorted(os.listdir(os.path.join(b, folder))):
            return False
        _, mismatch, errors = filecmp.cmpfiles(
            os.path.join(a, folder), os.path.join(b, folder), names, shallow=False
        )
        if mismatch or errors:
            return False
    metas = []
    for x in (a, b):
        with open(os.path.join(x, "meta.json")) as f:
            metas.append({k: v for k, v in json.load(f).items() if k != "sources"})
    return bool(metas[0] == metas[1])


class Phases:
    """The seconds between the preparation's own log lines (fitted, written)."""

    def __init__(self) -> None:
        self.t0, self.marks = time.perf_counter(), list[float]()

    def __call__(self, line: str) -> None:
        self.marks.append(time.perf_counter() - self.t0)


def _arrow_bytes(files: list[str]) -> int:
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        pf = pq.ParquetFile(f)
        for i in range(pf.num_row_groups):
            total += pf.read_row_group(i).nbytes
    return total


def prepare_throughput(rows: int, files: int, workers: int) -> str:
    from recsys.demo import clicklogs

    root = tempfile.mkdtemp(prefix="bench-own-data-")
    try:
        paths = clicklogs.write(os.path.join(root, "raw"), rows, files)
        gib = _arrow_bytes(paths) / 2**30
        results, outs = [], []
        for w in (0, 1, workers):
            out = os.path.join(root, f"w{w}")
            results.append(_timed(paths, out, w))
            outs.append(out)
        same = all(_same_output(outs[0], o) for o in outs[1:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = results[0][0]
    body = []
    for w, (total, fit, ray_start) in zip((0, 1, workers), results, strict=True):
        name = "one process, no Ray" if w == 0 else f"Ray, {w} worker process(es)"
        body.append([name, total, ray_start, fit, total - fit, rows / total, base / total])
    head = (f"{rows:,} rows in {files} Parquet files ({gib:.2f} GiB as Arrow in memory), "
            f"2 multi-hot columns, a time split; outputs byte-identical: {same}\n\n")  # fmt: skip
    total, _, ray_start = results[-1]
    verdict = (f"\n\n{workers} Ray workers >= 1.6x one process: "
               f"{own_data_prepare(base, total, ray_start)}")  # fmt: skip
    return head + table(
        ["preparation", "seconds", "of which Ray's start", "to fitted", "to written",
         "rows/s", "vs one process"], body,
    ) + verdict  # fmt: skip


def _timed(paths: list[str], out: str, workers: int) -> tuple[float, float, float]:
    """``(seconds, seconds to fitted, seconds starting Ray)`` of one preparation."""
    import ray

    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare
    from recsys.runtime.cluster import connect

    t0 = time.perf_counter()
    if workers:
        connect("local", num_cpus=workers, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    phases = Phases()
    prepare(DatasetSchema.load(SCHEMA), paths, out, workers=workers, log=phases)
    total = time.perf_counter() - t0
    ray.shutdown()
    return total, ray_start + phases.marks[0], ray_start


def prepare_memory(rows: int, files: int, workers: int, store_mb: int, cap_mb: int) -> str:
    """``recsys-preprocess`` in a process of its own (as a user runs it: its driver holds no
    generated data), the peak PSS of that process and every process under it."""
    import subprocess
    import sys

    from recsys.demo import clicklogs

    root = tempfile.mkdtemp(prefix="bench-own-data-")
    try:
        paths = clicklogs.write(os.path.join(root, "raw"), rows, files)
        arrow = _arrow_bytes(paths)
        cmd = [sys.executable, "-m", "recsys.cli.preprocess", "--schema", SCHEMA, *paths,
               "--out", os.path.join(root, "out"), "--workers", str(workers),
               "--object-store-mb", str(store_mb), "--no-progress"]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with PeakMemory(root=proc.pid) as mem:
            _, err = proc.communicate()
        seconds = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(err[-2000:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = 2**20
    top = sorted(mem.at_peak.items(), key=lambda kv: -kv[1])
    shares = ", ".join(f"{name.split(' ', 1)[1]} {b / mib:.0f}" for name, b in top[:8])
    return table(
        ["rows", "input (Arrow) MiB", "object store cap MiB", "input / object store",
         "peak PSS MiB (all processes)", f"under {cap_mb} MiB", "seconds"],
        [[f"{rows:,}", arrow / mib, store_mb, arrow / mib / store_mb, mem.peak / mib,
          mem.peak <= cap_mb * mib, seconds]],
    ) + f"\n\nat the peak, {len(top)} processes, the largest (MiB): {shares}"  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The training step, multi-hot against one-hot


def multihot_step(
    steps: int, mean_len: float, batch: int = 512, features: int = 8, reps: int = 5
) -> str:
    import torch

    from benchmarks.common import init_world1
    from recsys.config import ExperimentConfig
    from recsys.data.columns import RaggedColumns
    from recsys.data.input.loader import to_batch
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    torch.set_num_threads(os.cpu_count() or 1)
    init_world1()
    rows = 10_000
    cfg = ExperimentConfig.from_dict(
        {"embeddings": {"num_embeddings": [rows] * features, "dim": 16},
         "model": {"num_dense": 4}, "train": {"batch_size": batch}},
    )  # fmt: skip
    layout = cfg.embeddings.layout()
    rng = np.random.default_rng(0)

    def columns(lengths: np.ndarray) -> RaggedColumns:
        values = tuple(rng.integers(0, rows, int(lengths[:, f].sum())) for f in range(features))
        dense = rng.normal(size=(batch, 4)).astype(np.float32)
        labels = (rng.random((batch, 1)) < 0.3).astype(np.float32)
        return RaggedColumns(dense, values, lengths, labels)

    cases = {
        "one-hot": lambda: np.ones((batch, features), np.int64),
        f"multi-hot (geometric, mean {mean_len:g})": lambda: rng.geometric(
            1 / mean_len, (batch, features)
        ).astype(np.int64),
    }
    prepared = {}
    for name, lengths in cases.items():
        built = build(cfg, current(False))
        stepper = Stepper(built.model, built.optimizer, torch.device("cpu"), False)
        cols = [columns(lengths()) for _ in range(8)]
        t0 = time.perf_counter()
        batches = [to_batch(c, layout) for c in cols]
        build_s = (time.perf_counter() - t0) / len(cols)
        ids = float(np.mean([int(c.lengths.sum()) for c in cols]))
        for _ in range(5):  # warm up
            stepper(iter(batches))
        prepared[name] = (stepper, batches, build_s, ids)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):  # alternating, so load on the machine hits both cases alike
        for name, (stepper, batches, _, _) in prepared.items():
            t0 = time.perf_counter()
            for i in range(steps):
                stepper(iter([batches[i % len(batches)]]))
            times[name].append((time.perf_counter() - t0) / steps)
    out: list[list[Any]] = []
    for name, (_, _, build_s, ids) in prepared.items():
        step_s, spread = median_spread(times[name])
        out.append([name, ids, step_s * 1e3, spread, step_s / ids * 1e9, build_s * 1e3])
    per_id = out[1][4] / out[0][4]
    step_ratio = out[1][2] / out[0][2]
    head = f"medians of {reps} alternating runs of {steps} steps, batch {batch}, {features} "
    head += "features\n\n"
    return head + table(
        ["bags", "ids per batch", "ms per step (median)", "spread %", "ns per id", "to_batch ms"],
        out,
    ) + (f"\n\nmulti-hot / one-hot: step time {step_ratio:.2f}x for {out[1][1] / out[0][1]:.1f}x "
         f"the ids; cost per id {per_id:.3f}x (goal <= 1.5x): {multihot_cost(per_id)}")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Batches prefetched in a background thread, against made on the training thread


def prefetch_step(rows: int, batch: int, steps: int, reps: int = 3) -> str:
    """The demo click log (multi-hot lists, shuffled gathers from memory-mapped files), one rank:
    ms per training step with ``data.prefetch`` 0 and 2, alternating; and the host batch alone."""
    import torch

    from benchmarks.common import init_world1
    from recsys.config_registry import debug
    from recsys.data.input.loader import TrainStream, load_splits
    from recsys.data.input.prefetch import Prefetcher
    from recsys.data.schema import DatasetSchema
    from recsys.demo import clicklogs
    from recsys.distributed.env import current
    from recsys.prepare.pipeline import prepare
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    init_world1()
    root = tempfile.mkdtemp(prefix="bench-prefetch-")
    try:
        clicklogs.write(os.path.join(root, "raw"), rows, 4)
        out = os.path.join(root, "prepared")
        prepare(DatasetSchema.load(SCHEMA), [os.path.join(root, "raw")], out, workers=2,
                log=lambda s: None)  # fmt: skip
        cfg = debug().with_overrides({"data.source": "prepared", "data.paths": [out],
                                      "train.batch_size": batch})  # fmt: skip
        train = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).train
        built = build(cfg, current(False))
        stepper = Stepper(built.model, built.optimizer, torch.device("cpu"), False)

        def stream() -> TrainStream:
            return TrainStream(train, rank=0, world_size=1, batch_size=batch,
                               layout=cfg.embeddings.layout(), seed=0, shuffle=True)  # fmt: skip

        s = stream()
        t0 = time.perf_counter()
        for _ in range(steps):
            next(s)
        host_ms = (time.perf_counter() - t0) / steps * 1e3
        times: dict[str, list[float]] = {"on the training thread": [], "prefetched (depth 2)": []}
        for _ in range(reps):
            for name in times:
                s = stream()
                batches: Any = Prefetcher(s, 2) if "prefetched" in name else s
                stepper(batches)  # warm
                t0 = time.perf_counter()
                for _ in range(steps):
                    stepper(batches)
                times[name].append((time.perf_counter() - t0) / steps * 1e3)
                if isinstance(batches, Prefetcher):
                    batches.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out_rows: list[list[Any]] = [[name, *median_spread(t)] for name, t in times.items()]
    a, b = out_rows[0][1], out_rows[1][1]
    return (f"batch {batch}, {steps} steps x {reps} alternating runs; the host batch alone "
            f"(shuffled gather, modulo, KJT) {host_ms:.2f} ms\n\n"
            + table(["batches made", "ms per step (median)", "spread %"], out_rows)
            + f"\n\nprefetched / training thread: {b / a:.3f}x")  # fmt: skip
