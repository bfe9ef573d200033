"""The configuration reference (``docs/configuration.md``), generated from the code.

    python -m recsys.cli.configuration_page > docs/configuration.md   # write it
    python -m recsys.cli.configuration_page --check   # exit 1 when the page is stale

Every part comes from where the code defines it: the experiment config and the dataset schema from
their dataclasses (types, defaults, and the ``Attributes:`` sections of their docstrings), the
search-space file's keys from ``recsys.tune.space``, the command-line flags from the argparse
parsers of the ``[project.scripts]`` entry points, and the environment variables from a scan of
the project's files, described by ``ENV_VARS`` here. ``tests/unit/test_docs.py`` fails when the
page differs from ``render()``, a config field has no description, or a variable is read but not
described (or described but no longer read).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import inspect
import re
import sys
import textwrap
import tomllib
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from recsys import archs
from recsys.configlib import _optional_inner

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
COMMAND = "python -m recsys.cli.configuration_page > docs/configuration.md"

# ------------------------------------------------------------------------------------------------
# Environment variables: every RECSYS_* name the project reads, with its meaning

SETUP, RUN, INTERNAL, TESTS = "setup", "run", "internal", "tests"
ENV_GROUPS = {
    SETUP: "Setting up the environment (`scripts/setup.sh`, `./run.sh`, `scripts/wheelhouse.sh`)",
    RUN: "Running",
    INTERNAL: "Set by the project itself (not for users)",
    TESTS: "For the test suite",
}
ENV_VARS: dict[str, tuple[str, str]] = {
    "RECSYS_VENV": (
        SETUP,
        "where the virtual environment lives (default: `.venv` in the project folder); "
        "`./run.sh` runs that venv's Python; `./run.sh test-compat` sets `.venv-torch<version>`",
    ),
    "RECSYS_PYTHON": (SETUP, "the interpreter that creates the venv (default: `python3`)"),
    "RECSYS_FBGEMM": (
        SETUP,
        "`cpu | cuda | auto`: which FBGEMM build is installed (default `auto`: `cuda` when "
        "`nvidia-smi` lists a GPU, else `cpu`); `./run.sh gpu-check` sets `cuda`",
    ),
    "RECSYS_CUDA": (
        SETUP,
        "the PyTorch CUDA wheel index of a `cuda` install: `cu126`, `cu128`, ... (default "
        "`cu128`); torch and fbgemm-gpu both come from "
        "`https://download.pytorch.org/whl/$RECSYS_CUDA`, so their CUDA builds match",
    ),
    "RECSYS_TORCH": (
        SETUP,
        "`pinned | preinstalled | <version>` such as `2.11` (default `pinned`: torch 2.13.0); "
        "`preinstalled` keeps the torch `RECSYS_PYTHON` already has and installs the torchrec and "
        "FBGEMM that pair with it (`recsys/runtime/stack.py`); any other torch is refused before "
        "anything is installed. `./run.sh test-compat VERSION` sets it",
    ),
    "RECSYS_WHEELHOUSE": (
        SETUP,
        "a folder of wheels (`scripts/wheelhouse.sh` builds one): everything is installed from it "
        "alone (`pip --no-index`), no network",
    ),
    "RECSYS_TARGET_TORCH": (
        SETUP,
        "`scripts/wheelhouse.sh --torch preinstalled`: the target host's torch version (e.g. "
        "`2.11.0+cu130`), which picks the torchrec and FBGEMM the wheelhouse carries",
    ),
    "RECSYS_STORE_PATIENCE_S": (
        RUN,
        "seconds an operation on an object store (`--storage s3://...`: a checkpoint upload, "
        "Ray Train's and Tune's state) is retried while the store cannot be reached, 2 s "
        "between the first tries, doubling up to 30 s (default 300); set it where the "
        "workers run as well as for the sweep",
    ),
    "RECSYS_NODE_WAIT_S": (
        RUN,
        "seconds a training run that lost a node waits for nodes that can place its workers "
        "again, a line per placement attempt (Ray's `RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`, "
        "60 s), before it fails (default 600); the sweep passes it, and that Ray variable, to "
        "its trials",
    ),
    "RECSYS_TRACKING_WAIT_S": (
        RUN,
        "seconds a trial waits for an unreachable MLflow tracking store (a server restarting) "
        "before it fails, and a sweep phase's end waits for the reports its driver has not "
        "logged yet before it gives them up (default 600)",
    ),
    "RECSYS_BENCH_DIR": (
        RUN,
        "where `benchmarks/scale.py` writes its larger-than-memory data folder (default: the "
        "system's temp folder)",
    ),
    "RECSYS_LOCAL_RAY_API_SERVER": (
        INTERNAL,
        "set by `recsys.runtime.cluster.connect` when it starts a local Ray: the dashboard "
        "address it gave `RAY_API_SERVER_ADDRESS`, so a later connect (in this process or a child) "
        "knows that address is a stale one of its own, not the user's",
    ),
    "RECSYS_CHROMIUM": (
        TESTS,
        "a Chromium binary for the MLflow UI browser test and `scripts/mlflow_screenshot.py` "
        "(default: `chromium` on PATH; without one the browser test is skipped, saying why)",
    ),
    "RECSYS_CLUSTER_TESTS": (
        TESTS,
        "`1` runs the multi-node tests of minutes each that the suite otherwise skips (marker "
        "`clusters`: a trial across two nodes, a lost node under a sweep, a sweep as a Ray job); "
        "`./run.sh test-clusters` sets it",
    ),
    "RECSYS_EXTENDED_TESTS": (
        TESTS,
        "`1` runs the end-to-end cases of minutes whose path the suite covers otherwise (marker "
        "`extended`: each sweep test against a tracking server, the object store's other "
        "faults, ...); `./run.sh test-extended` sets it, with `RECSYS_CLUSTER_TESTS`",
    ),
    "RECSYS_NO_APT": (
        TESTS,
        "`1`: `./run.sh test` never runs apt-get (`scripts/test_services.sh`, which otherwise "
        "installs PostgreSQL, Chromium and fonts-liberation where missing); the tests that need "
        "one that is missing are skipped, saying why",
    ),
    "RECSYS_TEST_PROCS": (
        TESTS,
        "processes `./run.sh test` spreads the test files over (pytest-xdist; default 2; `-n 0` "
        "in the arguments: one)",
    ),
    "RECSYS_TEST_HOLD_AFTER_TRAINING_S": (
        TESTS,
        "a training worker waits this many seconds after its last report, so a test can kill a "
        "sweep between a trial's last checkpoint and Tune recording it done "
        "(`tests/ray/test_sweep_resume.py`)",
    ),
    "RECSYS_TEST_HOLD_SEED": (
        TESTS,
        "with `RECSYS_TEST_HOLD_AFTER_TRAINING_S`: only the runs of this `train.seed` wait",
    ),
    "RECSYS_TEST_HOLD_AT_STEP": (
        TESTS,
        "with `RECSYS_TEST_HOLD_AFTER_TRAINING_S`: the wait comes after the checkpoint of this "
        "step instead of after the last report, so a test can kill a sweep while a trial is "
        "mid-run on a machine of any speed (`tests/ray/killing.py`)",
    ),
    "RECSYS_START_CLOCK_DIR": (
        INTERNAL,
        "the overhead benchmark's: where each Ray Train run's controller writes the times of its "
        "start's parts (`benchmarks/start_clock.py`; set by the benchmark itself)",
    ),
}
# where RECSYS_* variables are read: folders (their .py, .sh, .yaml files) and single files
ENV_SCAN = ("recsys", "scripts", "experiments", "benchmarks", "tests", "run.sh", ".ci/run")
ENV_PATTERN = re.compile(r"\bRECSYS_[A-Z0-9_]*[A-Z0-9]\b")

# CLI defaults that depend on the machine the page is generated on
MACHINE_DEFAULTS = {("recsys-preprocess", "--workers"): "the number of cores"}
# placeholders of by-name maps of sections (``sharding.tables.<table>``)
MAP_NAMES = {"sharding.tables": "<table>", "dense": "<column>", "sparse": "<column>"}
# space-file keys without a comment in the example of ``recsys.tune.space``'s docstring
SPACE_KEYS = {
    "description": "free text about the space (kept with the sweep's saved state, not read)",
    "mode": "`max` or `min` for `metric` (a list for several objectives; default `max`)",
}


def env_vars_in_code(root: Path = ROOT) -> dict[str, list[str]]:
    """Every ``RECSYS_*`` name in the project's code and scripts (this file excluded), with the
    files (relative to ``root``) that name it."""
    found: dict[str, set[str]] = {}
    for path in _scanned_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == "recsys/cli/configuration_page.py":
            continue
        for name in ENV_PATTERN.findall(path.read_text(errors="replace")):
            found.setdefault(name, set()).add(rel)
    return {name: sorted(files) for name, files in sorted(found.items())}


def _scanned_files(root: Path) -> Iterator[Path]:
    for entry in ENV_SCAN:
        path = root / entry
        if path.is_file():
            yield path
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                if f.suffix in (".py", ".sh", ".yaml", ".yml") and "__pycache__" not in f.parts:
                    yield f


# ------------------------------------------------------------------------------------------------
# Dataclass docstrings


def _lines(doc: str | None) -> list[str]:
    """A docstring's lines, dedented; a tab (``"\\t"`` in a non-raw docstring) written ``\\t``."""
    return inspect.cleandoc((doc or "").replace("\t", "\\t")).splitlines()


