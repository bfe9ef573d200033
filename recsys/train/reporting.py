"""How the trainer talks to its launcher: the ``Reporter`` protocol, and ``LocalReporter``, one
without Ray (checkpoints in a folder every rank can reach) for the multi-process tests and
single-host runs. ``recsys.train.worker.RayReporter`` is the Ray Train one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any, Protocol

from recsys.distributed import collectives


class Reporter(Protocol):
    """What the trainer needs from its launcher."""

    def checkpoints(self) -> list[Any]:
        """Handles of the checkpoints to resume from, newest first."""

    def open_checkpoint(self, handle: Any) -> contextlib.AbstractContextManager[str]:
        """A local folder holding checkpoint ``handle``."""

    def skip_names_of(self, handle: Any) -> None:
        """Checkpoint ``handle`` is unusable: never reuse its folder name."""

    def checkpoint_dir(self, step: int) -> str:
        """A folder this rank may write its part of the checkpoint of ``step`` into."""

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        """Hand over metrics and the checkpoint folder (all ranks call it, same count)."""


class LocalReporter:
    """Rank ``rank`` of a job whose checkpoints go to ``root/step_<step>``."""

    def __init__(self, root: str, rank: int) -> None:
        self.root, self.rank = root, rank
        self.reports: list[dict[str, Any]] = []
        self.suffix = ""

    def completed(self) -> list[str]:
        """Checkpoint folders with a ``.metadata`` (DCP writes it last), oldest first."""
        if not os.path.isdir(self.root):
            return []
        # by step, then by name's length: a folder written after a skipped one of its step is
        # named after it (``skip_names_of``), so it is the longer name
        names = sorted(
            (n for n in os.listdir(self.root) if n.startswith("step_")),
            key=lambda n: (n[5:13], len(n)),
        )
        return [
            os.path.join(self.root, n)
            for n in names
            if os.path.isfile(os.path.join(self.root, n, ".metadata"))
        ]

    def checkpoints(self) -> list[Any]:
        return self.completed()[::-1]

    @contextlib.contextmanager
    def open_checkpoint(self, handle: Any) -> Iterator[str]:
        yield handle

    def skip_names_of(self, handle: Any) -> None:
        self.suffix = f"_after_{os.path.basename(handle)}"

    def checkpoint_dir(self, step: int) -> str:
        return os.path.join(self.root, f"step_{step:08d}{self.suffix}")

    def report(self, metrics: dict[str, Any], folder: str, step: int) -> None:
        self.reports.append(metrics)
        if folder and self.rank == 0:
            write_report(folder, metrics)
        collectives.barrier()


REPORT = "metrics.json"  # a checkpoint's report, beside its data


RUN_KIND, INLINE = "run_kind", "inline"  # in the reports of a run trained without Ray Train


def is_inline(report: dict[str, Any]) -> bool:
    """Whether ``report`` is one of a run trained without Ray Train (``recsys.train.inline``)."""
    return report.get(RUN_KIND) == INLINE


def write_report(folder: str, metrics: dict[str, Any]) -> None:
    """``metrics`` as checkpoint ``folder``'s report, whole or not at all (a process killed
    while writing leaves no half of it)."""
    path = os.path.join(folder, REPORT)
    with open(path + ".tmp", "w") as f:
        json.dump(metrics, f)
    os.replace(path + ".tmp", path)


def read_report(folder: str) -> dict[str, Any]:
    """Checkpoint ``folder``'s report (a folder or an object store URI); empty where it has none
    (or it was removed meanwhile)."""
    from recsys.runtime import storage

    try:
        return dict(json.loads(storage.read_text(storage.join(folder, REPORT))))
    except (OSError, ValueError):
        return {}


def reported(root: str) -> list[tuple[str, dict[str, Any]]]:
    """The complete checkpoints of the run at ``root`` that have their report, with it, oldest
    first: those a run may resume from and its records name (one saved but never reported is
    neither, as Ray Train registers only what was reported)."""
    found = [(f, read_report(f)) for f in LocalReporter(root, 0).completed()]
    return [(f, m) for f, m in found if m]
