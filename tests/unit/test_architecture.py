"""The architecture as executable rules, read from the source (imports at any level count)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recsys"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module of ``package`` -> the modules of ``package`` it imports (a module's own parent
    packages, which Python initialises first, are not edges)."""
    files = {module_name(p): p for p in package.rglob("*.py")}
    return {
        m: {i for i in imports_of(p) if i in files and i != m and not m.startswith(i + ".")}
        for m, p in files.items()
    }


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_the_recsys_module_graph_has_no_cycle():
    edges = graph()
    assert (
        "recsys.serving.export" in edges
        and "recsys.serving.scorer" in edges["recsys.serving.export"]
    )
    assert find_cycle(edges) == [], " -> ".join(find_cycle(edges))


def test_a_cycle_would_be_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_benchmarks_have_no_import_cycle():
    """What benchmarks share lives in modules they import (``benchmarks/common.py``,
    ``benchmarks/logs.py``), never in one another."""
    edges = graph(ROOT / "benchmarks")
    assert "benchmarks.logs" in edges["benchmarks.drift"]
    assert find_cycle(edges) == [], " -> ".join(find_cycle(edges))


def test_model_code_imports_neither_ray_nor_torch_distributed():
    for path in (PACKAGE / "models").rglob("*.py"):
        bad = {i for i in imports_of(path) if i.split(".")[0] == "ray" or "torch.distributed" in i}
        assert not bad, f"{path.name} imports {bad}"


