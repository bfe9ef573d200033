"""The configuration reference (``docs/configuration.md``) is generated from the code and kept in
step with it: the page equals ``render()``, every config and schema field is described, every
``RECSYS_*`` variable the project reads is described (and none that it no longer reads), and the
shipped example experiment file loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from recsys.cli import configuration_page as reference
from recsys.config import ExperimentConfig
from recsys.config_registry import from_file
from recsys.data.schema import DatasetSchema

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "experiments" / "example.yaml"


def test_the_page_is_up_to_date():
    stale = reference.check(PAGE)
    assert stale is None, stale


@pytest.mark.parametrize("root", [ExperimentConfig, DatasetSchema], ids=lambda c: c.__name__)
def test_every_field_has_a_description(root: type):
    missing = reference.missing_descriptions(root)
    assert not missing, (
        f"{root.__name__}: fields without a description (add them to their class docstring's "
        f"`Attributes:` section, then run `{reference.COMMAND}`): {missing}"
    )


@pytest.mark.parametrize("root", [ExperimentConfig, DatasetSchema], ids=lambda c: c.__name__)
def test_docstrings_describe_no_missing_field(root: type):
    assert not reference.unknown_attributes(root), "Attributes: entries naming no field"


def test_every_config_key_is_in_the_reference():
    rows = {r.key for s in reference.sections(ExperimentConfig) for r in s.rows}
    assert set(ExperimentConfig.all_keys()) <= rows


def test_every_environment_variable_is_described():
    used = set(reference.env_vars_in_code())
    described = set(reference.ENV_VARS)
    assert not used - described, (
        f"RECSYS_* variables read but not described in recsys/cli/configuration_page.py ENV_VARS: "
        f"{sorted(used - described)}"
    )
    assert not described - used, (
        f"described in recsys/cli/configuration_page.py ENV_VARS but read nowhere: "
        f"{sorted(described - used)}"
    )


def test_test_only_variables_are_listed_apart():
    for name, (group, _) in reference.ENV_VARS.items():
        assert group in reference.ENV_GROUPS, name
        if name.startswith("RECSYS_TEST_"):
            assert group == reference.TESTS, f"{name}: list it under TESTS (for the test suite)"


def test_every_search_space_key_has_a_meaning():
    keys = reference.space_keys()
    assert all(meaning for _, meaning in keys.values()), keys


def test_every_command_line_tool_is_covered():
    page = reference.render()
    for prog, target in reference.entry_points().items():
        parser = reference.parser_of(target)
        assert f"### `{prog}`" in page
        for action in parser._actions:
            for flag in action.option_strings:
                assert f"`{flag}" in page or flag in ("-h", "--help"), (prog, flag)


def test_a_machine_dependent_default_is_not_rendered():
    import os

    page = reference.render()
    row = next(line for line in page.splitlines() if line.startswith("| `--workers"))
    assert f"`{os.cpu_count()}`" not in row


def test_the_check_command_fails_on_a_stale_page(tmp_path: Path):
    page = tmp_path / "configuration.md"
    page.write_text(reference.render().replace("Configuration reference", "Old reference"))
    stale = reference.check(page)
    assert stale is not None and reference.COMMAND in stale and "Old reference" in stale
    page.write_text(reference.render())
    assert reference.check(page) is None


def test_the_example_experiment_loads():
    cfg = from_file(str(EXAMPLE))
    assert cfg.data.source == "prepared"
    assert cfg.data.paths == ["data/clicklogs"]
    assert cfg.model.arch == "dlrm"


def test_every_relative_link_of_the_docs_resolves():
    """Links between README.md, docs/ and BENCHMARKS.md point at files (and headings) that
    exist."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").glob("*.md"))]
    bad = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    import re

    out = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out
