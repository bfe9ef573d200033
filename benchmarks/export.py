"""Export at scale: a checkpoint whose FP32 tables total ``gib`` GiB, written by the product's own
training loop (one worker, DMP, the fused optimizer), exported to INT8 TorchScript in a fresh
process; its peak memory (the kernel's high-water mark of the process's resident set, VmHWM)
and wall time against the goal: peak at most 0.5x the FP32 tables' bytes plus 1 GiB. The
checkpoint and the export are deleted after."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import init_world1, table
from benchmarks.goals import export_memory, shown
from recsys.config import ExperimentConfig

TABLES, DIM = 8, 32


def config(gib: float) -> ExperimentConfig:
    """``TABLES`` tables of ``DIM`` columns whose FP32 bytes total ``gib`` GiB, on generated
    rows; two training steps and one checkpoint."""
    rows = int(gib * 2**30 / (TABLES * DIM * 4))
    return ExperimentConfig.from_dict(
        {
            "name": "export-bench",
            "embeddings": {"num_embeddings": [rows] * TABLES, "dim": DIM},
            "model": {"num_dense": 13, "bottom_mlp": [64, DIM], "top_mlp": [64, 32]},
            "data": {"synthetic": {"num_samples": 100_000}},  # generated in memory
            "train": {"steps": 2, "batch_size": 512, "eval_every": 0, "checkpoint_every": 2},
            "sharding": {"default": {"sharding_types": ["table_wise"]}},
        }
    )


def write_checkpoint(gib: float, root: str) -> str:
    """Train two steps and checkpoint (in this process); returns the checkpoint folder."""
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    init_world1()
    reporter = LocalReporter(root, 0)
    Trainer(config(gib), current(use_gpu=False), reporter, log=lambda s: None).train()
    return reporter.completed()[-1]


EXPORT = """
import json, sys, time
from benchmarks.export import config
from recsys.serving.export import export
t0 = time.perf_counter()
report = export(config(float(sys.argv[1])), sys.argv[2], sys.argv[3], "int8")
seconds = time.perf_counter() - t0
peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"s": seconds, "peak_kib": int(peak), "fp32": report.fp32_table_bytes,
                  "int8": report.exported_table_bytes, "file": report.exported_bytes,
                  "auc_delta": report.auc_delta, "max_prob_diff": report.max_prob_diff,
                  "rows": report.rows}))
"""


def run(gib: float) -> str:
    tmp = tempfile.mkdtemp(prefix="export-bench-")
    try:
        t0 = time.perf_counter()
        ckpt = write_checkpoint(gib, os.path.join(tmp, "run"))
        written = time.perf_counter() - t0
        out = subprocess.run(
            [sys.executable, "-c", EXPORT, str(gib), ckpt, os.path.join(tmp, "export")],
            capture_output=True, text=True, check=True, cwd=os.getcwd(),
        )  # fmt: skip
        got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gib_of = 2**30
    fp32, peak = got["fp32"] / gib_of, got["peak_kib"] * 1024 / gib_of
    goal = 0.5 * fp32 + 1.0
    peak_text = shown(peak, lambda p: export_memory(p, fp32), digits=2, sign=False)
    head = (
        f"{TABLES} tables of {config(gib).embeddings.num_embeddings[0]:,} x {DIM}: "
        f"{fp32:.2f} GiB of FP32 tables; checkpoint written by 2 training steps in "
        f"{written:.0f} s. Export to INT8 in a fresh process: peak memory {peak_text} GiB, "
        f"goal <= 0.5 x {fp32:.2f} + 1 = {goal:.2f} GiB: {export_memory(peak, fp32)}"
    )
    rows = [
        ["FP32 tables", f"{fp32:.2f} GiB"],
        ["INT8 tables (rows + per-row scale and bias)", f"{got['int8'] / gib_of:.2f} GiB"],
        ["exported file (model.pt)", f"{got['file'] / gib_of:.2f} GiB"],
        ["peak memory of the export process (VmHWM)", f"{peak:.2f} GiB"],
        ["peak / FP32 tables", f"{peak / fp32:.2f}x"],
        ["export wall time", f"{got['s']:.0f} s"],
        [f"AUC, INT8 - FP32 ({got['rows']:,} test rows)", f"{got['auc_delta']:+.5f}"],
        ["largest probability difference", f"{got['max_prob_diff']:.2e}"],
    ]
    return head + "\n\n" + table(["what", "figure"], rows)