def imported_test_files(tree: ast.AST, package: str) -> set[str]:
    """The ``tests.*.test_*`` modules a source imports, however it names them (``import
    tests.x.test_y``, ``from tests.x import test_y``, ``from tests.x.test_y import f``, ``from
    .test_y import f``; ``package``: the source's own package, for the relative forms)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        for name in names:
            parts = name.split(".")
            hits = [i for i, p in enumerate(parts) if i > 0 and p.startswith("test_")]
            if parts[0] == "tests" and hits:
                found.add(".".join(parts[: hits[0] + 1]))
    return found


def test_no_test_file_imports_another():
    """Shared test code lives in helper modules (``tests/helpers.py``, the ``conftest.py`` files,
    ``tests/distributed/common.py``, ...), never in a test file: a test file imported by another
    runs its module-level code (markers, pickling registrations) twice and ties the two together."""
    bad = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if found := imported_test_files(ast.parse(path.read_text()), package):
            bad[str(path.relative_to(ROOT))] = sorted(found)
    assert bad == {}, f"imports of test files (move what they share to a helper): {bad}"


def test_an_import_of_a_test_file_would_be_found():
    source = (
        "import tests.ray.test_trainer\n"
        "from tests.distributed import test_export, common\n"
        "def f():\n    from tests.unit.test_space import write\n"
        "from .test_resume import check\n"
        "from tests.distributed.common import tiny_config\n"
        "from tests import helpers, conftest\n"
    )
    assert imported_test_files(ast.parse(source), "tests.distributed") == {
        "tests.ray.test_trainer",
        "tests.distributed.test_export",
        "tests.unit.test_space",
        "tests.distributed.test_resume",
    }


def test_the_library_does_not_import_the_benchmarks():
    for path in PACKAGE.rglob("*.py"):
        assert not {i for i in imports_of(path) if i.startswith("benchmarks")}, path


def test_clis_need_no_sys_path_edits():
    for folder in ("experiments", "recsys"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "sys.path" not in path.read_text(), path
    assert os.path.isfile(ROOT / "recsys" / "config_registry.py")


def test_the_train_controllers_callback_imports_neither_torch_nor_mlflow():
    """Ray unpickles the report callbacks in every trial's Train controller: importing their
    module must stay cheap (torch, TorchRec and the planner cost ~5 s of CPU there, at trial
    start; MLflow and its SQL store about 2 s)."""
    heavy = ("torch", "torchrec", "mlflow")
    for module, banned in [
        ("recsys.tracking.report", (*heavy, "ray.tune")),  # a retrain's controller
        ("recsys.tracking.tune_reports", heavy),  # a sweep trial's controller
    ]:
        code = f"import sys, {module}; print(sorted(m for m in {banned!r} if m in sys.modules))"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "[]", (module, out.stdout)


def test_the_config_is_pure():
    """``recsys.config`` reads no file and imports no data module: a config is resolved against
    its data by ``recsys.data.dataset``, which the command-line tools call."""
    archs_imports = {i for i in imports_of(PACKAGE / "archs.py") if i.startswith("recsys")}
    assert archs_imports <= {"recsys.configlib"} | {
        f"recsys.configlib.{n}" for n in dir_of_configlib()
    }, archs_imports
    config = sorted((PACKAGE / "config").glob("*.py"))
    assert len(config) > 1, config  # the package, split by concern
    for path in [*config, PACKAGE / "configlib.py", PACKAGE / "archs.py"]:
        imports = imports_of(path)
        ours = {i for i in imports if i.startswith("recsys") and not i.startswith("recsys.config.")}
        allowed = {"recsys.configlib", "recsys.archs", "recsys"}  # ``from recsys import archs``
        assert ours <= allowed | {f"recsys.configlib.{n}" for n in dir_of_configlib()}, path
        assert not imports & {"os", "json", "yaml", "io", "pathlib"}, f"{path}: {imports}"
        assert "open(" not in path.read_text(), path


def dir_of_configlib() -> set[str]:
    tree = ast.parse((PACKAGE / "configlib.py").read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


# The rooms of ``recsys``, lowest floor first: what each holds (its packages and modules: a
# module is in the room holding the longest prefix of its name), its floor, and the rooms it may
# import. A room imports only rooms it names, each on a lower floor: no arrow up, no arrow
# sideways, no cycle. The package's own ``__init__`` (run before any room: it quiets FBGEMM's
# notice, ``recsys.runtime.stack``) is in none. docs/architecture.md's Layers table states the
# same (``test_the_layers_table_states_the_rooms``).


@dataclass(frozen=True)
class Room:
    floor: int
    holds: tuple[str, ...]  # the packages and modules it is made of
    may: frozenset[str]  # the rooms it may import


def room(floor: int, holds: str, may: str = "") -> Room:
    return Room(floor, tuple(holds.split()), frozenset(may.split()))


ROOMS = {
    "config": room(0, "recsys.config recsys.configlib recsys.config_registry recsys.archs"),
    "metrics": room(0, "recsys.metrics"),
    "runtime": room(1, "recsys.runtime", "config"),
    "models": room(1, "recsys.models", "config"),
    "demo": room(1, "recsys.demo", "metrics"),
    "data": room(2, "recsys.data", "config runtime metrics"),
    "prepare": room(3, "recsys.prepare", "config runtime data"),
    "distributed": room(3, "recsys.distributed", "config runtime data models"),
    "tracking": room(3, "recsys.tracking", "config runtime data"),
    "train": room(4, "recsys.train", "config runtime metrics data models distributed tracking"),
    "serving": room(4, "recsys.serving",
                    "config runtime metrics data prepare models distributed tracking"),
    "tune": room(5, "recsys.tune",
                 "config runtime metrics data models distributed tracking train serving"),
    "lifecycle": room(6, "recsys.lifecycle", "config runtime metrics data prepare models "
                      "distributed tracking train serving tune"),
    "cli": room(7, "recsys.cli", "config runtime metrics data prepare demo models distributed "
                "tracking train serving tune lifecycle"),
}  # fmt: skip
# The rooms inside ``recsys.data``, by the same rules (the package itself, and any module at its
# top, is the base every other reads).
DATA_ROOMS = {
    "data": room(0, "recsys.data"),
    "data.prepared": room(1, "recsys.data.prepared", "data"),
    "data.input": room(2, "recsys.data.input", "data data.prepared"),
    "data.dataset": room(3, "recsys.data.dataset", "data data.prepared data.input"),
}
ROOT_FILES = {"__init__.py", "configlib.py", "config_registry.py", "archs.py"}  # and config/
MAX_SHARE = 0.20  # of recsys's lines a room may hold


def room_of(module: str, rooms: dict[str, Room]) -> str | None:
    """The room holding ``module`` (the longest prefix of its name any room holds), or None."""
    found = [(len(p), name) for name, r in rooms.items() for p in r.holds
             if module == p or module.startswith(p + ".")]  # fmt: skip
    return max(found)[1] if found else None


def room_edges(edges: dict[str, set[str]], rooms: dict[str, Room]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import (modules in no room left out)."""
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        if (a := room_of(module, rooms)) is None:
            continue
        others = {b for t in targets if (b := room_of(t, rooms)) is not None and b != a}
        out.setdefault(a, set()).update(others)
    return out


