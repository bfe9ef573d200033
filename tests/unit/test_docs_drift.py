"""What the manual names exists. The manual is ``README.md``, ``tests/README.md`` and
``docs/*.md`` (``tests/docs_pages.py``); read here are the words of its code blocks and of the
inline code spans of its prose.

- **Paths.** A path that starts at a top-level entry of the checkout (``recsys/...``,
  ``tests/...``, ``./run.sh``; on ``tests/README.md`` also one that starts at an entry of
  ``tests/``: ``unit/test_docs.py``) exists. A placeholder (``<sweep>``, ``NAME``, ``...``) or a
  glob (``*``) part matches any name, and at least one file must match; ``{a,b}`` names each.
  A test's node id (``tests/x.py::test_y[case]``, or ``::test_z`` after it) names a ``def`` or
  ``class`` of that file.
- **Outputs.** A path under what the commands create at the project's root (``OUTPUTS``:
  ``runs/``, ``exports/``, ``data/``, ``mlflow.db``, ``mlartifacts/``, ``.venv/``) is not
  checked: nothing committed is there. A path that starts anywhere else (``export/model.pt``, a
  prepared folder's ``<split>/part-<k>.ids.npy``, a metric ``val_auc/like``) is relative to a
  folder its sentence names, and is not checked either.
- **Modules.** A dotted name of this project (``recsys.runtime.env_check``,
  ``recsys.data.dataset.resolve``) names a module, or a name a module defines.
- **The layout.** ``docs/architecture.md``'s Layout block names every module under
  ``recsys/``: each ``.py`` file but ``__init__.py`` by its file name in its folder's entry (the
  folder's own line and the lines of the files listed under it). Every ``.py``, ``.sh`` or
  ``.yaml`` name an entry gives is a file of that folder.
- **Skipped tests.** A test that ``./run.sh test`` skips (marked ``extended`` or ``clusters``)
  is cited with that word beside it (before the next test cited), so that no page says a skipped
  test runs in CI.
- **A manual, not a log.** The prose holds no dates and no issue numbers.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import glob
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from tests.docs_pages import PAGES, ROOT, blocks, prose, rel, spans

# what the commands create at the project's root (not committed, so not checked): the sweeps'
# storage, exports, prepared data, the default MLflow store and artifacts, the venvs
OUTPUTS = ("runs", "exports", "data", "mlflow.db", "mlartifacts", ".venv", ".venv-*")
WORD = re.compile(r"(?:\{[^{}\s]*\}|[^\s'\"=,;(){}])+")  # a {a,b} part kept whole
PLACEHOLDER = re.compile(r"<[^>/]*>|\.\.\.|^[A-Z][A-Z_]*$")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SKIPPED = ("extended", "clusters")  # markers ./run.sh test skips
LOGGED = re.compile(
    r"\b20\d\d-\d\d(?:-\d\d)?\b|\b[Ii]ssues? #?\d+|(?<![\w/])#\d+\b"
)  # dates, issues


@dataclass(frozen=True)
class Word:
    """A word of a page's code: where it is, and the scope it sits in (``::test_z`` after a
    file takes the file of the same scope)."""

    where: str
    text: str
    scope: str


def words(page: str, text: str) -> list[Word]:
    """The words of the page's code blocks (a scope per line; of a Python block, only its
    imports: its strings are the example's own) and of its inline spans."""
    out = []
    for block in blocks(text):
        for n, line in block.lines:
            if block.lang == "python" and not re.match(r"\s*(?:from|import)\s", line):
                continue
            out += [Word(f"{page}:{n}", m[0], f"{page}:{n}") for m in WORD.finditer(line)]
    for s in spans(text):
        out += [Word(f"{page}:{s.line}", m[0], f"{page}#{s.scope}") for m in WORD.finditer(s.text)]
    return out


# --- paths ---------------------------------------------------------------------------------------


def path_problems(page: str, text: str, root: Path = ROOT) -> list[str]:
    """The paths of a page that name nothing in the checkout ``root``, one line each."""
    base = (root / page).parent
    out, last = [], {}  # by scope: the last test file cited
    for word in words(page, text):
        value = word.text.rstrip(".:`*,")
        if value.startswith("::") and word.scope in last:
            out += node_problems(word.where, last[word.scope], value[2:], root)
            continue
        path, _, node = value.removeprefix("./").partition("::")
        if not path or "://" in value or path.startswith(("/", "~", "$", "[")):
            continue
        first = path.split("/")[0]
        if any(fnmatch.fnmatch(first, o) for o in OUTPUTS):
            continue
        if value.startswith("./") or ("/" in path and exists_at(root, first)):
            where = root
        elif "/" in path and page.startswith("tests/") and exists_at(base, first):
            where = base
        else:
            continue
        found = []
        for alt in alternatives(path):
            hits = matching(where, alt)
            found += hits
            if not hits:
                out.append(f"{word.where}: {alt} does not exist")
        if node and len(found) == 1:
            last[word.scope] = found[0]
            out += node_problems(word.where, found[0], node, root)
    return out


