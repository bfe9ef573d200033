"""Shared test helpers: tiny seeded inputs; a data cache of the session's own; GPU test skips."""

from __future__ import annotations

import os

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests are skipped, not failed, where there are fewer GPUs than they need."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        marker = item.get_closest_marker("gpu")
        need = marker.kwargs.get("gpus", 1) if marker is not None else 0
        if have < need:
            reason = f"needs {need} GPU(s), this machine has {have} (./run.sh gpu-check)"
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True, scope="session")
def _own_data_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Criteo text converted for training goes to this session's folder, not ~/.cache (spawned
    ranks and Ray workers inherit the variable)."""
    os.environ["RECSYS_CACHE"] = str(tmp_path_factory.mktemp("recsys-cache"))


def make_kjt(
    keys: list[str], rows: list[int], batch: int, hot: int = 1, seed: int = 0
) -> KeyedJaggedTensor:
    """A KJT of ``batch`` samples, ``1..hot`` ids per bag, ids in ``[0, rows_f)``, key-major."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, hot + 1, (len(keys), batch), generator=g)
    values = [
        torch.randint(0, r, (int(lengths[i].sum()),), generator=g) for i, r in enumerate(rows)
    ]
    return KeyedJaggedTensor(
        keys=keys, values=torch.cat(values), lengths=lengths.flatten(), stride=batch
    )


SCHEMA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schemas", "clicklogs.yaml")


def write_demo(folder: str, rows: int = 6000, files: int = 3, seed: int = 0) -> list[str]:
    """The demo click log at test size (smaller id spaces, so ids repeat)."""
    from recsys.data.clicklogs import Shape, write

    shape = Shape(users=400, items=300, countries=20, tags=50, mean_history=6.0, max_history=60)
    return write(folder, rows, files, seed, shape)


@pytest.fixture(scope="session")
def demo_prepared(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo click log prepared with ``schemas/clicklogs.yaml`` (once per session); its
    raw files are in ``<folder>/../raw``."""
    from recsys.data.prepare import prepare
    from recsys.data.schema import DatasetSchema

    root = tmp_path_factory.mktemp("demo")
    write_demo(str(root / "raw"))
    out = str(root / "prepared")
    prepare(DatasetSchema.load(SCHEMA), [str(root / "raw")], out, workers=2, log=lambda s: None)
    return out