def imports_between(
    edges: dict[str, set[str]], rooms: dict[str, Room], bad: Callable[[Room, Room, str], bool]
) -> list[str]:
    """Each import ``module -> target`` between two rooms for which ``bad(room, other, its
    name)``."""
    found = []
    for module, targets in sorted(edges.items()):
        a = room_of(module, rooms)
        for target in sorted(targets):
            b = room_of(target, rooms)
            if a is not None and b is not None and a != b and bad(rooms[a], rooms[b], b):
                found.append(f"{module} -> {target} ({a} -> {b})")
    return found


def arrows_up(edges: dict[str, set[str]], rooms: dict[str, Room]) -> list[str]:
    """The imports of a room from a room on its own floor or above."""
    return imports_between(edges, rooms, lambda a, b, _: b.floor >= a.floor)


def unnamed(edges: dict[str, set[str]], rooms: dict[str, Room]) -> list[str]:
    """The imports of a room from a room it does not name."""
    return imports_between(edges, rooms, lambda a, _, name: name not in a.may)


def rules_pointing_up(rooms: dict[str, Room]) -> list[str]:
    """A room's rule naming a room on its own floor or above (or no room at all)."""
    return [f"{name} may import {other}" for name, r in rooms.items() for other in sorted(r.may)
            if other not in rooms or rooms[other].floor >= r.floor]  # fmt: skip


def shares(lines: dict[str, int], rooms: dict[str, Room]) -> dict[str, float]:
    """Each room's share of the lines (``lines``: module -> its lines; modules in no room count
    in the whole)."""
    total = sum(lines.values())
    held: dict[str, int] = {}
    for module, n in lines.items():
        if (name := room_of(module, rooms)) is not None:
            held[name] = held.get(name, 0) + n
    return {name: n / total for name, n in held.items()}


def too_large(lines: dict[str, int], rooms: dict[str, Room]) -> list[str]:
    return [f"{name} holds {share:.1%} of the lines" for name, share in
            sorted(shares(lines, rooms).items()) if share > MAX_SHARE]  # fmt: skip


def homeless(modules: set[str], rooms: dict[str, Room]) -> list[str]:
    """The modules no room holds (the package's own ``__init__`` aside)."""
    return sorted(m for m in modules if m != "recsys" and room_of(m, rooms) is None)


def root_extras(names: set[str]) -> list[str]:
    """The files at the package root beside the config and the registries."""
    return sorted(names - ROOT_FILES)


def test_every_module_is_in_a_room():
    assert homeless(set(graph()), ROOMS) == [], "add the package to ROOMS, with its floor and rules"


def test_the_package_root_holds_only_the_config_and_the_registries():
    assert root_extras({p.name for p in PACKAGE.glob("*.py")}) == []


def test_every_rule_points_down():
    assert rules_pointing_up(ROOMS) == [] and rules_pointing_up(DATA_ROOMS) == []


def test_no_room_imports_a_room_above_it():
    edges = graph()
    assert {"recsys.runtime.shared_storage", "recsys.prepare.pipeline"} <= set(edges)
    assert arrows_up(edges, ROOMS) == []
    assert arrows_up(edges, DATA_ROOMS) == []


def test_each_room_imports_only_the_rooms_it_names():
    edges = graph()
    assert unnamed(edges, ROOMS) == []
    assert unnamed(edges, DATA_ROOMS) == []


def test_no_cycle_between_rooms():
    for rooms in (ROOMS, DATA_ROOMS):
        between = room_edges(graph(), rooms)
        assert find_cycle(between) == [], " -> ".join(find_cycle(between))


def test_no_room_holds_more_than_a_fifth_of_the_code():
    lines = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert set(shares(lines, ROOMS)) == set(ROOMS)
    assert too_large(lines, ROOMS) == []


