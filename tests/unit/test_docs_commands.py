"""The command lines the manual shows are ones the code takes: every shell line in a code block of
``README.md`` and ``docs/*.md`` (a ``bash`` / ``sh`` / unlabelled block, or a ``$ `` line of a
``text`` block), and every inline code span of their prose, that runs one of this project's entry
points (``recsys-*``, ``python experiments/*.py``, ``./run.sh VERB``) is checked:

- every ``--flag`` it gives the tool is one that the tool's ``--help`` lists (each tool's
  ``--help`` is run once, all of them at once);
- every ``./run.sh VERB`` is a verb that ``run.sh`` takes;
- every path into the repository's own folders (``search_spaces/x.yaml``, ``experiments/x.py``,
  ``scripts/x.sh``, ...) exists, on any shell line or inline span, and so does the space or
  schema that a ``--space`` / ``--schema`` names by name.

Line continuations (``\\`` at a line's end) are joined and ``#`` comments dropped, as the shell
does. Not checked, on purpose: a value in capitals or with ``...`` (``--out DIR``, ``INPUT...``:
a placeholder), the flags of ``./run.sh`` verbs whose arguments go to pytest or
``scripts/gpu_check.py`` (``test``, ``test-compat``, ``gpu-check``, ...), the words before an
entry point on its line (``ray job submit``'s own flags), and an inline span that only names a
command (``recsys-sweep``, a ``./run.sh`` verb). ``EXCLUDED`` lists the lines left out, with why.

Beside them: ``docs/status.md`` lists every benchmark that ``python -m benchmarks --help`` has.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}  # a ``text`` block: only its ``$ `` lines
# the repository's own folders: a path into one of them names a file that must exist
REPO_DIRS = "benchmarks|docs|experiments|recsys|schemas|scripts|search_spaces|tests"
PATH = re.compile(rf"^(?:\./)?(?:{REPO_DIRS})/[\w./-]*$")
OPERATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}
INLINE = "inline"  # the label of an inline code span (`recsys-export --sweep NAME`)
NO_VERB = "?"  # the module of a ``./run.sh`` verb that run.sh does not take
# (page, the line as the page has it, comment included): why it is not checked. Empty: every
# command line of the manual is checked. A line that is a placeholder on purpose goes here, with
# its reason.
EXCLUDED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Tool:
    """An entry point: the name the docs call it by and the module whose ``--help`` lists its
    flags (``None``: its arguments are another program's, e.g. pytest's for ``./run.sh test``)."""

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
    with open(ROOT / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["project"]["scripts"]
    return {name: Tool(name, target.split(":")[0]) for name, target in table.items()}


@functools.cache
def experiments() -> dict[str, Tool]:
    """``experiments/*.py`` (as ``experiments/x.py``) to the CLI module each one runs."""
    found = {}
    for path in sorted((ROOT / "experiments").glob("*.py")):
        m = re.search(r"^from ([\w.]+) import main$", path.read_text(), re.M)
        if m:
            rel = path.relative_to(ROOT).as_posix()
            found[rel] = Tool(f"python {rel}", m.group(1))
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


def _help_flags(text: str) -> set[str]:
    """The option strings of an argparse ``--help``: the lines of its option sections that start
    with an option (``  --name METAVAR   help``), before the help column."""
    flags: set[str] = set()
    sections = re.split(r"^(?:options|optional arguments):$", text, maxsplit=1, flags=re.M)
    for line in sections[-1].splitlines():
        if re.match(r"^ {2}-", line):
            flags.update(re.findall(r"--[\w-]+", re.split(r"\s{2,}", line.strip())[0]))
    return flags


@functools.cache
def flags_of_modules() -> dict[str, set[str]]:
    """Every checked tool's flags, from one ``--help`` run of each, all run at once."""
    modules = sorted({t.module for t in [*scripts().values(), *experiments().values()] if t.module})
    env = {**os.environ, "COLUMNS": "100"}
    procs = {
        m: subprocess.Popen(
            [sys.executable, "-m", m, "--help"],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for m in modules
    }
    found = {}
    for module, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"python -m {module} --help failed:\n{err}"
        found[module] = _help_flags(out)
        assert "--help" in found[module], f"python -m {module} --help: no options read\n{out}"
    return found


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
    lang: str | None = None  # inside a block: its label
    pending: tuple[int, list[str], list[str]] | None = None  # start, raw lines, code parts
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w-]*)", line)
        if fence:
            lang = None if lang is not None else fence.group(1).lower()
            pending = None
            continue
        if lang is None:
            continue
        if pending is None:
            if lang == "text" and line.startswith("$ "):
                line = line[2:]
            elif lang not in SHELL_BLOCKS:
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
            out.append(Line(f"{page}:{start}", "\n".join(raws), joined, lang))
    return out


def inline_commands(page: str, text: str) -> list[Line]:
    """The inline code spans of a page's prose (outside its code blocks), each as a line."""
    prose = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m[0].count("\n"), text, flags=re.M | re.S)
    return [
        Line(
            f"{page}:{prose.count(chr(10), 0, m.start()) + 1}",
            m[1],
            m[1].replace("\n", " "),
            INLINE,
        )
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose)
    ]


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
    """What is wrong with the page's command lines, one line per problem."""
    out = []
    for line in [*shell_lines(page, text), *inline_commands(page, text)]:
        if (page, line.raw) in EXCLUDED:
            continue
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
    return out


def problems_of(words: list[str]) -> list[str]:
    """What is wrong with one simple command: its paths into the repository, and, where it runs
    an entry point, the verb, the flags and the space or schema it names."""
    out = []
    for word in words:  # paths into the repository, on any command
        value = re.sub(r"^(?:--[\w-]+=|[A-Z_]+=)", "", word).split("::")[0]
        pattern = any(c in value for c in "*{}<>[]")  # a glob or a placeholder
        if PATH.match(value) and not pattern and not (ROOT / value).exists():
            out.append(f"{value} does not exist")
    found = invocation(words)
    if found is None:
        return out
    tool, args = found
    if tool.module == NO_VERB:
        return [*out, f"{tool.name}: run.sh takes no such verb ({', '.join(run_verbs())})"]
    if tool.name.startswith("python experiments/") and tool.module is None:
        return out  # a missing script: said above
    known = flags_of_modules().get(tool.module, set()) if tool.module else None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        flag, _, value = arg.partition("=")
        if known is not None and flag.startswith("--") and flag not in known:
            out.append(f"{tool.name}: no such flag {flag} (its --help has {sorted(known)})")
        value = value or (args[i + 1] if i + 1 < len(args) else "")
        named = {"--space": ("search_spaces", ".yaml"), "--schema": ("schemas", ".yaml")}
        if flag in named and value and "/" not in value and not placeholder(value):
            folder, ext = named[flag]
            if not value.endswith(ext) and not (ROOT / folder / f"{value}{ext}").exists():
                out.append(f"{flag} {value}: there is no {folder}/{value}{ext}")
    return out


# --- the tests -----------------------------------------------------------------------------------


def test_every_command_line_of_the_manual_is_one_the_code_takes():
    problems = [p for page in PAGES for p in problems_in(rel(page), page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_pages_commands_are_found():
    """The check sees what it should: each installed command, an experiments script and
    ./run.sh all appear on the pages' shell lines (a parser that found nothing would pass)."""
    tools = set()
    for page in PAGES:
        for line in shell_lines(rel(page), page.read_text()):
            for words in commands(line):
                if found := invocation(words):
                    tools.add(found[0].name.split()[0])
    assert set(scripts()) <= tools, sorted(set(scripts()) - tools)
    assert {"python", "./run.sh"} <= tools, tools


def test_a_made_up_flag_verb_and_path_are_reported():
    page = (
        "Inline: `recsys-sweep --inline-flag`; every `./run.sh` verb; `tests/no_such.py`.\n"
        "```bash\n"
        ".venv/bin/recsys-sweep --space default --no-such-flag 3   # --nor-this-one\n"
        ".venv/bin/recsys-export --sweep x \\\n"
        "    --dtype int8 --made-up=1\n"
        "./run.sh deploy\n"
        "./run.sh sweep --bogus\n"
        "python experiments/nope.py --x\n"
        "bash scripts/no_such_script.sh\n"
        ".venv/bin/recsys-sweep --space no_such_space\n"
        ".venv/bin/ray job submit --runtime-env-json '{}' -- python experiments/sweep.py --name a\n"
        "```\n"
        "```python\n"
        "recsys-sweep --in-python-block\n"
        "```\n"
    )
    problems = problems_in("fake.md", page)
    said = "\n".join(problems)
    assert "fake.md:1: recsys-sweep: no such flag --inline-flag" in said
    assert "fake.md:1: tests/no_such.py does not exist" in said
    assert "fake.md:3: recsys-sweep: no such flag --no-such-flag" in said
    assert "fake.md:4: recsys-export: no such flag --made-up" in said
    assert "fake.md:6: ./run.sh deploy: run.sh takes no such verb" in said
    assert "fake.md:7: ./run.sh sweep: no such flag --bogus" in said
    assert "fake.md:8: experiments/nope.py does not exist" in said
    assert "fake.md:9: scripts/no_such_script.sh does not exist" in said
    assert "fake.md:10: --space no_such_space: there is no search_spaces/no_such_space.yaml" in said
    # not the comment, the bare `./run.sh` of prose, ray's flags, the python block
    assert len(problems) == 9, said


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
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, text=True, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    names = re.search(r"\{([\w,-]+)\}", out)
    assert names, out
    page = (ROOT / "docs" / "status.md").read_text()
    listed = set(re.findall(r"^\.venv/bin/python -m benchmarks ([\w-]+)", page, re.M))
    assert set(names[1].split(",")) <= listed, sorted(set(names[1].split(",")) - listed)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()