def attributes(cls: type) -> dict[str, str]:
    """The ``Attributes:`` entries of a class docstring (Google style), by field name. A grouped
    entry (``a / b: text``) describes each field it names."""
    lines = _lines(cls.__doc__)
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    head = len(lines[start]) - len(lines[start].lstrip())
    entries: list[tuple[list[str], list[str]]] = []
    indent = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth <= head:
            break  # the section ended (text after it)
        indent = depth if indent is None else indent
        m = re.match(r"(\w+(?:\s*/\s*\w+)*):\s+(.*)", line.strip())
        if depth == indent and m:
            names = [n.strip() for n in m.group(1).split("/")]
            entries.append((names, [m.group(2)]))
        elif entries:
            entries[-1][1].append(line.strip())
    return {name: " ".join(text) for names, text in entries for name in names}


def _docstring_text(cls: type) -> str:
    """A class docstring without its ``Attributes:`` section."""
    lines = _lines(cls.__doc__)
    out: list[str] = []
    skipping, head = False, 0
    for line in lines:
        if line.strip() == "Attributes:":
            skipping, head = True, len(line) - len(line.lstrip())
            continue
        if skipping and line.strip() and len(line) - len(line.lstrip()) <= head:
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out).strip()


# ------------------------------------------------------------------------------------------------
# Config sections: one per dataclass reached from the root


