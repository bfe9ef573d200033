"""A checkpoint's save and restore time on an S3-compatible store against local disk.

The model: ``benchmarks.export``'s tables (8 tables of 32 columns, FP32 bytes totalling ``gib``
GiB), trained two steps by the product's own loop (one worker, DMP, the fused optimizer). Then,
``reps`` times each, what a worker does:

- **local disk**: ``checkpoint.save`` into a folder of a local storage (written once, in place),
  ``checkpoint.load`` from it;
- **S3**: the same save into a staging folder, then Ray Train's own upload of it
  (``StorageContext.persist_current_checkpoint``, pyarrow) through the file system the product
  gives Ray (``recsys.runtime.storage.ray_storage``: retried, each file spooled and uploaded whole);
  restore is Ray's download of the checkpoint (``Checkpoint.to_directory``) followed by the
  same load.

The store is SeaweedFS on loopback (``tests/servers.py``): the figures are the protocol's and
the server's cost on this machine, not a network's. Everything is deleted after.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import init_world1, table
from benchmarks.export import config


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def trained(gib: float, root: str) -> Any:
    """The trained ``Trainer`` (two steps, its own checkpoint written under ``root``)."""
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    init_world1()
    trainer = Trainer(config(gib), current(False), LocalReporter(root, 0), log=lambda s: None)
    trainer.train()
    return trainer


def run(gib: float = 1.0, reps: int = 3) -> str:
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    from recsys.distributed import checkpoint
    from recsys.runtime import storage
    from tests.servers import S3Server

    tmp = tempfile.mkdtemp(prefix="ckpt-bench-")
    server = S3Server().start()
    try:
        for key, value in server.env().items():
            os.environ[key] = value
        trainer = trained(gib, os.path.join(tmp, "run"))
        model, optimizer = trainer.stepper.model, trainer.stepper.optimizer
        path, fs = storage.ray_storage(f"{server.bucket('bench')}/runs")  # as the product's runs
        s3 = StorageContext(storage_path=path, experiment_dir_name="trial", storage_filesystem=fs)
        times: dict[str, list[float]] = {k: [] for k in ("save", "upload", "load", "download")}
        size = 0
        for i in range(reps):
            folder = os.path.join(tmp, f"step_{i}")
            t0 = time.perf_counter()
            checkpoint.save(folder, model, optimizer, trainer.state, 0, 1)
            times["save"].append(time.perf_counter() - t0)
            size = folder_bytes(folder)
            t0 = time.perf_counter()
            persisted = s3.persist_current_checkpoint(Checkpoint.from_directory(folder), f"s{i}")
            times["upload"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            checkpoint.load(folder, model, optimizer, 0)
            times["load"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            down = persisted.to_directory(os.path.join(tmp, f"down_{i}"))
            times["download"].append(time.perf_counter() - t0)
            assert folder_bytes(down) == size, "the download is the checkpoint, whole"
            shutil.rmtree(down)
            shutil.rmtree(folder)
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    gb = size / 2**30
    local_save, s3_save = med["save"], med["save"] + med["upload"]
    local_load, s3_load = med["load"], med["download"] + med["load"]
    head = (
        f"{gib:.2f} GiB of FP32 tables (8 x {config(gib).embeddings.num_embeddings[0]:,} x 32) "
        f"with their optimizer state: a checkpoint of {gb:.2f} GiB on one worker; median of "
        f"{reps}. S3: SeaweedFS on loopback (no network between)."
    )
    rows = [
        ["save", f"{local_save:.1f} s", f"{s3_save:.1f} s (write {med['save']:.1f} + upload "
         f"{med['upload']:.1f}, {gb / med['upload']:.2f} GiB/s)", f"{s3_save / local_save:.2f}x"],
        ["restore", f"{local_load:.1f} s", f"{s3_load:.1f} s (download {med['download']:.1f} + "
         f"load {med['load']:.1f}, {gb / med['download']:.2f} GiB/s)",
         f"{s3_load / local_load:.2f}x"],
    ]  # fmt: skip
    return head + "\n\n" + table(["", "local disk", "S3", "S3 / local"], rows)
