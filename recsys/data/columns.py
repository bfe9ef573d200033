"""Rows of a click log, where they come from, and the train / validation / test splits.

Shapes: ``N`` rows, ``I`` dense features, ``F`` sparse features, ``H`` ids per bag, ``L`` labels.

Every source is a ``RowSource``: it has a length and materialises only the rows asked for
(``read(start, stop)``, ``take(indices)``). Splits and per-worker shards are ``RowRange`` views and
several files are one ``Concat``, so a split over 24 memory-mapped days copies nothing: a worker
touches the pages of the rows it reads, and its memory does not grow with the number of days.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys.config import DataConfig
from recsys.data.errors import DataError as DataError  # a leaf module: the config reads it


class RowSource(ABC):
    """Rows ``[0, len)`` that are read on demand.

    ``generated``: the rows are computed when read (synthetic data), so a worker materialises its
    own part once (``resident``) instead of recomputing it per batch.
    """

    source: str = "<rows>"
    generated: bool = False

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def read(self, start: int, stop: int) -> Any:
        """Rows ``[start, stop)`` as arrays (``Columns``, or ``RaggedColumns``)."""

    def take(self, idx: np.ndarray) -> Any:
        """Rows ``idx`` (any order) as arrays, in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0:
            return self.read(0, 0)
        lo, hi = int(idx.min()), int(idx.max()) + 1
        return self.read(lo, hi).take(idx - lo)

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        """``[stop - start]`` int64: rows ``[start, stop)``'s groups for ranking (a prepared
        folder whose schema names ``group_by``: each row's group hash, 0 for none); None where
        the source has no groups."""
        return None

    def slice(self, start: int, stop: int) -> RowSource:
        """A view of rows ``[start, stop)``."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"{self.source}: rows [{start}, {stop}) outside [0, {len(self)})")
        return RowRange(self, start, stop)

    def resident(self) -> RowSource:
        """The rows in a form that is cheap to read repeatedly: generated rows are computed into
        memory once; memory-mapped files stay mapped (nothing is copied)."""
        return self.read(0, len(self)) if self.generated else self


@dataclass(frozen=True)
class Columns(RowSource):
    """Rows as arrays (in memory, or memory-mapped).

    Attributes:
        dense: ``[N, I]`` float32, already transformed (``log(1 + max(x, 0))``, missing -> 0).
        sparse: ``[N, F, H]`` unsigned/signed ints: raw ids, hashes, or vocabulary ids; mapped to
            table rows by modulo at batch time, so one preprocessed file serves every table size.
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

    @property
    def values(self) -> tuple[np.ndarray, ...]:
        """Each feature's ids of all rows in row order (``RaggedColumns``' view of them)."""
        return tuple(self.sparse[:, f, :].reshape(-1) for f in range(self.num_sparse))

    @property
    def lengths(self) -> np.ndarray:
        """``[N, F]`` ids per row and feature: ``H`` each."""
        n, f, h = self.sparse.shape
        return np.full((n, f), h, np.int64)

    def read(self, start: int, stop: int) -> Columns:
        return self.rows(start, stop)

    def rows(self, start: int, stop: int) -> Columns:
        return Columns(
            self.dense[start:stop], self.sparse[start:stop], self.labels[start:stop], self.source
        )

    def take(self, idx: np.ndarray) -> Columns:
        return Columns(self.dense[idx], self.sparse[idx], self.labels[idx], self.source)


