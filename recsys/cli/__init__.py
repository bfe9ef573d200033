"""Command-line entry points (``[project.scripts]``: ``recsys-sweep``, ``recsys-train``,
``recsys-export``, ``recsys-preprocess``, ``recsys-synth``; ``python -m recsys.cli.planted``;
``experiments/*.py`` call the same ``main`` functions)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from recsys.configlib import flag_of, options

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


def whole(text: str) -> int:
    """An ``argparse`` type: a whole number, refused with the value otherwise."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def number(text: str) -> float:
    """An ``argparse`` type: a number, refused with the value otherwise."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def model_uri(text: str) -> str:
    """An ``argparse`` type: a registered model, ``models:/NAME@ALIAS`` or
    ``models:/NAME/VERSION``, refused with the value otherwise (before MLflow is imported)."""
    from recsys.tracking.uris import parse_model_uri

    try:
        parse_model_uri(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--model ")) from None
    return text


TYPES: dict[str, Callable[[str], Any]] = {"count": count, "positive": positive, "int": whole,
                                          "float": number, "str": str}  # fmt: skip


def kind_of(opt: Any, default: Any) -> str:
    """An option's kind (``Opt.kind``; "" by its default's type): a key of ``TYPES``."""
    return opt.kind or {int: "int", float: "float"}.get(type(default), "str")


def add_options(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
    names: Iterable[str] | None = None, undefaulted: bool = False,
) -> dict[str, argparse._MutuallyExclusiveGroup]:  # fmt: skip
    """Add the command-line options declared on dataclass ``cls``'s fields (``recsys.configlib.
    option``; ``names``: only those) to ``p``: the one place their flags, types, choices, help
    and defaults are written. An option a resume restores, and every option with
    ``undefaulted``, gets the parser default None (typed or not is then told apart; a restored
    option's help says the dataclass's default). Returns the groups of exclusive options made,
    by name (a command adds its own flags to one)."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name, (opt, default) in options(cls).items():
        if names is not None and name not in names:
            continue
        target = p
        if opt.group:
            if opt.group not in groups:
                groups[opt.group] = p.add_mutually_exclusive_group()
            target = groups[opt.group]
        none = opt.restored or undefaulted
        kwargs: dict[str, Any] = {"dest": name, "help": opt.help}
        if opt.kind == "flag" or isinstance(default, bool):
            kwargs.update(action="store_true", default=None if none else default)
        else:
            kwargs.update(type=TYPES[kind_of(opt, default)], default=None if none else default)
            if opt.choices:
                kwargs["choices"] = list(opt.choices)
            if opt.metavar:
                kwargs["metavar"] = opt.metavar
            if (
                opt.restored
                and not undefaulted
                and default is not None
                and "default" not in opt.help
            ):
                kwargs["help"] = f"{opt.help} (default {default})"
        target.add_argument(flag_of(name, opt), **kwargs)
    return groups


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