def exists_at(folder: Path, name: str) -> bool:
    return not PLACEHOLDER.search(name) and "*" not in name and (folder / name).exists()


def alternatives(path: str) -> list[str]:
    """A path with ``{a,b}`` parts as each path it names."""
    parts = re.split(r"(\{[^{}]*\})", path)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def matching(folder: Path, path: str) -> list[Path]:
    """The files under ``folder`` that ``path`` names, its placeholders matching any name."""
    parts = [p for p in path.split("/") if p]
    pattern = "/".join(PLACEHOLDER.sub("*", p) if PLACEHOLDER.search(p) else p for p in parts)
    pattern = re.sub(r"\[([^\]]*)\]", lambda m: glob.escape(m[0]), pattern)  # brackets: literal
    return [folder / p for p in glob.glob(pattern, root_dir=folder)]


def node_problems(where: str, file: Path, node: str, root: Path) -> list[str]:
    """A test node id (``Class::test_x[case]``) that names no ``def`` or ``class`` of ``file``."""
    name = re.sub(r"\[.*$", "", node.split("::")[-1])
    if not name or not file.is_file() or file.suffix != ".py":
        return []
    defined = {n.name for n in ast.walk(ast.parse(file.read_text())) if hasattr(n, "name")}
    if name in defined:
        return []
    return [f"{where}: {file.relative_to(root).as_posix()} has no {name}"]


def module_problems(page: str, text: str, root: Path = ROOT) -> list[str]:
    """Dotted names of this project (``recsys.x.y[.name]``) that name no module, no name a
    module defines and no MLflow tag the code writes (``Tag``: ``recsys.status``, ...)."""
    out = []
    for word in words(page, text):
        m = re.match(r"(?:recsys|benchmarks)(?:\.\w+)+", word.text)
        if m and m[0] not in tags(root) and not dotted_exists(m[0], root):
            out.append(f"{word.where}: {m[0]} names no module, name of one or MLflow tag")
    return out