def ragged_take(offsets: np.ndarray, values: np.ndarray, idx: np.ndarray) -> tuple[Any, Any]:
    """``(values, lengths)`` of rows ``idx`` of a list column in Arrow's layout (row ``i``'s
    values are ``values[offsets[i]:offsets[i + 1]]``), in the order of ``idx``."""
    starts = np.asarray(offsets[idx], dtype=np.int64)
    lengths = np.asarray(offsets[idx + 1], dtype=np.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return np.asarray(values[:0]), lengths
    ends = np.cumsum(lengths)
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return np.asarray(values[pos]), lengths


@dataclass(frozen=True)
class RaggedColumns(RowSource):
    """Rows whose sparse features have a variable number of ids per row (a user's own data).

    Attributes:
        dense: ``[N, I]`` float32, already transformed.
        values: ``F`` flat id arrays, feature ``f``'s ids of all rows in row order.
        lengths: ``[N, F]`` int64, ids per row and feature (``values[f]`` has
            ``lengths[:, f].sum()`` ids).
        labels: ``[N, L]`` in {0, 1}.
        source: where the rows came from, for error messages.
        weights: ``None`` (no weighted feature), or per feature ``F`` float32 arrays parallel to
            ``values`` (a weighted list's weight per id), ``None`` for an unweighted feature.
    """

    dense: np.ndarray
    values: tuple[np.ndarray, ...]
    lengths: np.ndarray
    labels: np.ndarray
    source: str = "<memory>"
    weights: tuple[np.ndarray | None, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.dense)
        if len(self.lengths) != n or len(self.labels) != n:
            raise DataError(f"{self.source}: row counts differ: dense {n}, lengths "
                            f"{len(self.lengths)}, labels {len(self.labels)}")  # fmt: skip
        for f, w in enumerate(self.weights or ()):
            if w is not None and len(w) != len(self.values[f]):
                raise DataError(f"{self.source}: feature {f} has {len(self.values[f])} ids "
                                f"and {len(w)} weights")  # fmt: skip

    def __len__(self) -> int:
        return len(self.dense)

    @property
    def num_sparse(self) -> int:
        return len(self.values)

    def _offsets(self, f: int) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths[:, f])])

    def read(self, start: int, stop: int) -> RaggedColumns:
        return self.take(np.arange(start, min(stop, len(self)), dtype=np.int64))

    def take(self, idx: np.ndarray) -> RaggedColumns:
        idx = np.asarray(idx, dtype=np.int64)
        offsets = [self._offsets(f) for f in range(self.num_sparse)]
        values = tuple(ragged_take(offsets[f], v, idx)[0] for f, v in enumerate(self.values))
        weights = None
        if self.weights is not None:
            weights = tuple(None if w is None else ragged_take(offsets[f], w, idx)[0]
                            for f, w in enumerate(self.weights))  # fmt: skip
        return RaggedColumns(
            self.dense[idx], values, self.lengths[idx], self.labels[idx], self.source, weights
        )

    @staticmethod
    def concat(parts: list[RaggedColumns], source: str) -> RaggedColumns:
        f_all = range(parts[0].num_sparse)
        weights = None
        if parts[0].weights is not None:
            weights = tuple(None if parts[0].weights[f] is None else
                            np.concatenate([p.weights[f] for p in parts])  # type: ignore[index,misc]
                            for f in f_all)  # fmt: skip
        return RaggedColumns(
            np.concatenate([p.dense for p in parts]),
            tuple(np.concatenate([p.values[f] for p in parts]) for f in f_all),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.labels for p in parts]),
            source,
            weights,
        )


AnyColumns = Columns | RaggedColumns