@dataclass
class Row:
    key: str
    type: str
    default: Any
    description: str | None


@dataclass
class Section:
    cls: type
    keys: list[str]  # where it sits: "" (the root), "data.synthetic", "sharding.tables.<table>"
    notes: list[str] = field(default_factory=list)  # the parents' descriptions of it
    rows: list[Row] = field(default_factory=list)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _item_dataclass(tp: Any) -> tuple[str, type] | None:
    """``("list", C)`` for ``list[C]``, ``("dict", C)`` for ``dict[str, C]`` of a dataclass C."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args and _is_dataclass_type(args[0]):
        return "list", args[0]
    if origin is dict and len(args) == 2 and _is_dataclass_type(args[1]):
        return "dict", args[1]
    return None


# keys whose values a registry holds rather than a ``Literal``: shown as its names
REGISTERED = {"model.arch": " | ".join(archs.ARCHS)}


def type_name(tp: Any) -> str:
    """A field's type as a user writes it: ``Literal`` choices as ``a | b``, ``None`` as null."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if tp is Any:
        return "any"
    return str(getattr(tp, "__name__", tp))


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [dataclasses.asdict(v) for v in value]
    return value


def sections(root: type, map_names: dict[str, str] | None = None) -> list[Section]:
    """The sections of config class ``root``, depth first in field order. A class reached at
    several keys (``sharding.default`` and ``sharding.tables.<table>``) is one section."""
    map_names = MAP_NAMES if map_names is None else map_names
    found: dict[type, Section] = {}
    order: list[Section] = []

    def visit(cls: type, key: str, note: str | None) -> None:
        if cls in found:
            found[cls].keys.append(key)
            if note:
                found[cls].notes.append(f"`{key}`: {note}")
            return
        section = Section(cls, [key], [f"`{key}`: {note}"] if note and key else [])
        found[cls] = section
        order.append(section)
        docs = attributes(cls)
        hints = typing.get_type_hints(cls)
        nested: list[tuple[type, str, str | None]] = []
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            dotted = f"{key}.{f.name}" if key else f.name
            inner = _optional_inner(tp)
            if _is_dataclass_type(inner):
                nested.append((inner, dotted, docs.get(f.name)))
                continue
            shown = REGISTERED.get(dotted) or type_name(tp)
            section.rows.append(Row(dotted, shown, _default(f), docs.get(f.name)))
            item = _item_dataclass(inner)
            if item is not None:
                kind, item_cls = item
                suffix = "[<i>]" if kind == "list" else "." + map_names.get(dotted, "<name>")
                where = dotted + suffix
                nested.append((item_cls, where, f"an entry of `{dotted}`."))
        for item_cls, where, item_note in nested:
            visit(item_cls, where, item_note)

    visit(root, "", None)
    return order


