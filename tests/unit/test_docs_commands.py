"""The command lines and flags the manual shows are ones the code takes. The manual is
``README.md``, ``tests/README.md`` and ``docs/*.md`` (``tests/docs_pages.py``).

**Command lines.** Every shell line in a code block (a ``bash`` / ``sh`` / unlabelled block, or a
``$ `` line of a ``text`` block), and every inline code span of the prose, that runs one of this
project's entry points (``recsys-*``, ``python experiments/*.py``, ``./run.sh VERB``, or
``python -m M`` for a module of this project that parses its arguments: ``python -m benchmarks``,
``python -m recsys.cli.planted``, ...) is checked:

- every ``--flag`` it gives the tool is one that the tool's argparse parser has (after a
  subcommand's name, that subcommand's too). The parsers are taken from the code as
  docs/configuration.md takes them (``recsys.cli.configuration_page.parser_of``);
- every ``./run.sh VERB`` is a verb that ``run.sh`` takes;
- a space or schema that a ``--space`` / ``--schema`` names by name is shipped.

**Flags in prose.** An inline span that starts with a flag (`--more N`, `--confirm`) is checked
against the command it is said of, where that is unambiguous: the one entry point named in the
same paragraph, list item or table row; where none is named there, the one named in its
section's heading (``## `recsys-sweep` options``). A flag whose scope names two entry points, or
another program's command line (`pip install --no-deps`), is not attributed and not checked.

Line continuations (``\\`` at a line's end) are joined and ``#`` comments dropped, as the shell
does. Not checked, on purpose: a value in capitals or with ``...`` (``--out DIR``, ``INPUT...``:
a placeholder), the flags of ``./run.sh`` verbs whose arguments go to pytest or
``scripts/gpu_check.py`` (``test``, ``test-compat``, ``gpu-check``, ...), the words before an
entry point on its line (``ray job submit``'s own flags), and an inline span that only names a
command (``recsys-sweep``, a ``./run.sh`` verb). Paths are checked by ``test_docs_drift.py``.

Beside them: ``docs/status.md`` lists every benchmark that ``python -m benchmarks`` has.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
from dataclasses import dataclass

from recsys.cli import configuration_page
from tests.docs_pages import PAGES, ROOT, blocks, rel, spans

SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}  # a ``text`` block: only its ``$ `` lines
OPERATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}
INLINE = "inline"  # the label of an inline code span (`recsys-export --sweep NAME`)
NO_VERB = "?"  # the module of a ``./run.sh`` verb that run.sh does not take
NO_MODULE = "!"  # the module of a ``python -m`` that names no module of this project
PROJECT_MODULES = ("recsys", "benchmarks")  # ``python -m M`` of these is one of our tools


@dataclass(frozen=True)
class Tool:
    """An entry point: the name the docs call it by and the module whose ``main`` parses its
    arguments (``None``: its arguments are another program's, e.g. pytest's for
    ``./run.sh test``, or it parses none)."""

    name: str
    module: str | None


@dataclass(frozen=True)
class Line:
    """One logical shell line of a page: continuations joined, where it starts."""

    where: str
    raw: str
    text: str
    lang: str  # the block's label


# --- what the project's entry points are, from the code ------------------------------------------


@functools.cache
def scripts() -> dict[str, Tool]:
    """The installed commands (``pyproject.toml`` ``[project.scripts]``): name to tool."""
    points = configuration_page.entry_points(ROOT)
    return {name: Tool(name, target.split(":")[0]) for name, target in points.items()}


@functools.cache
def experiments() -> dict[str, Tool]:
    """``experiments/*.py`` (as ``experiments/x.py``) to the CLI module each one runs."""
    found = {}
    for path in sorted((ROOT / "experiments").glob("*.py")):
        m = re.search(r"^from ([\w.]+) import main$", path.read_text(), re.M)
        if m:
            rel_path = path.relative_to(ROOT).as_posix()
            found[rel_path] = Tool(f"python {rel_path}", m.group(1))
    return found


@functools.cache
def run_verbs() -> dict[str, Tool]:
    """The verbs of ``run.sh``'s ``case`` (its arms, ``*`` left out), each with the tool its
    arguments go to: the ``experiments/*.py`` it ``exec``s, else none that is checked."""
    text = (ROOT / "run.sh").read_text()
    body = text[text.index("case $verb in") : text.index("esac")]
    arms = re.split(r"^\s*([a-z][\w-]*)\)", body, flags=re.M)[1:]
    verbs = {}
    for verb, code in zip(arms[::2], arms[1::2], strict=True):
        m = re.search(r"exec \"\$py\" (experiments/\w+\.py)", code)
        module = experiments()[m.group(1)].module if m else None
        verbs[verb] = Tool(f"./run.sh {verb}", module)
    return verbs


@functools.cache
def python_module(name: str) -> Tool | None:
    """``python -m name``: a tool if ``name`` is a module of this project (``None`` otherwise),
    checked if its ``main`` builds an argparse parser."""
    if name.split(".")[0] not in PROJECT_MODULES:
        return None
    base = ROOT.joinpath(*name.split("."))
    path = next((p for p in (base / "__main__.py", base.with_suffix(".py")) if p.is_file()), None)
    if path is None:
        return Tool(f"python -m {name}", NO_MODULE)
    module = name + (".__main__" if path.name == "__main__.py" else "")
    parses = "ArgumentParser(" in path.read_text()
    return Tool(f"python -m {name}", module if parses else None)


@functools.cache
def parser(module: str) -> argparse.ArgumentParser:
    """The argparse parser of a tool's module: the one its ``main`` parses with."""
    return configuration_page.parser_of(f"{module}:main")


def known_flags(module: str, args: list[str]) -> set[str]:
    """The flags a tool takes with ``args``: its parser's, and after a subcommand's name (the
    first argument that names one) that subcommand's too."""
    p = parser(module)
    flags = {s for a in p._actions for s in a.option_strings}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = next((a for a in args if a in action.choices), None)
            if name is not None:
                flags |= {s for a in action.choices[name]._actions for s in a.option_strings}
    return flags


# --- the pages' shell lines ----------------------------------------------------------------------


def strip_comment(line: str) -> str:
    """The line without its ``#`` comment: a ``#`` that starts a word, outside quotes (a ``#``
    inside a word, as in a URL's ``/#/``, is kept, as the shell keeps it)."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_lines(page: str, text: str) -> list[Line]:
    """The logical shell lines of a page's code blocks, continuations joined."""
    out: list[Line] = []
    for block in blocks(text):
        pending: tuple[int, list[str], list[str]] | None = None  # start, raw lines, code parts
        for n, line in block.lines:
            if pending is None:
                if block.lang == "text" and line.startswith("$ "):
                    line = line[2:]
                elif block.lang not in SHELL_BLOCKS:
                    continue
            code = strip_comment(line)
            start, raws, parts = pending or (n, [], [])
            raws.append(line.strip())
            if code.endswith("\\"):
                pending = (start, raws, [*parts, code[:-1].strip()])
                continue
            pending = None
            joined = " ".join(p for p in [*parts, code.strip()] if p)
            if joined:
                out.append(Line(f"{page}:{start}", "\n".join(raws), joined, block.lang))
    return out


def inline_commands(page: str, text: str) -> list[Line]:
    """The inline code spans of a page's prose (outside its code blocks), each as a line."""
    return [Line(f"{page}:{s.line}", s.text, s.text, INLINE) for s in spans(text)]


def commands(line: Line) -> list[list[str]]:
    """The line's simple commands (split at ``|``, ``&&``, ``;``, ...), each as its words,
    redirections' targets left out. A line of an unlabelled block that is no shell line (an
    unclosed quote: a file tree's text) has none; in a shell block it is an error."""
    try:
        return _commands(line)
    except ValueError:
        if line.lang in SHELL_BLOCKS - {""}:
            raise
        return []  # an unlabelled block's text, or an inline span of prose


def _commands(line: Line) -> list[list[str]]:
    lex = shlex.shlex(line.text, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    skip = False
    for word in lex:
        if word in OPERATORS:
            out.append([])
        elif word in REDIRECTS or re.fullmatch(r"\d?>>?", word):
            skip = True
        elif skip:
            skip = False
        else:
            out[-1].append(word)
    return [c for c in out if c]


def invocation(words: list[str]) -> tuple[Tool, list[str]] | None:
    """The entry point a simple command runs, with the words it is given; None if none."""
    for i, word in enumerate(words):
        base = os.path.basename(word)
        rest = words[i + 1 :]
        if base in scripts():
            return scripts()[base], rest
        if re.fullmatch(r"python[\d.]*", base) and rest:
            if rest[0] == "-m" and len(rest) > 1:
                tool = python_module(rest[1])
                return (tool, rest[2:]) if tool else None
            script = re.sub(r"^.*?(experiments/[\w.]+)$", r"\1", rest[0])
            if script.startswith("experiments/") and script.endswith(".py"):
                return experiments().get(script, Tool(f"python {script}", None)), rest[1:]
        if base == "run.sh":
            verb = rest[0] if rest else ""
            return run_verbs().get(verb, Tool(f"./run.sh {verb}", NO_VERB)), rest[1:]
    return None


def placeholder(value: str) -> bool:
    """A value in capitals (``DIR``, ``NAME``, ``HEAD:6379`` is not one) or with ``...``."""
    return "..." in value or re.fullmatch(r"[A-Z][A-Z_]*", value) is not None


def problems_in(page: str, text: str) -> list[str]:
    """What is wrong with the page's command lines and prose flags, one line per problem."""
    out = []
    for line in [*shell_lines(page, text), *inline_commands(page, text)]:
        try:
            simple = commands(line)
        except ValueError as e:  # an unclosed quote
            out.append(f"{line.where}: not a shell line ({e}): {line.text}")
            continue
        for words in simple:
            found = invocation(words)
            if line.lang == INLINE and found and not found[1]:
                continue  # prose naming a command (`recsys-sweep`, a `./run.sh` verb)
            out += [f"{line.where}: {p}" for p in problems_of(words)]
    for where, tool, flag in prose_flags(page, text):
        if tool.module and flag not in known_flags(tool.module, []):
            out.append(f"{where}: {tool.name}: no such flag {flag} (said of it in prose)")
    return out


def problems_of(words: list[str]) -> list[str]:
    """What is wrong with one simple command that runs an entry point: its verb, its flags and
    the space or schema it names."""
    found = invocation(words)
    if found is None:
        return []
    tool, args = found
    if tool.module == NO_VERB:
        return [f"{tool.name}: run.sh takes no such verb ({', '.join(run_verbs())})"]
    if tool.module == NO_MODULE:
        return [f"{tool.name}: no such module in this project"]
    if tool.name.startswith("python experiments/") and tool.module is None:
        return [f"{tool.name}: no such script"]
    out = []
    known = known_flags(tool.module, args) if tool.module else None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        flag, _, value = arg.partition("=")
        if known is not None and flag.startswith("--") and flag not in known:
            out.append(f"{tool.name}: no such flag {flag} (its parser has {sorted(known)})")
        value = value or (args[i + 1] if i + 1 < len(args) else "")
        named = {"--space": ("search_spaces", ".yaml"), "--schema": ("schemas", ".yaml")}
        if flag in named and value and "/" not in value and not placeholder(value):
            folder, ext = named[flag]
            if not value.endswith(ext) and not (ROOT / folder / f"{value}{ext}").exists():
                out.append(f"{flag} {value}: there is no {folder}/{value}{ext}")
    return out


# --- flags in prose -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Named:
    """What the inline spans of a sentence (or a heading) name: entry points by their name alone
    (`recsys-train`, `./run.sh sweep`), entry points on a command line (`recsys-sweep
    --export`), and whether another program's command line is among them (`pip install
    --no-deps x`)."""

    bare: frozenset[Tool] = frozenset()
    lines: frozenset[Tool] = frozenset()
    other: bool = False

    def __or__(self, more: Named) -> Named:
        return Named(self.bare | more.bare, self.lines | more.lines, self.other or more.other)

    def said_of(self) -> Tool | None:
        """The one entry point a flag beside these spans is said of, if there is one."""
        if len(self.bare) == 1 and self.lines <= self.bare and not self.other:
            return next(iter(self.bare))
        return None


def named(text: str) -> Named:
    """What one inline span names (``Named``)."""
    try:
        simple = _commands(Line("", text, text, INLINE))
    except ValueError:
        return Named()
    out = Named()
    for words in simple:
        if found := invocation(words):
            tool = frozenset({found[0]})
            out |= Named(bare=tool) if not found[1] else Named(lines=tool)
        elif re.fullmatch(r"\w[\w./-]*", words[0]) and any(w[:1] == "-" for w in words):
            out |= Named(other=True)
    return out


def prose_flags(page: str, text: str) -> list[tuple[str, Tool, str]]:
    """The flags of the page's prose (an inline span that starts with ``--``), each with the
    entry point it is said of where that is unambiguous: ``(where, tool, flag)``. That is the one
    entry point named by its name alone in the flag's sentence (or table cell), with no other
    command named there; where the sentence names no command, the one so named in its
    section's heading."""
    found = spans(text)
    scopes: dict[int, Named] = {}
    for s in found:
        scopes[s.scope] = scopes.get(s.scope, Named()) | named(s.text)
    headings: dict[str, Named] = {}
    for heading in re.findall(r"^#+[ \t]*(.*)$", text, re.M):
        for m in re.findall(r"`([^`]+)`", heading):
            headings[heading.strip()] = headings.get(heading.strip(), Named()) | named(m)
    out = []
    for s in found:
        flag = re.match(r"(--[\w-]+)", s.text)
        if flag is None:
            continue
        scope = scopes[s.scope]
        if scope == Named():
            scope = headings.get(s.section, Named())
        if tool := scope.said_of():
            out.append((f"{page}:{s.line}", tool, flag.group(1)))
    return out


# --- the tests -----------------------------------------------------------------------------------


def test_every_command_line_and_flag_of_the_manual_is_one_the_code_takes():
    problems = [p for page in PAGES for p in problems_in(rel(page), page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_pages_commands_are_found():
    """The check sees what it should: each installed command, an experiments script, ./run.sh
    and python -m benchmarks all appear on the pages' shell lines, and prose flags are
    attributed (a parser that found nothing would pass)."""
    tools, attributed = set(), 0
    for page in PAGES:
        text = page.read_text()
        for line in shell_lines(rel(page), text):
            for words in commands(line):
                if found := invocation(words):
                    name = found[0].name
                    tools.add(name if " -m " in name else name.split()[0])
        attributed += len(prose_flags(rel(page), text))
    assert set(scripts()) <= tools, sorted(set(scripts()) - tools)
    assert {"python", "./run.sh", "python -m benchmarks"} <= tools, tools
    assert attributed > 50, attributed


def test_a_made_up_flag_verb_and_space_are_reported():
    page = (
        "Inline: `recsys-sweep --inline-flag`; every `./run.sh` verb.\n"
        "```bash\n"
        ".venv/bin/recsys-sweep --space default --no-such-flag 3   # --nor-this-one\n"
        ".venv/bin/recsys-export --sweep x \\\n"
        "    --dtype int8 --made-up=1\n"
        "./run.sh deploy\n"
        "./run.sh sweep --bogus\n"
        "python experiments/nope.py --x\n"
        ".venv/bin/python -m benchmarks export --gib 2 --steps 3\n"
        ".venv/bin/recsys-sweep --space no_such_space\n"
        ".venv/bin/ray job submit --runtime-env-json '{}' -- python experiments/sweep.py --name a\n"
        ".venv/bin/python -m recsys.no_such_module --x\n"
        ".venv/bin/python -m pytest --no-such-pytest-flag\n"
        "```\n"
        "```python\n"
        "recsys-sweep --in-python-block\n"
        "```\n"
    )
    problems = problems_in("fake.md", page)
    said = "\n".join(problems)
    assert "fake.md:1: recsys-sweep: no such flag --inline-flag" in said
    assert "fake.md:3: recsys-sweep: no such flag --no-such-flag" in said
    assert "fake.md:4: recsys-export: no such flag --made-up" in said
    assert "fake.md:6: ./run.sh deploy: run.sh takes no such verb" in said
    assert "fake.md:7: ./run.sh sweep: no such flag --bogus" in said
    assert "fake.md:8: python experiments/nope.py: no such script" in said
    # --gib is export's own flag; --steps belongs to other benchmarks, not to export
    assert "fake.md:9: python -m benchmarks: no such flag --steps" in said
    assert "--gib" not in said.split("no such flag")[-1].split("(")[0]
    assert "fake.md:10: --space no_such_space: there is no search_spaces/no_such_space.yaml" in said
    assert "fake.md:12: python -m recsys.no_such_module: no such module" in said
    # not the comment, the bare `./run.sh` of prose, ray's flags, pytest's, the python block
    assert len(problems) == 9, said


def test_a_flag_said_of_a_command_in_prose_is_checked_where_unambiguous():
    page = (
        "## `recsys-sweep` options\n"
        "\n"
        "| `--more N` | grows it |\n"
        "| `--no-such-sweep-flag` | is said of recsys-sweep by the heading |\n"
        "\n"
        "## Exports\n"
        "\n"
        "`recsys-export` takes `--dtype` and `--max-emb-gb` (a typo). Next sentence: `--orphan`.\n"
        "\n"
        "- `recsys-train` and `recsys-sweep` both take `--made-up`: two commands, not checked.\n"
        "- `recsys-export --sweep NAME` is written as `recsys-sweep --export` does: `--unsaid`.\n"
        "- `pip install --no-deps x` beside `recsys-sweep` and `--no-deps`: another program.\n"
    )
    said = "\n".join(problems_in("fake.md", page))
    assert "fake.md:4: recsys-sweep: no such flag --no-such-sweep-flag (said of it" in said
    assert "fake.md:8: recsys-export: no such flag --max-emb-gb (said of it" in said
    assert len(said.splitlines()) == 2, said
    attributed = {(w, t.name, f) for w, t, f in prose_flags("fake.md", page)}
    assert ("fake.md:3", "recsys-sweep", "--more") in attributed
    assert ("fake.md:8", "recsys-export", "--dtype") in attributed
    assert len(attributed) == 4, attributed  # --orphan's sentence names no command


def test_comments_and_continuations_are_read_as_the_shell_reads_them():
    page = (
        "```\n"
        "# a comment line\n"
        "curl http://127.0.0.1:5000/#/experiments   # '#' inside a word is no comment\n"
        ".venv/bin/recsys-train --experiment debug \\\n"
        "    --set 'a=b # c' \\\n"
        "    --num-workers 2\n"
        "```\n"
    )
    lines = shell_lines("fake.md", page)
    assert [(x.where, x.text) for x in lines] == [
        ("fake.md:3", "curl http://127.0.0.1:5000/#/experiments"),
        ("fake.md:4", ".venv/bin/recsys-train --experiment debug --set 'a=b # c' --num-workers 2"),
    ]
    assert problems_in("fake.md", page) == []


def test_status_lists_every_benchmark():
    sub = next(a for a in parser("benchmarks.__main__")._actions
               if isinstance(a, argparse._SubParsersAction))  # fmt: skip
    page = (ROOT / "docs" / "status.md").read_text()
    listed = set(re.findall(r"^\.venv/bin/python -m benchmarks ([\w-]+)", page, re.M))
    assert set(sub.choices) <= listed, sorted(set(sub.choices) - listed)