def stack(parts: list[Any], source: str) -> Any:
    """Small pieces (a batch's rows from several files) as one ``Columns`` (copies them)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], RaggedColumns):
        return RaggedColumns.concat(parts, source)
    return Columns(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.sparse for p in parts]),
        np.concatenate([p.labels for p in parts]),
        source,
    )


class RowRange(RowSource):
    """Rows ``[start, stop)`` of ``base``, renumbered from 0."""

    def __init__(self, base: RowSource, start: int, stop: int) -> None:
        self.base, self.start, self.stop = base, start, stop
        self.source = base.source
        self.generated = base.generated

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self, start: int, stop: int) -> Any:
        return self.base.read(self.start + start, self.start + min(stop, len(self)))

    def take(self, idx: np.ndarray) -> Any:
        return self.base.take(np.asarray(idx, dtype=np.int64) + self.start)

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        return self.base.groups(self.start + start, self.start + min(stop, len(self)))

    def slice(self, start: int, stop: int) -> RowSource:
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"{self.source}: rows [{start}, {stop}) outside [0, {len(self)})")
        return RowRange(self.base, self.start + start, self.start + stop)

    def resident(self) -> RowSource:
        return self.base.read(self.start, self.stop) if self.generated else self


class Concat(RowSource):
    """Several sources (days, in time order) as one, without copying them: a read that crosses a
    file boundary reads each file's part (``offsets[i]`` is the first row of part ``i``)."""

    def __init__(self, parts: list[RowSource]) -> None:
        if not parts:
            raise DataError("no input files")
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.source = ", ".join(p.source for p in parts)
        self.generated = any(p.generated for p in parts)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``(part, local start, local stop)`` of the parts that rows ``[start, stop)`` span, as
        TorchRec's ``get_file_row_ranges_and_remainder`` computes per rank."""
        out = []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for i in range(max(first, 0), len(self.parts)):
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            if lo >= stop:
                break
            if hi > start:
                out.append((i, max(start, lo) - lo, min(stop, hi) - lo))
        return out

    def read(self, start: int, stop: int) -> Any:
        pieces = [self.parts[i].read(a, b) for i, a, b in self.locate(start, stop)]
        if not pieces:
            return self.parts[0].read(0, 0)
        return stack(pieces, self.source)

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        pieces = [self.parts[i].groups(a, b) for i, a, b in self.locate(start, stop)]
        if not pieces:
            return self.parts[0].groups(0, 0)
        if any(p is None for p in pieces):
            return None
        return np.concatenate(pieces)  # type: ignore[arg-type]

    def take(self, idx: np.ndarray) -> Any:
        idx = np.asarray(idx, dtype=np.int64)
        part = np.searchsorted(self.offsets, idx, side="right") - 1
        order = np.argsort(part, kind="stable")
        pieces, sorted_parts = [], part[order]
        for i in np.unique(sorted_parts):
            sel = order[sorted_parts == i]
            pieces.append(self.parts[int(i)].take(idx[sel] - self.offsets[i]))
        merged = stack(pieces, self.source) if pieces else self.parts[0].read(0, 0)
        return merged.take(np.argsort(order, kind="stable")) if len(pieces) > 1 else merged


@dataclass(frozen=True)
class Splits:
    train: RowSource
    val: RowSource
    test: RowSource


def split(parts: list[RowSource], cfg: DataConfig) -> Splits:
    """Train / validation / test, in time order (Criteo files are time-ordered); views, no copies.

    ``fraction``: all rows in file order, cut at ``1 - val - test`` and ``1 - test``.
    ``files``: the last file is test, the one before it validation, the rest training
    (Criteo Terabyte: days 0-21 train, day 22 validation, day 23 test).
    """
    if cfg.split == "files":
        if len(parts) < 3:
            raise DataError(f"data.split=files needs >= 3 files, got {len(parts)}")
        out = Splits(Concat(parts[:-2]), parts[-2], parts[-1])
    else:
        rows = Concat(parts) if len(parts) > 1 else parts[0]
        n = len(rows)
        n_test = round(n * cfg.test_fraction)
        n_val = round(n * cfg.val_fraction)
        n_train = n - n_val - n_test
        out = Splits(
            rows.slice(0, n_train),
            rows.slice(n_train, n_train + n_val),
            rows.slice(n_train + n_val, n),
        )
    for name in ("train", "val", "test"):
        if len(getattr(out, name)) == 0 and (name == "train" or _wanted(cfg, name)):
            raise DataError(f"the {name} split of {out.train.source} is empty")
    return out


def _wanted(cfg: DataConfig, name: str) -> bool:
    return cfg.split == "files" or getattr(cfg, f"{name}_fraction") > 0


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of worker ``rank``: contiguous, disjoint, covering ``[0, n)``."""
    return n * rank // world_size, n * (rank + 1) // world_size
