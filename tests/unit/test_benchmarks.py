"""BENCHMARKS.md names only commands that run today: every ``python -m benchmarks ...`` in it
parses with ``benchmarks.__main__``'s arguments (nothing is run), every subcommand's ``--help``
works, and the file carries no issue numbers; ``--append`` writes the commit it ran on, refuses
uncommitted changes to tracked files unless ``--allow-dirty`` (then written beside the commit)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "BENCHMARKS.md")
# the header's ``python -m benchmarks <name>`` stands for any of them
PLACEHOLDERS = {"<name>"}
SUBCOMMANDS = [
    "step", "overhead", "qr", "data", "sweeps", "scale", "own-data", "store", "soak", "quality",
    "export", "serving", "checkpoint", "timewalk", "quickstart", "refcost",
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


def test_no_console_lines_of_ray_processes() -> None:
    """A benchmark's section is its own text: no line Ray forwarded from a worker's console."""
    hits = re.findall(r"^\(\w+ pid=\d+.*$", text(), flags=re.MULTILINE)
    assert not hits, hits[:3]


def test_a_missed_target_counts_as_the_worst_in_a_median() -> None:
    from benchmarks.sweeps import median_text

    nan = float("nan")
    assert median_text([nan, 0.39, 0.55]) == "0.55"  # not 0.47 (the miss left out)
    assert median_text([0.06, 0.29, 0.06]) == "0.06"
    assert median_text([nan, nan, 0.3]) == "missed"


RESULT = "| what | figure |\n|---|---|\n| x | 1 |"


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A git checkout with a committed file and BENCHMARKS.md, standing for the project's root;
    ``run`` returns a fixed table (``calls`` counts it) and ``machine`` a fixed line."""
    import benchmarks.__main__ as entry
    import benchmarks.common as common

    if shutil.which("git") is None:
        pytest.skip("no git")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "code.py").write_text("x = 1\n")
    (repo / "BENCHMARKS.md").write_text("# Benchmarks\n")
    git(repo, "init", "-q")
    git(repo, "add", "code.py", "BENCHMARKS.md")
    git(repo, "-c", "user.email=a@b", "-c", "user.name=n", "commit", "-q", "-m", "first")
    calls: list[str] = []

    def fake_run(args: argparse.Namespace) -> str:
        calls.append(args.bench)
        return RESULT

    monkeypatch.setattr(entry, "run", fake_run)
    monkeypatch.setattr(common, "machine", lambda: "2026-01-01, a CPU, 2 cores")
    return repo, calls


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def appended(repo: Path) -> str:
    return (repo / "BENCHMARKS.md").read_text().removeprefix("# Benchmarks\n")


def test_append_writes_the_commit(checkout: tuple[Path, list[str]]) -> None:
    from benchmarks.__main__ import main

    repo, calls = checkout
    (repo / "notes.txt").write_text("untracked: not counted\n")
    main(["--append", "store"], root=str(repo))
    head = git(repo, "rev-parse", "--short", "HEAD")
    assert calls == ["store"]
    assert appended(repo) == (
        f"\n### `store`: 2026-01-01, a CPU, 2 cores, commit {head}\n\n"
        f"`python -m benchmarks --append store`\n\n{RESULT}\n"
    )
    main(["--append", "store"], root=str(repo))  # BENCHMARKS.md changed by the first: not dirty
    assert calls == ["store", "store"]


def test_append_refuses_a_dirty_tree_naming_the_files(checkout: tuple[Path, list[str]]) -> None:
    from benchmarks.__main__ import main

    repo, calls = checkout
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(SystemExit) as e:
        main(["--append", "store"], root=str(repo))
    message = str(e.value.code)
    assert "refused" in message and "code.py" in message and "--allow-dirty" in message
    assert git(repo, "rev-parse", "--short", "HEAD") in message
    assert calls == []  # refused before the run
    assert appended(repo) == ""


def test_append_allow_dirty_writes_the_note(checkout: tuple[Path, list[str]]) -> None:
    from benchmarks.__main__ import main

    repo, calls = checkout
    (repo / "code.py").write_text("x = 2\n")
    main(["--append", "--allow-dirty", "store"], root=str(repo))
    head = git(repo, "rev-parse", "--short", "HEAD")
    assert calls == ["store"]
    assert f", commit {head} (uncommitted changes: code.py)\n" in appended(repo)


def test_append_outside_a_checkout_writes_commit_unknown(
    checkout: tuple[Path, list[str]], tmp_path: Path
) -> None:
    from benchmarks.__main__ import main

    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "BENCHMARKS.md").write_text("# Benchmarks\n")
    main(["--append", "store"], root=str(folder))
    assert appended(folder).startswith(
        "\n### `store`: 2026-01-01, a CPU, 2 cores, commit unknown\n"
    )


def test_without_append_nothing_is_checked_or_written(checkout: tuple[Path, list[str]]) -> None:
    from benchmarks.__main__ import main

    repo, calls = checkout
    (repo / "code.py").write_text("x = 2\n")
    main(["store"], root=str(repo))
    assert calls == ["store"]
    assert appended(repo) == ""


def test_revision_names_staged_and_renamed_files(checkout: tuple[Path, list[str]]) -> None:
    from benchmarks.common import revision

    repo, _ = checkout
    git(repo, "mv", "code.py", "moved.py")
    (repo / "BENCHMARKS.md").write_text("# Benchmarks\n\nappended\n")  # --append's own file
    rev = revision(str(repo))
    assert rev.commit == git(repo, "rev-parse", "--short", "HEAD")
    assert rev.changed == ("moved.py",)


def test_the_experts_interval_is_students_t_of_paired_differences() -> None:
    """``benchmarks.experts.interval``: the 95% interval of the mean of the seeds' paired
    differences (Student's t, n - 1 degrees of freedom); none from one seed."""
    import math

    from benchmarks.experts import interval

    lo, hi = interval([0.01, 0.02, 0.03])
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t(0.975, 2) x std / sqrt(n)
    assert math.isclose(lo, 0.02 - half) and math.isclose(hi, 0.02 + half)
    assert all(math.isnan(v) for v in interval([0.01]))


def test_the_start_clock_splits_each_trial_by_the_run_its_controller_started_during(tmp_path):
    from benchmarks import start_clock

    clock = start_clock.StartClock()
    clock.folder = str(tmp_path)
    clock.name = "run_a"
    clock.marks = {"controller": 12.0, "group_begin": 12.5, "workers": 15.0, "context": 17.0,
                   "launched": 17.25, "last_report": 20.0, "shutdown_begin": 20.5}  # fmt: skip
    clock.after_worker_group_shutdown(None)  # marks its end and writes the run's file
    (a,) = start_clock.read(str(tmp_path))
    a["shutdown_end"] = 21.0  # (the clock's own time.time(): set for the arithmetic)
    b = {**a, "controller": 102.0, "last_report": 106.0}  # a second run: only these differ
    split = start_clock.parts(a, (10.0, 22.0))
    assert split["fit() to its controller running"] == 2.0
    assert split["the worker actors (placement, processes)"] == 2.5
    assert split["the process group, the function launched"] == 0.25
    assert split["the shutdown to fit()'s return"] == 1.0
    assert sum(split.values()) == 12.0 - (20.0 - 17.25)  # the fit, but the function's own time
    # each fit takes the run whose controller came up during it; a fit without one is left out
    med = start_clock.medians([b, a], [(10.0, 22.0), (50.0, 60.0)])
    assert med == split
    assert start_clock.medians([a, b], [(100.0, 110.0)])["fit() to its controller running"] == 2.0
