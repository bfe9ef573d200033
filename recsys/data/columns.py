"""The in-memory (or memory-mapped) form every source reduces to, and the splits.

Shapes: ``N`` rows, ``I`` dense features, ``F`` sparse features, ``H`` ids per bag, ``L`` labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys.config import DataConfig


class DataError(ValueError):
    """Input data is missing or malformed; the message names the file (and line) at fault."""


@dataclass(frozen=True)
class Columns:
    """Rows of a click log as arrays.

    Attributes:
        dense: ``[N, I]`` float32, already transformed (``log(1 + max(x, 0))``, missing -> 0).
        sparse: ``[N, F, H]`` unsigned/signed ints: raw ids or hashes; mapped to table rows by
            modulo at batch time, so one preprocessed file serves every table size.
        labels: ``[N, L]`` in {0, 1}.
        source: where the rows came from, for error messages.
    """

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    source: str = "<memory>"

    def __post_init__(self) -> None:
        n = len(self.dense)
        if self.dense.ndim != 2 or self.sparse.ndim != 3 or self.labels.ndim != 2:
            raise DataError(
                f"{self.source}: expected dense [N, I], sparse [N, F, H], labels [N, L]; got "
                f"{self.dense.shape}, {self.sparse.shape}, {self.labels.shape}"
            )
        if len(self.sparse) != n or len(self.labels) != n:
            raise DataError(
                f"{self.source}: row counts differ: dense {n}, sparse {len(self.sparse)}, "
                f"labels {len(self.labels)}"
            )

    def __len__(self) -> int:
        return len(self.dense)

    @property
    def num_dense(self) -> int:
        return int(self.dense.shape[1])

    @property
    def num_sparse(self) -> int:
        return int(self.sparse.shape[1])

    def rows(self, start: int, stop: int) -> Columns:
        return Columns(
            self.dense[start:stop], self.sparse[start:stop], self.labels[start:stop], self.source
        )

    def take(self, idx: np.ndarray) -> Columns:
        return Columns(self.dense[idx], self.sparse[idx], self.labels[idx], self.source)


def concat(parts: list[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    return Columns(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.sparse for p in parts]),
        np.concatenate([p.labels for p in parts]),
        ", ".join(p.source for p in parts),
    )


@dataclass(frozen=True)
class Splits:
    train: Columns
    val: Columns
    test: Columns


def split(parts: list[Columns], cfg: DataConfig) -> Splits:
    """Train / validation / test, in time order (Criteo files are time-ordered).

    ``fraction``: all rows in file order, cut at ``1 - val - test`` and ``1 - test``.
    ``files``: the last file is test, the one before it validation, the rest training
    (Criteo Terabyte: days 0-21 train, day 22 validation, day 23 test).
    """
    if cfg.split == "files":
        if len(parts) < 3:
            raise DataError(f"data.split=files needs >= 3 files, got {len(parts)}")
        out = Splits(concat(parts[:-2]), parts[-2], parts[-1])
    else:
        rows = concat(parts)
        n = len(rows)
        n_test = round(n * cfg.test_fraction)
        n_val = round(n * cfg.val_fraction)
        n_train = n - n_val - n_test
        out = Splits(
            rows.rows(0, n_train),
            rows.rows(n_train, n_train + n_val),
            rows.rows(n_train + n_val, n),
        )
    for name in ("train", "val", "test"):
        if len(getattr(out, name)) == 0 and (name == "train" or _wanted(cfg, name)):
            raise DataError(f"the {name} split of {out.train.source} is empty")
    return out


def _wanted(cfg: DataConfig, name: str) -> bool:
    return cfg.split == "files" or getattr(cfg, f"{name}_fraction") > 0
