"""Shared pieces of the benchmarks: timing, a single-process group, batches, tables."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from typing import Any

import torch


def median_spread(xs: list[float]) -> tuple[float, float]:
    """Median and (max - min) / median in percent."""
    med = statistics.median(xs)
    return med, 100.0 * (max(xs) - min(xs)) / med if med else 0.0


def timed(fn: Callable[[], Any], steps: int) -> float:
    """Seconds for ``steps`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return time.perf_counter() - t0


def init_world1() -> None:
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0")
    os.environ.update(LOCAL_WORLD_SIZE="1", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", rank=0, world_size=1)


def machine() -> str:
    import ray
    import torchrec

    cpu = platform.processor() or platform.machine()
    model = ""
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else ""
    return (
        f"{date.today().isoformat()}, {model or cpu}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, torchrec {torchrec.__version__}, ray {ray.__version__}"
    )


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
