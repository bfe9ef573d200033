"""BENCHMARKS.md names only commands that run today: every ``python -m benchmarks ...`` in it
parses with ``benchmarks.__main__``'s arguments (nothing is run), every subcommand's ``--help``
works, and the file carries no issue numbers."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from benchmarks.__main__ import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "BENCHMARKS.md")
# the header's ``python -m benchmarks <name>`` stands for any of them
PLACEHOLDERS = {"<name>"}
SUBCOMMANDS = [
    "step", "overhead", "qr", "data", "sweeps", "scale", "own-data", "store", "soak", "quality",
    "export", "serving", "checkpoint",
]  # fmt: skip


def text() -> str:
    with open(DOC) as f:
        return f.read()


def commands() -> list[str]:
    """The arguments after ``python -m benchmarks`` of every inline-code command in the file."""
    found = re.findall(r"`(?:\S*/)?python3? -m benchmarks(?: ([^`]*))?`", text())
    return [args.strip() for args in found if args.strip() not in PLACEHOLDERS]


def test_the_file_names_commands() -> None:
    assert len(commands()) >= 10
    assert not re.search(r"experiments/bench\.py|python experiments", text())


@pytest.mark.parametrize("args", sorted(set(commands())))
def test_every_command_in_the_file_parses(args: str) -> None:
    argv = shlex.split(args)
    try:
        ns = parse_args(argv)
    except SystemExit as e:  # argparse's error exit, or its exit 0 after --help
        if e.code == 0 and "--help" in argv:
            return
        pytest.fail(f"`python -m benchmarks {args}` does not parse (exit {e.code})")
    assert ns.bench in SUBCOMMANDS


def test_the_known_subcommands_are_the_parsers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    choices = re.search(r"\{([a-z,-]+)\}", out.stdout)
    assert choices and set(choices.group(1).split(",")) == set(SUBCOMMANDS)


@pytest.mark.parametrize("sub", [[], *[[s] for s in SUBCOMMANDS]], ids=lambda s: " ".join(s) or "-")
def test_help_exits_0(sub: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", *sub, "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_no_issue_numbers() -> None:
    hits = re.findall(r"\bissues?\s*#?\d+", text(), flags=re.IGNORECASE)
    assert not hits, hits


def test_a_missed_target_counts_as_the_worst_in_a_median() -> None:
    from benchmarks.sweeps import median_text

    nan = float("nan")
    assert median_text([nan, 0.39, 0.55]) == "0.55"  # not 0.47 (the miss left out)
    assert median_text([0.06, 0.29, 0.06]) == "0.06"
    assert median_text([nan, nan, 0.3]) == "missed"
