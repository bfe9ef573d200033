"""Command-line entry points (``[project.scripts]``: ``recsys-sweep``, ``recsys-train``,
``recsys-export``; ``experiments/*.py`` call the same ``main`` functions)."""

import argparse


def positive(text: str) -> float:
    """An ``argparse`` type: a number > 0 (a size or a budget), refused with the value otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value
