"""Shared test helpers: tiny seeded inputs."""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


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
