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
