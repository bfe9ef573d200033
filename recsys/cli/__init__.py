"""Command-line entry points (``[project.scripts]``: ``recsys-sweep``, ``recsys-train``,
``recsys-export``, ``recsys-preprocess``, ``recsys-synth``; ``python -m recsys.cli.planted``;
``experiments/*.py`` call the same ``main`` functions)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recsys.runtime.cluster import RaySource


def count(text: str) -> int:
    """An ``argparse`` type: a whole number >= 1 (trials), refused with the value otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def positive(text: str) -> float:
    """An ``argparse`` type: a number > 0 (a size or a budget), refused with the value otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def add_address(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The ``--address`` flag of every command that runs on Ray (``ray_address`` reads it)."""
    p.add_argument(
        "--address", help="the Ray to run on: HOST:PORT, auto (the cluster `ray start` runs on "
        "this node) or local (a new local Ray); default: $RAY_ADDRESS, else this node's "
        "running cluster, else a new local Ray",
    )  # fmt: skip


def ray_address(flag: str | None) -> RaySource:
    """The Ray a command runs on (``recsys.runtime.cluster.find_ray``: ``--address``, else
    ``RAY_ADDRESS``, else this node's running cluster, else a new local one), refused within
    seconds, naming it and where it came from, if nothing answers there: before MLflow, torch
    and Ray load."""
    from recsys.runtime.cluster import check_answers, find_ray

    source = find_ray(flag)
    check_answers(source)
    return source