@functools.cache
def tags(root: Path) -> set[str]:
    """The MLflow tag names the code writes: the values of ``recsys.tracking.tags.Tag``."""
    path = root / "recsys" / "tracking" / "tags.py"
    if not path.is_file():
        return set()
    tag = next(n for n in ast.parse(path.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "Tag")  # fmt: skip
    return {n.value.value for n in tag.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}  # fmt: skip


def dotted_exists(name: str, root: Path) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module, rest = root.joinpath(*parts[:i]), parts[i:]
        if module.with_suffix(".py").is_file():
            return not rest or rest[0] in defined_names(module.with_suffix(".py"))
        if module.is_dir():
            init = module / "__init__.py"
            return not rest or (init.is_file() and rest[0] in defined_names(init))
    return False


@functools.cache
def defined_names(file: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    out: set[str] = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


# --- the layout ----------------------------------------------------------------------------------


def layout_entries(text: str) -> dict[str, str]:
    """The Layout block of docs/architecture.md as ``{folder: its entry's text}``: a folder's own
    line and its continuations, and the lines of the files listed under it (``recsys/data/``
    holds ``schema.py ...``; ``recsys/data/prepared/`` is an entry of its own)."""
    section = text[text.index("## Layout") :]
    block = next(b for b in blocks(section))
    entries: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder) of the open entries
    folder = ""
    for _, line in block.lines:
        indent = len(line) - len(line.lstrip())
        m = re.match(r"([\w.-]+/?)(?:\s|$)", line[indent:])
        if indent < 10 and m:  # an entry (a continuation is indented to the text column)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            name = m[1]
            if name.endswith("/"):
                folder = parent + name
                stack.append((indent, folder))
                entries[folder] = line[indent + len(name) :]
                continue
            folder = parent
            line = line[indent:]
        entries[folder] = entries.get(folder, "") + " " + line.strip()
    return entries


def layout_problems(text: str, root: Path = ROOT) -> list[str]:
    """Modules under ``recsys/`` that the layout does not name in their folder's entry, and
    files an entry names that its folder does not hold."""
    entries = layout_entries(text)
    out = []
    for path in sorted((root / "recsys").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        folder = path.parent.relative_to(root).as_posix() + "/"
        if folder not in entries:
            out.append(f"{folder}: no entry in the layout (it holds {path.name})")
        elif not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", entries[folder]):
            out.append(f"{folder}{path.name}: not named in the layout's {folder} entry")
    for folder, entry in entries.items():
        for name in re.findall(r"(?<![\w./])([\w-]+\.(?:py|sh|yaml))\b", entry):
            if not (root / folder / name).is_file():
                out.append(f"{folder}: the layout names {name}, which is not in {folder}")
    return out


# --- skipped tests cited -------------------------------------------------------------------------


@functools.cache
def skipped_tests(root: Path = ROOT) -> dict[str, str]:
    """Tests that ``./run.sh test`` skips: ``{"tests/x.py::test_y" or "tests/x.py": marker}``
    (a whole file where its ``pytestmark`` has the marker)."""
    out = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        name = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
            ):
                for marker in SKIPPED:
                    if f"mark.{marker}" in ast.unparse(node.value):
                        out[name] = marker
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    for marker in SKIPPED:
                        if ast.unparse(d).endswith(f"mark.{marker}"):
                            out[f"{name}::{node.name}"] = marker
    return out


def skipped_problems(page: str, text: str, skipped: dict[str, str] | None = None) -> list[str]:
    """Tests of ``skipped`` that the page's prose cites without their marker's word before the
    next test it cites (in the same paragraph, list item or table row)."""
    skipped = skipped_tests() if skipped is None else skipped
    out = []
    lines = prose(text).splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cited = list(re.finditer(r"`(tests/[\w/]+\.py)(?:::(\w+))?[^`]*`|`::(\w+)[^`]*`", line))
        file = ""
        for i, m in enumerate(cited):
            file = m[1] or file
            key = f"{file}::{m[2] or m[3]}" if (m[2] or m[3]) else file
            marker = skipped.get(key) or skipped.get(file)
            if marker is None:
                continue
            after = line[m.end() : cited[i + 1].start() if i + 1 < len(cited) else len(line)]
            if marker not in after:
                out.append(f"{page}:{n}: {key} is `{marker}` (./run.sh test skips it): say so")
    return out


# --- a manual, not a log -------------------------------------------------------------------------


def log_problems(page: str, text: str) -> list[str]:
    """Dates and issue numbers in the page's prose (code blocks may hold example data)."""
    out = []
    for n, line in enumerate(prose(text).splitlines(), 1):
        for m in LOGGED.finditer(line):
            out.append(f"{page}:{n}: {m[0]!r}: the manual says what is, not when or which issue")
    return out


# --- the tests -----------------------------------------------------------------------------------


def test_every_path_and_module_the_manual_names_exists():
    problems = []
    for page in PAGES:
        text = page.read_text()
        problems += path_problems(rel(page), text) + module_problems(rel(page), text)
    assert not problems, "\n".join(problems)


def test_the_layout_names_every_module():
    problems = layout_problems(ARCHITECTURE.read_text())
    assert not problems, "docs/architecture.md, Layout:\n" + "\n".join(problems)


def test_a_test_the_suite_skips_is_cited_as_such():
    problems = [p for page in PAGES for p in skipped_problems(rel(page), page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_manual_holds_no_dates_or_issue_numbers():
    problems = [p for page in PAGES for p in log_problems(rel(page), page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_they_should():
    """Each check has something to read on the real pages (a reader that found nothing would
    pass): paths, node ids, dotted modules, layout entries and skipped tests."""
    found = [w.text for page in PAGES for w in words(rel(page), page.read_text())]
    assert sum(w.startswith("recsys/") for w in found) > 50
    assert sum("::test_" in w for w in found) > 20
    assert sum(w.startswith("recsys.") for w in found) > 5
    assert {"recsys/", "recsys/data/prepared/", "recsys/runtime/", "tests/"} <= set(
        layout_entries(ARCHITECTURE.read_text())
    )
    assert len(skipped_tests()) >= 5


def test_a_wrong_path_node_and_module_are_reported(tmp_path: Path):
    (tmp_path / "recsys" / "tune").mkdir(parents=True)
    (tmp_path / "recsys" / "tune" / "sweep.py").write_text("def launch():\n    pass\n")
    (tmp_path / "recsys" / "tracking").mkdir()
    (tmp_path / "recsys" / "tracking" / "tags.py").write_text(
        'class Tag:\n    STATUS = "recsys.status"\n'
    )
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "default.yaml").write_text("")
    (tmp_path / "run.sh").write_text("")
    page = (
        "Read `recsys/tune/sweep.py`, `recsys/tune/nope.py` and `./run.sh`.\n"  # 1
        "A space: `search_spaces/<name>.yaml`; none: `schemas/<name>.yaml`.\n"  # 2
        "`tests/unit/test_a.py::test_b[x]`, `::test_c`; `tests/unit/test_a.py::test_d`.\n"  # 3
        "Outputs: `runs/<sweep>/export/model.pt`, `exports/x`; elsewhere: `export/model.pt`.\n"
        "`recsys.tune.sweep.launch`, `recsys.tune.sweep.land`, `recsys.tune.nope`, "  # 5
        "the tag `recsys.status`.\n"
        "`recsys/{tune,train}/sweep.py`\n"  # 6
        "```bash\n"
        "bash scripts/no_such.sh && cat recsys/tune/sweep.py\n"  # 8
        "```\n"
    )
    said = "\n".join(path_problems("docs/fake.md", page, tmp_path) +
                     module_problems("docs/fake.md", page, tmp_path))  # fmt: skip
    assert "docs/fake.md:1: recsys/tune/nope.py does not exist" in said
    assert "docs/fake.md:2: schemas/<name>.yaml does not exist" not in said  # no schemas/ here
    assert "docs/fake.md:3: tests/unit/test_a.py has no test_c" in said
    assert "docs/fake.md:3: tests/unit/test_a.py has no test_d" in said
    assert "docs/fake.md:5: recsys.tune.sweep.land names no module" in said
    assert "docs/fake.md:5: recsys.tune.nope names no module" in said
    assert "recsys.status" not in said  # an MLflow tag the code writes (Tag)
    assert "docs/fake.md:6: recsys/train/sweep.py does not exist" in said
    assert "docs/fake.md:8: scripts/no_such.sh" not in said  # no scripts/ in this checkout
    assert len(said.splitlines()) == 6, said
    (tmp_path / "scripts").mkdir()
    said = "\n".join(path_problems("docs/fake.md", page, tmp_path))
    assert "docs/fake.md:8: scripts/no_such.sh does not exist" in said


def test_a_path_relative_to_tests_is_checked_on_tests_readme(tmp_path: Path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text("")
    page = "`unit/test_a.py`, `unit/test_gone.py`\n"
    assert path_problems("tests/README.md", page, tmp_path) == [
        "tests/README.md:1: unit/test_gone.py does not exist"
    ]
    assert path_problems("docs/x.md", page, tmp_path) == []  # relative to a folder it names


def test_a_module_left_out_of_the_layout_is_reported(tmp_path: Path):
    for name in ["config.py", "data/schema.py", "data/prepared/meta.py", "data/prepared/folder.py",
                 "data/__init__.py", "serving/export.py"]:  # fmt: skip
        (tmp_path / "recsys" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "recsys" / name).write_text("")
    page = (
        "## Layout\n"
        "\n"
        "```\n"
        "recsys/            the library\n"
        "  config.py        typed configs\n"
        "  data/            schema.py (the schema), columns.py: the rows;\n"
        "                   folder.py is named here, in data/, not in prepared/\n"
        "    prepared/      meta.py: its meta.json\n"
        "tests/             unit\n"
        "```\n"
    )
    entries = layout_entries(page)
    assert entries["recsys/data/prepared/"].split() == ["meta.py:", "its", "meta.json"]
    assert "config.py" in entries["recsys/"] and "schema.py" not in entries["recsys/"]
    assert layout_problems(page, tmp_path) == [
        "recsys/data/prepared/folder.py: not named in the layout's recsys/data/prepared/ entry",
        "recsys/serving/: no entry in the layout (it holds export.py)",
        "recsys/data/: the layout names columns.py, which is not in recsys/data/",
        "recsys/data/: the layout names folder.py, which is not in recsys/data/",
    ]


def test_a_skipped_test_cited_as_running_is_reported():
    skipped = {"tests/ray/test_a.py::test_slow": "extended", "tests/ray/test_jobs.py": "clusters"}
    page = (
        "| row | runs | `tests/ray/test_a.py::test_slow` (a long one) |\n"
        "| row | runs | `tests/ray/test_a.py::test_slow` (`extended`), `::test_fast` |\n"
        "| row | runs | `tests/ray/test_a.py::test_fast`, `::test_slow` |\n"
        "| row | has run | `tests/ray/test_jobs.py` (not in CI: `./run.sh test-clusters`) |\n"
        "| row | runs | `tests/ray/test_jobs.py::test_x`: a job |\n"
    )
    assert skipped_problems("fake.md", page, skipped) == [
        "fake.md:1: tests/ray/test_a.py::test_slow is `extended` (./run.sh test skips it): say so",
        "fake.md:3: tests/ray/test_a.py::test_slow is `extended` (./run.sh test skips it): say so",
        "fake.md:5: tests/ray/test_jobs.py::test_x is `clusters` (./run.sh test skips it): say so",
    ]


def test_dates_and_issue_numbers_are_reported():
    page = (
        "Fixed in issue 61 (#61), measured 2026-01-15.\n"
        "[a link](x.md#section-2) and KDD 2020 are fine.\n"
        "```python\n"
        'pd.to_datetime(["2026-01-15 19:30"])\n'
        "```\n"
    )
    said = log_problems("fake.md", page)
    assert [p.split(": ")[1] for p in said] == ["'issue 61'", "'#61'", "'2026-01-15'"], said