def test_each_rule_would_catch_its_violation():
    """On made-up modules: an arrow up (the runtime reading a prepared folder's meta; inside
    data, a prepared folder reading the loader), an import of a room not named (serving reading
    train, on its own floor; prepare reading demo, below it), a cycle between rooms, a rule that
    points up, a room over a fifth, a module in no room, a loose file at the root."""
    edges = {
        "recsys.runtime.shared_storage": {"recsys.data.prepared.meta", "recsys.configlib"},
        "recsys.data.prepared.remote": {"recsys.data.input.loader", "recsys.data.columns"},
        "recsys.serving.export": {"recsys.train.trainer"},
        "recsys.prepare.pipeline": {"recsys.demo.planted", "recsys.data.schema"},
        "recsys.data.dataset": {"recsys.runtime.storage"},
    }
    assert arrows_up(edges, ROOMS) == [
        "recsys.runtime.shared_storage -> recsys.data.prepared.meta (runtime -> data)",
        "recsys.serving.export -> recsys.train.trainer (serving -> train)",
    ]
    assert arrows_up(edges, DATA_ROOMS) == [
        "recsys.data.prepared.remote -> recsys.data.input.loader (data.prepared -> data.input)"
    ]
    assert unnamed(edges, ROOMS) == [
        "recsys.prepare.pipeline -> recsys.demo.planted (prepare -> demo)",
        "recsys.runtime.shared_storage -> recsys.data.prepared.meta (runtime -> data)",
        "recsys.serving.export -> recsys.train.trainer (serving -> train)",
    ]
    assert find_cycle(room_edges(edges, ROOMS)) == ["data", "runtime", "data"]
    assert rules_pointing_up({"a": room(1, "x", "b c"), "b": room(1, "y"), "c": room(0, "z")}) == [
        "a may import b"
    ]
    lines = {"recsys.tune.sweep": 30, "recsys.train.trainer": 50, "recsys": 20}
    assert too_large(lines, ROOMS) == [
        "train holds 50.0% of the lines",
        "tune holds 30.0% of the lines",
    ]
    assert homeless({"recsys", "recsys.nowhere.retrain", "recsys.tune.sweep"}, ROOMS) == [
        "recsys.nowhere.retrain"
    ]
    assert root_extras({"__init__.py", "archs.py", "export.py"}) == ["export.py"]


def layers_table(text: str) -> dict[str, tuple[int, set[str]]]:
    """docs/architecture.md's Layers table: each room's floor and the rooms it may import."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| --")]  # fmt: skip
    header, body = [c.strip() for c in rows[0]], rows[1:]
    floor, name, may = header.index("floor"), header.index("room"), header.index("may import")
    out = {}
    for cells in body:
        names = {w.strip("` ") for w in cells[may].split(",")} - {"nothing", ""}
        out[cells[name].strip("` ")] = (int(cells[floor]), names)
    return out


def test_the_layers_table_states_the_rooms():
    stated = layers_table((ROOT / "docs" / "architecture.md").read_text())
    assert stated == {name: (r.floor, set(r.may)) for name, r in ROOMS.items()}


def test_a_layers_table_that_differs_would_be_found():
    page = "\n".join([
        "## Layers", "",
        "| floor | room | package | what it holds | may import |",
        "| --- | --- | --- | --- | --- |",
        "| 0 | config | `recsys/config/` | configs | nothing |",
        "| 1 | runtime | `recsys/runtime/` | Ray | config, data |", "",
        "## Next", "| 9 | x | y | z | w |",
    ])  # fmt: skip
    assert layers_table(page) == {"config": (0, set()), "runtime": (1, {"config", "data"})}


def test_argument_parsers_live_in_the_cli():
    """The command-line modules are ``recsys/cli/``; the library parses no arguments."""
    for path in PACKAGE.rglob("*.py"):
        if "cli" not in path.relative_to(PACKAGE).parts and path.name != "configuration_page.py":
            assert "argparse" not in imports_of(path), path


def code_strings(path: Path) -> set[str]:
    """The string constants of ``path``'s code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }  # fmt: skip
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    }


def test_a_prepared_folders_meta_json_is_opened_by_its_owner_only():
    """``recsys.data.prepared.meta`` reads and writes a prepared folder's ``meta.json``; the
    only other ``meta.json`` is the export's own (``serving.META_FILE``), a different file."""
    named = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "meta.json" in code_strings(p)
    )
    assert named == ["data/prepared/meta.py", "serving/scorer.py"]
    users_of_the_name = sorted(
        module_name(p) for p in PACKAGE.rglob("*.py")
        if "recsys.data.prepared.meta.META" in imports_of(p)
    )  # fmt: skip
    assert all(m.startswith("recsys.data.prepared.") for m in users_of_the_name), users_of_the_name
