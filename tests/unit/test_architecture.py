"""The architecture as executable rules, read from the source (imports at any level count)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
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


def graph() -> dict[str, set[str]]:
    """recsys module -> the recsys modules it imports (a module's own parent packages, which
    Python initialises first, are not edges)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
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
    """Ray unpickles the MLflow callback in every trial's Train controller: importing its module
    must stay cheap (torch, TorchRec and the planner cost ~5 s of CPU there, at trial start)."""
    code = (
        "import sys, recsys.tracking.report; "
        "print(sorted(m for m in ('torch', 'torchrec', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_config_is_pure():
    """``recsys.config`` reads no file and imports no data module: a config is resolved against
    its data by ``recsys.data.dataset``, which the command-line tools call."""
    archs_imports = {i for i in imports_of(PACKAGE / "archs.py") if i.startswith("recsys")}
    assert archs_imports <= {"recsys.configlib"} | {
        f"recsys.configlib.{n}" for n in dir_of_configlib()
    }, archs_imports
    for name in ("config.py", "configlib.py", "archs.py"):
        imports = imports_of(PACKAGE / name)
        ours = {i for i in imports if i.startswith("recsys")}
        allowed = {"recsys.configlib", "recsys.archs", "recsys"}  # ``from recsys import archs``
        assert ours <= allowed | {f"recsys.configlib.{n}" for n in dir_of_configlib()}
        assert not imports & {"os", "json", "yaml", "io", "pathlib"}, f"{name}: {imports}"
        assert "open(" not in (PACKAGE / name).read_text(), name


def dir_of_configlib() -> set[str]:
    tree = ast.parse((PACKAGE / "configlib.py").read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


# The rooms of ``recsys.data``, lowest first: a module imports only from its own room and the
# rooms below it. ``recsys.metrics.binary`` sits below ``data`` and ``train`` both.
DATA_ROOMS = [
    (
        "recsys.data",
        (
            "recsys.data.errors",
            "recsys.data.schema",
            "recsys.data.schema_columns",
            "recsys.data.columns",
            "recsys.data.dense",
            "recsys.data",
        ),
    ),
    ("recsys.data.prepared", ("recsys.data.prepared",)),
    ("recsys.prepare", ("recsys.prepare",)),
    ("recsys.data.input", ("recsys.data.input",)),
    ("recsys.demo", ("recsys.demo",)),
    ("recsys.data.dataset", ("recsys.data.dataset",)),
]
DATA_MAY_USE = {"recsys.config", "recsys.configlib", "recsys.runtime", "recsys.runtime.storage",
                "recsys.metrics.binary", "recsys.runtime.cluster",
                "recsys.runtime.shared_storage"}  # fmt: skip
ALLOWED_ABOVE = {  # room -> the rooms above the base that it may read (besides itself)
    "recsys.data": set(),
    "recsys.data.prepared": set(),
    "recsys.prepare": {"recsys.data.prepared"},
    "recsys.data.input": {"recsys.data.prepared"},
    "recsys.demo": set(),
    "recsys.data.dataset": {"recsys.data.prepared", "recsys.data.input"},
}


def data_room(module: str) -> str | None:
    for room, prefixes in reversed(DATA_ROOMS):
        if room != "recsys.data" and any(module == p or module.startswith(p + ".")
                                         for p in prefixes):  # fmt: skip
            return room
    if module in DATA_ROOMS[0][1]:
        return "recsys.data"
    return None


def data_arrows_up(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a ``recsys.data`` module that leaves its room for one it may not read
    (a room above it, or outside ``data`` apart from ``DATA_MAY_USE``)."""
    bad = []
    for module, targets in sorted(edges.items()):
        room = data_room(module)
        if room is None:
            continue
        for target in sorted(targets):
            other = data_room(target)
            if other is None:
                ok = target in DATA_MAY_USE or target.rpartition(".")[0] in DATA_MAY_USE
            else:
                ok = other in (room, "recsys.data") or other in ALLOWED_ABOVE[room]
            if not ok:
                bad.append(f"{module} -> {target}")
    return bad


def test_data_rooms_import_nothing_above_them():
    edges = graph()
    assert {"recsys.prepare.pipeline", "recsys.data.input.loader"} <= set(edges)
    assert data_arrows_up(edges) == []


def test_an_arrow_up_in_data_would_be_found():
    edges = {
        "recsys.data.prepared.remote": {"recsys.data.input.loader", "recsys.data.columns"},
        "recsys.demo.planted": {"recsys.train.metrics"},
        "recsys.data.input.loader": {"recsys.data.prepared.folder", "recsys.prepare.encode"},
    }
    assert data_arrows_up(edges) == [
        "recsys.data.input.loader -> recsys.prepare.encode",
        "recsys.data.prepared.remote -> recsys.data.input.loader",
        "recsys.demo.planted -> recsys.train.metrics",
    ]


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
