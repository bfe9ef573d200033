"""The manual's pages as the docs tests read them (``tests/unit/test_docs_commands.py``,
``tests/unit/test_docs_drift.py``): which pages they are, their fenced code blocks, and the inline
code spans of their prose, each with its line, the scope it sits in (a paragraph, a list item or
a table row) and the section heading above it."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the manual: the README, its pages and the tests' own page (BENCHMARKS.md is a record of runs,
# kept by the benchmarks, and not read here)
PAGES = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```\s*([\w-]*)")
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
# where a scope starts: a blank line, a heading, a table row, a list item
NEW_SCOPE = re.compile(r"^[ \t]*(?:$|#|\||[-*] |\d+\. )", re.M)


@dataclass(frozen=True)
class Block:
    """A fenced code block: its label (``bash``, ``text``, ``""``...) and its lines, each with
    its line number on the page."""

    lang: str
    lines: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Span:
    """An inline code span of the prose: its text (line breaks as spaces), the line it starts
    on, its scope (a number shared by the spans of one paragraph, list item or table row) and
    the heading of its section."""

    text: str
    line: int
    scope: int
    section: str


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(text: str) -> list[Block]:
    """The page's fenced code blocks, in order."""
    out: list[Block] = []
    lang: str | None = None
    lines: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, lines = fence.group(1).lower(), []
        elif fence:
            out.append(Block(lang or "", tuple(lines)))
            lang = None
        elif lang is not None:
            lines.append((n, line))
    return out


def prose(text: str) -> str:
    """The page with its code blocks blanked out (fences included), lines kept in place."""
    out, inside = [], False
    for line in text.splitlines():
        fence = FENCE.match(line) is not None
        out.append("" if inside or fence else line)
        inside = inside != fence
    return "\n".join(out)


def spans(text: str) -> list[Span]:
    """The inline code spans of the page's prose, each with its line, scope and section. A scope
    is a sentence of a paragraph or list item, or a cell of a table row."""
    joined = prose(text)
    # the spans blanked, so that a boundary is never found inside one
    masked = SPAN.sub(lambda m: "`" + "x" * (len(m[0]) - 2) + "`", joined)
    bounds = [
        m.start() for m in re.finditer(r"^", masked, re.M) if NEW_SCOPE.match(masked, m.start())
    ]
    bounds += [m.end() for m in re.finditer(r"[.!?]\s+(?=[A-Z`*(\[])", masked)]
    bounds += [m.start() for m in re.finditer(r"\|", masked)]
    bounds.sort()
    sections, section = [], ""
    for line in joined.splitlines():
        section = line.lstrip("#").strip() if line.startswith("#") else section
        sections.append(section)
    out = []
    for m in SPAN.finditer(joined):
        n = joined.count("\n", 0, m.start())
        scope = bisect.bisect_right(bounds, m.start())
        out.append(Span(m[1].replace("\n", " "), n + 1, scope, sections[n]))
    return out