def missing_descriptions(root: type) -> list[str]:
    """Dotted keys of the fields of ``root``'s sections that no docstring describes."""
    return [r.key for s in sections(root) for r in s.rows if not r.description]


def unknown_attributes(root: type) -> list[str]:
    """``Class.name`` of docstring entries that name no field of their class."""
    out = []
    for s in sections(root):
        names = {f.name for f in dataclasses.fields(s.cls)}
        out += [f"{s.cls.__name__}.{n}" for n in attributes(s.cls) if n not in names]
    return out


# ------------------------------------------------------------------------------------------------
# Markdown


def _inline(text: str) -> str:
    """reStructuredText inline literals (````x````) as Markdown code (```x```)."""
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _yaml(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def markdown(doc: str) -> str:
    """A docstring as Markdown: literal blocks (``::``) fenced, inline literals converted."""
    lines = _lines(doc)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            text = line.rstrip()[:-2].rstrip()
            if text:
                out.append(_inline(text) + ":")
            j = i + 1
            block: list[str] = []
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" ")):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```"]
            if j < len(lines):
                out.append("")
            i = j
            continue
        out.append(_inline(line))
        i += 1
    return "\n".join(out).strip()


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


UNDOCUMENTED = "**undocumented** (add it to the class docstring's `Attributes:`)"


def _render_sections(root: type, top: str) -> list[str]:
    out: list[str] = []
    for s in sections(root):
        keys = ", ".join(f"`{k}`" for k in s.keys if k) or top
        out += ["", f"### {keys} ({s.cls.__name__})", ""]
        intro = markdown(_docstring_text(s.cls))
        if intro:
            out += [intro, ""]
        if s.notes:
            out += [f"- {_inline(n)}" for n in s.notes] + [""]
        if len(s.keys) > 1:
            out += [f"The keys are shown under `{s.keys[0]}`; the same apply under "
                    + ", ".join(f"`{k}`" for k in s.keys[1:]) + ".", ""]  # fmt: skip
        rows = [
            [
                _code(r.key),
                _code(r.type),
                "" if r.default is dataclasses.MISSING else _code(_yaml(r.default)),
                _inline(r.description) if r.description else UNDOCUMENTED,
            ]
            for r in s.rows
        ]
        out += _table(["Key", "Type", "Default", "Description"], rows)
    return out


def _experiment() -> list[str]:
    from recsys.config import ExperimentConfig

    return [
        "## Experiment config",
        "",
        "An experiment file (`recsys-train --config FILE`, `recsys-export --config FILE`, a "
        "space's `base`) is a YAML file of overrides on these defaults, as nested sections or "
        "dotted keys; `recsys-train --set KEY=VALUE` and a space's `overrides` and `space` use "
        "the dotted keys. An example: `experiments/example.yaml`. With `data.source: prepared` "
        "the folder's `meta.json` fixes the features, table sizes, poolings, `model.num_dense` "
        "and the tasks.",
        *_render_sections(ExperimentConfig, "top level"),
    ]


def _schema() -> list[str]:
    from recsys.data import schema
    from recsys.data.schema import DatasetSchema

    return [
        "## Dataset schema",
        "",
        "A schema file (`recsys-preprocess --schema FILE`; shipped ones in `schemas/`).",
        "",
        markdown(schema.__doc__ or ""),
        *_render_sections(DatasetSchema, "top level"),
    ]


def space_keys() -> dict[str, tuple[str, str]]:
    """The top-level keys of a search-space file: ``{key: (example, meaning)}``, from the
    commented example in ``recsys.tune.space``'s docstring (``SPACE_KEYS`` where it has none)."""
    from recsys.tune import space

    found: dict[str, tuple[str, str]] = {}
    for line in (space.__doc__ or "").splitlines():
        m = re.match(r"    (\w+):(.*)$", line)
        if not m:
            continue
        key, rest = m.groups()
        value, _, comment = rest.partition("#")
        if key in found and (found[key][1] or not comment.strip()):
            continue
        found[key] = (value.strip(), _inline(comment.strip()))
    out = {}
    for key in space.SECTIONS:
        example, meaning = found.get(key, ("", ""))
        out[key] = (example, meaning or SPACE_KEYS.get(key, ""))
    return out


def _space() -> list[str]:
    from recsys.tune import references, space

    keys = space_keys()
    none = "**undocumented** (comment it in the example of `recsys/tune/space.py`'s docstring)"
    rows = [[_code(k), _code(ex), meaning or none] for k, (ex, meaning) in keys.items()]
    return [
        "## Search space files",
        "",
        "A space file (`recsys-sweep --space NAME_OR_FILE`; shipped ones in `search_spaces/`), "
        "from `recsys/tune/space.py`:",
        "",
        markdown(space.__doc__ or ""),
        "",
        "### Top-level keys",
        "",
        *_table(["Key", "Example", "Meaning"], rows),
        "",
        "### `baselines`: the reference models",
        "",
        "From `recsys/tune/references.py`:",
        "",
        markdown(references.__doc__ or ""),
    ]


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def entry_points(root: Path = ROOT) -> dict[str, str]:
    """``[project.scripts]`` of ``pyproject.toml``: ``{command: "module:function"}``."""
    with open(root / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def parser_of(target: str) -> argparse.ArgumentParser:
    """The argparse parser of an entry point (``module:function``), taken when the function asks
    it to parse (nothing after that runs)."""
    module, _, name = target.partition(":")
    main: Callable[..., Any] = getattr(importlib.import_module(module), name)
    with _capturing():
        try:
            main([])
        except _Captured as c:
            return c.parser
    raise RuntimeError(f"{target} returned without parsing its arguments")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or str(action.dest)
    if action.nargs == 0:
        return names
    if action.choices is not None:
        return f"{names} {' | '.join(str(c) for c in action.choices)}"
    metavar = action.metavar or (action.dest if not action.option_strings else action.dest.upper())
    more = " ..." if action.nargs in ("+", "*", argparse.REMAINDER) else ""
    return f"{names} {metavar}{more}" if action.option_strings else f"{metavar}{more}"


def _flag_default(prog: str, action: argparse.Action) -> str:
    key = (prog, action.option_strings[0] if action.option_strings else action.dest)
    if key in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[key]
    if action.required:
        return "required"
    if action.nargs == 0 or action.default is None or action.default == []:
        return ""
    return _code(str(action.default))


def _flag_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:
        text = parser._get_formatter()._expand_help(action)
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [a.option_strings[0] for a in group._group_actions if a is not action]
            need = "one of them is required" if group.required else "at most one"
            text = f"{text} (exclusive with {', '.join(others)}; {need})".lstrip()
    return _inline(text)


def _cli() -> list[str]:
    out = [
        "## Command-line flags",
        "",
        "The entry points of `pyproject.toml` (`[project.scripts]`); `--help` prints the same.",
    ]
    for prog, target in entry_points().items():
        parser = parser_of(target)
        summary = markdown((parser.description or "").split("\n\n")[0])
        module = target.partition(":")[0]
        out += ["", f"### `{prog}` (`{module}`)", "", summary, ""]
        rows = [
            [_code(_flag(a)), _flag_default(prog, a), _flag_help(parser, a)]
            for a in parser._actions
            if not isinstance(a, argparse._HelpAction)
        ]
        out += _table(["Flag", "Default", "Description"], rows)
    return out


def _named_in(files: list[str]) -> list[str]:
    """The files, test files as one ``tests/`` (so the page does not change with every test)."""
    return [f for f in files if not f.startswith("tests/")] + (
        ["tests/"] if any(f.startswith("tests/") for f in files) else []
    )


def _env() -> list[str]:
    used = env_vars_in_code()
    out = [
        "## Environment variables",
        "",
        "Every `RECSYS_*` variable the project reads, and the files that name it.",
    ]
    for group, title in ENV_GROUPS.items():
        rows = [
            [_code(name), text, ", ".join(_code(f) for f in _named_in(used.get(name, [])))]
            for name, (g, text) in sorted(ENV_VARS.items())
            if g == group
        ]
        if rows:
            out += ["", f"### {title}", "", *_table(["Variable", "Meaning", "Named in"], rows)]
    return out


def render() -> str:
    """The whole page (Markdown)."""
    parts = [
        "# Configuration reference",
        "",
        f"Generated from the code by `{COMMAND}`; do not edit it by hand (the docstrings, "
        "parsers and `recsys/cli/configuration_page.py` are the source; `tests/unit/test_docs.py` "
        "fails when this page is stale).",
        "",
        "Contents: [Experiment config](#experiment-config), [Dataset schema](#dataset-schema), "
        "[Search space files](#search-space-files), [Command-line flags](#command-line-flags), "
        "[Environment variables](#environment-variables).",
        "",
        *_experiment(),
        "",
        *_schema(),
        "",
        *_space(),
        "",
        *_cli(),
        "",
        *_env(),
    ]
    return "\n".join(parts).rstrip() + "\n"


def check(page: Path = PAGE) -> str | None:
    """``None`` when ``page`` is up to date, else what differs (the start of a unified diff)."""
    want = render()
    have = page.read_text() if page.is_file() else ""
    if have == want:
        return None
    diff = difflib.unified_diff(
        have.splitlines(), want.splitlines(), str(page), "render()", lineterm="", n=1
    )
    lines = list(diff)
    more = f"\n... ({len(lines) - 60} more lines)" if len(lines) > 60 else ""
    shown = "\n".join(lines[:60]) + more
    return f"{page} is stale; regenerate it: {COMMAND}\n{shown}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m recsys.cli.configuration_page",
        description="Print the configuration reference (Markdown), or check docs/configuration.md.",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    args = p.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            raise SystemExit(stale)
        print(f"{PAGE.relative_to(ROOT)} is up to date", file=sys.stderr)
        return
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
