"""What the quality benchmarks share: a prepared log as they sweep it (``Log``), a model's line of
their tables (``Row``), the shipped own-data space for a log, the sweep through ``recsys-sweep``,
and the served model's AUC on the raw test rows.

``benchmarks.quality``, ``benchmarks.sequences`` and ``benchmarks.drift`` import these from here,
never from each other (``quality`` runs the other two as its parts).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Row:
    """One model's line of the table."""

    model: str
    val: float
    test: float
    peak: str = "-"
    stopped: str = "-"
    overfits: str = "-"
    setting: str = ""
    seconds: float = math.nan
    per_task: list[float] = field(default_factory=list)

    def cells(self, tasks: bool) -> list[Any]:
        def fmt(v: float) -> str:
            return f"{v:.4f}" if math.isfinite(v) else "-"

        secs = f"{self.seconds:.0f}" if math.isfinite(self.seconds) else "-"
        each = [" / ".join(f"{v:.4f}" for v in self.per_task) or "-"] if tasks else []
        return [self.model, fmt(self.val), fmt(self.test), *each, self.peak, self.stopped,
                self.overfits, self.setting, secs]  # fmt: skip


@dataclass
class Log:
    """A prepared log: its raw test rows (DataFrame), labels, the space to sweep it with."""

    name: str
    prepared: str
    raw_test: Any
    labels: list[str]
    space: str
    metric: str
    oracle: float = math.nan
    structure: Row | None = None  # planted: an LR told the planted crosses


def own_space(path: str, one_task: bool) -> str:
    """The shipped own-data space (``search_spaces/clicklogs.yaml``) as it is; for a log of one
    task without its task weight and scored by ``val_auc``. ``--data`` gives the folder."""
    with open(os.path.join(ROOT, "search_spaces", "clicklogs.yaml")) as f:
        raw = yaml.safe_load(f)
    if one_task:
        raw["space"] = {k: v for k, v in raw["space"].items() if not k.startswith("loss.task_")}
        raw["metric"] = "val_auc"
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def sweep(log: Log, tmp: str, samples: int, workers: int, concurrent: int, smoke: bool = False,
          search: str = "random", refit: bool = False) -> dict[str, Any]:  # fmt: skip
    """``recsys-sweep`` over the log (its own Ray and store), the best exported (``refit``:
    refitted on training + validation first); its console and where it wrote."""
    storage, uri = os.path.join(tmp, "runs"), f"sqlite:///{tmp}/mlflow.db"
    cmd = [sys.executable, "-m", "recsys.cli.sweep", "--space", log.space, "--data", log.prepared,
           "--name", log.name, "--storage", storage, "--tracking-uri", uri, "--num-samples",
           str(samples), "--num-workers", str(workers), "--max-concurrent", str(concurrent),
           "--cpus-per-worker", "0.9", "--export", "int8", "--confirm", "0", "--search",
           search]  # fmt: skip
    cmd += ["--smoke-test"] if smoke else []
    cmd += ["--refit"] if refit else []
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=3600)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"the {log.name} sweep failed:\n{out[-4000:]}")
    return {
        "uri": uri,
        "storage": storage,
        "console": done.stdout,
        "seconds": time.perf_counter() - t0,
        "export": os.path.join(storage, log.name, "export"),
    }


def served(log: Log, export: str) -> list[float]:
    """The exported model, as MLflow serves it, on the raw test rows: AUC per task."""
    from recsys.metrics.binary import auc
    from recsys.serving.scorer import META_FILE, MODEL_FILE, PREPARED_DIR, TabularScorer

    scorer = TabularScorer()
    artifacts = {"model": os.path.join(export, MODEL_FILE), "meta": os.path.join(export, META_FILE),
                 "prepared": os.path.join(export, PREPARED_DIR)}  # fmt: skip
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    probs = scorer.predict(None, log.raw_test)
    return [auc(np.asarray(log.raw_test[lab], np.float64), probs[lab].to_numpy()) for lab in
            log.labels]  # fmt: skip
