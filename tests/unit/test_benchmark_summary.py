"""Benchmark verdicts are computed, never typed: BENCHMARKS.md's Summary table is the one
``benchmarks.summary`` generates from each row's figures and its goal's function in
``benchmarks.goals``, so a verdict (or a figure) typed by hand against them fails here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks import goals, summary

ROOT = Path(__file__).resolve().parents[2]


def test_every_goal_states_its_rule() -> None:
    for row in summary.ROWS:
        assert row.judge.__module__ == "benchmarks.goals", row.goal
        assert row.judge.__doc__ and len(row.judge.__doc__) > 30, row.judge.__name__


def test_the_summary_table_is_generated_from_the_figures() -> None:
    """Fails when a Summary cell was typed: run ``python -m benchmarks.summary --write`` after
    changing a row's figures in ``benchmarks/summary.py``."""
    assert summary.check((ROOT / "BENCHMARKS.md").read_text()) is None


MADE_UP = summary.Row(
    "made-up: the step's time over the floor ≤ 1.2x",
    "**{ratio:.2f}x**",
    lambda ratio: goals.at_most(ratio, 1.2),
    {"ratio": 1.29},
    " ([made-up](#made-up))",
    summary.EPYC,
    "2026-01-01",
    "abc1234",
)


def made_up_page(verdict: str | None = None, figure: str | None = None) -> str:
    table = summary.render([MADE_UP])
    if verdict is not None:
        table = table.replace(MADE_UP.verdict(), verdict)
    if figure is not None:
        table = table.replace("**1.29x**", figure)
    return f"# Benchmarks\n\n## Summary\n\n{table}\n\n## step\n"


def test_the_checker_fails_a_verdict_typed_against_its_figures() -> None:
    assert summary.check(made_up_page(), [MADE_UP]) is None
    assert MADE_UP.verdict() == "missed ([made-up](#made-up))"
    problem = summary.check(made_up_page(verdict="met ([made-up](#made-up))"), [MADE_UP])
    assert problem is not None
    assert "the verdict reads 'met ([made-up](#made-up))'" in problem
    assert "its figures give 'missed ([made-up](#made-up))'" in problem


def test_the_checker_fails_a_figure_typed_by_hand_and_a_row_with_no_goal() -> None:
    problem = summary.check(made_up_page(figure="**1.19x**"), [MADE_UP])
    assert problem is not None and "latest figure: '**1.19x**'" in problem
    extra = made_up_page().replace("\n\n## step", "\n| typed | 1 | met | x | y | z |\n\n## step")
    problem = summary.check(extra, [MADE_UP])
    assert problem is not None and "a row whose goal is not in benchmarks/summary.py" in problem


def test_the_checker_fails_a_missing_row() -> None:
    other = summary.Row(**{**MADE_UP.__dict__, "goal": "made-up: another goal"})
    problem = summary.check(made_up_page(), [MADE_UP, other])
    assert problem is not None and "no row for the goal 'made-up: another goal'" in problem


def test_write_regenerates_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "BENCHMARKS.md", page)
    text = page.read_text()
    start, _ = summary.table_span(text)
    lines = text.split("\n")
    lines[start + 2] = lines[start + 2].replace("| missed", "| met", 1)
    page.write_text("\n".join(lines))
    assert summary.check(page.read_text()) is not None
    summary.write(str(page))
    assert summary.check(page.read_text()) is None
    assert page.read_text() == text


def test_no_note_types_a_verdict() -> None:
    """A row's note follows its computed verdict; it explains and never judges."""
    for row in summary.ROWS:
        assert not re.search(r"\b(met|missed|measured)\b", row.note), row.goal


def test_every_judged_figure_prints_every_digit_it_holds() -> None:
    for row in summary.ROWS:
        assert summary.lost_digits(row) == [], row.goal
    short = summary.Row(**{**MADE_UP.__dict__, "figure": "{ratio:.1f}x"})
    assert summary.lost_digits(short) == ["{ratio:.1f} prints 1.29 as 1.3"]


def test_every_row_names_its_machine_date_and_commit() -> None:
    for row in summary.ROWS:
        assert row.machine in (summary.EPYC, summary.XEON), row.goal
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.date), row.goal
        assert re.match(r"[0-9a-f]{7}", row.commit), row.goal


def test_the_command_checks_writes_and_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "BENCHMARKS.md", page)
    summary.main(["--check"], path=str(page))  # fresh: no exit
    text = page.read_text()
    page.write_text(text.replace("| not met: the 95% interval", "| met: the 95% interval", 1))
    with pytest.raises(SystemExit) as e:
        summary.main(["--check"], path=str(page))
    assert "the verdict reads 'met: the 95% interval" in str(e.value.code)
    assert "python -m benchmarks.summary --write" in str(e.value.code)
    summary.main(["--write"], path=str(page))
    assert page.read_text() == text
    summary.main([])
    assert capsys.readouterr().out.strip() == summary.render()


def test_the_files_summary_commands_parse() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    found = re.findall(r"`python -m benchmarks\.summary( [^`]*)?`", text)
    assert found
    assert all(args.strip() in ("", "--check", "--write") for args in found), found
