"""Shared pieces of the benchmarks: timing, a single-process group, batches, tables, the machine
and the commit a run is recorded with."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import date
from typing import Any


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


def init_world1(backend: str = "gloo") -> None:
    """A one-rank process group on a free local port (``backend``: gloo, or NCCL on a GPU)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0")
    os.environ.update(LOCAL_WORLD_SIZE="1", RANK="0", WORLD_SIZE="1")
    dist.init_process_group(backend, rank=0, world_size=1)


def machine() -> str:
    import ray
    import torch
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


@dataclasses.dataclass(frozen=True)
class Revision:
    """The commit a run is recorded with: ``commit`` the short hash of HEAD (None outside a git
    checkout, or where git cannot say), ``changed`` the tracked files that differ from it."""

    commit: str | None
    changed: tuple[str, ...] = ()

    def text(self) -> str:
        if self.commit is None:
            return "commit unknown"
        if not self.changed:
            return f"commit {self.commit}"
        names = ", ".join(self.changed[:5])
        more = f" and {len(self.changed) - 5} more" if len(self.changed) > 5 else ""
        return f"commit {self.commit} (uncommitted changes: {names}{more})"


def _git(root: str, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def revision(root: str, ignore: tuple[str, ...] = ("BENCHMARKS.md",)) -> Revision:
    """HEAD's short hash and the tracked files changed against it, paths from the checkout's top.
    Untracked files are not counted, nor ``ignore`` (paths under ``root``): BENCHMARKS.md, which
    ``--append`` itself writes and no benchmark reads."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    top = _git(root, "rev-parse", "--show-toplevel")
    status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=no")
    if not head or not top or status is None:
        return Revision(None)
    skip = {os.path.relpath(os.path.realpath(os.path.join(root, p)), top.strip()) for p in ignore}
    changed: list[str] = []
    entries = iter(status.split("\0"))
    for entry in entries:
        if not entry:
            continue
        if "R" in entry[:2] or "C" in entry[:2]:
            next(entries, None)  # a rename's or copy's source path follows its entry
        if entry[3:] not in skip:
            changed.append(entry[3:])
    return Revision(head.strip(), tuple(changed))


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
