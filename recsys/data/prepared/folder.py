"""A prepared folder (``recsys-preprocess``) as row sources: each split is the list of its shards
(``meta.json``'s ``shards``), each shard memory-mapped, read by the same loader as every other
source.

A shard ``<split>/part-<k>`` holds ``.dense.npy [N, I]`` float32, ``.labels.npy [N, L]`` int8,
``.ids.npy [N, F1]`` uint32 (the one-hot features, in schema order) and per multi-hot feature
``j`` ``.list_{j}.values.npy [nnz]`` uint32 with ``.list_{j}.offsets.npy [N + 1]`` int64 (Arrow's
list layout, never padded), and for a weighted list (``weights``) ``.list_{j}.weights.npy [nnz]``
float32; with the schema's ``group_by``, ``.groups.npy [N]`` int64 (each row's group hash:
``RowSource.groups``). A split is the ``Concat`` of its shards: a worker reads only its own
rows (a contiguous range of the split, across shard boundaries as TorchRec's per-rank row
ranges), a range is a slice of each file and a shuffled batch a gather (``ragged_take``); nothing
is loaded whole. The split is the preparation's, so ``data.split`` and the fractions of
``DataConfig`` do not apply.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from recsys.data.columns import (
    Columns,
    Concat,
    DataError,
    RaggedColumns,
    RowSource,
    Splits,
    ragged_take,
)
from recsys.data.prepared.meta import CACHE_KEY, SPLITS, read_meta


class PreparedShard(RowSource):
    """One shard of a split, memory-mapped; reads give ``RaggedColumns``, or ``Columns``
    (``sparse [N, F, 1]``, one gather of the ids matrix) when every feature is one-hot."""

    def __init__(self, folder: str, split: str, shard: dict[str, Any], schema: dict[str, Any]
                 ) -> None:  # fmt: skip
        stem = os.path.join(folder, split, shard["name"])
        self.source = stem

        def load(suffix: str) -> np.ndarray:
            path = f"{stem}.{suffix}.npy"
            try:
                return np.load(path, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise DataError(f"{path}: not readable: {e}") from None

        self.dense, self.labels, ids = load("dense"), load("labels"), load("ids")
        self.ids = ids
        self.one_hot = not any(spec.get("multi_hot") for spec in schema["sparse"].values())
        self.features: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.weights: list[np.ndarray | None] = []
        one_hot = 0
        for j, spec in enumerate(schema["sparse"].values()):
            if spec.get("multi_hot"):
                self.features.append((load(f"list_{j}.values"), load(f"list_{j}.offsets")))
            else:
                self.features.append((ids[:, one_hot], None))
                one_hot += 1
            self.weights.append(load(f"list_{j}.weights") if spec.get("weights") else None)
        self.weighted = any(w is not None for w in self.weights)
        self.group_ids = load("groups") if schema.get("group_by") else None
        n = shard["rows"]
        if len(self.dense) != n or len(self.labels) != n or len(ids) != n:
            raise DataError(f"{stem}: {len(self.dense)} rows, meta.json says {n}")

    def __len__(self) -> int:
        return len(self.dense)

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        if self.group_ids is None:
            return None
        return np.asarray(self.group_ids[start : min(stop, len(self))], dtype=np.int64)

    def read(self, start: int, stop: int) -> Any:
        stop = min(stop, len(self))
        if self.one_hot:
            return self._dense_ids(slice(start, stop))
        values: list[Any] = []
        lengths: list[Any] = []
        weights: list[Any] = []
        for (ids, offsets), w in zip(self.features, self.weights, strict=True):
            if offsets is None:
                values.append(np.asarray(ids[start:stop]))
                lengths.append(np.ones(stop - start, np.int64))
                weights.append(None)
            else:
                off = np.asarray(offsets[start : stop + 1], dtype=np.int64)
                values.append(np.asarray(ids[off[0] : off[-1]]))
                lengths.append(np.diff(off))
                weights.append(None if w is None else np.asarray(w[off[0] : off[-1]]))
        return self._columns(np.asarray(self.dense[start:stop]), values, lengths,
                             np.asarray(self.labels[start:stop]), weights)  # fmt: skip

    def take(self, idx: np.ndarray) -> Any:
        idx = np.asarray(idx, dtype=np.int64)
        if self.one_hot:
            return self._dense_ids(idx)
        values: list[Any] = []
        lengths: list[Any] = []
        weights: list[Any] = []
        for (ids, offsets), w in zip(self.features, self.weights, strict=True):
            if offsets is None:
                values.append(np.asarray(ids[idx]))
                lengths.append(np.ones(len(idx), np.int64))
                weights.append(None)
            else:
                v, n = ragged_take(offsets, ids, idx)
                values.append(v)
                lengths.append(n)
                weights.append(None if w is None else ragged_take(offsets, w, idx)[0])
        return self._columns(np.asarray(self.dense[idx]), values, lengths,
                             np.asarray(self.labels[idx]), weights)  # fmt: skip

    def _dense_ids(self, rows: slice | np.ndarray) -> Columns:
        ids = np.asarray(self.ids[rows])
        return Columns(np.asarray(self.dense[rows]), ids.reshape(len(ids), ids.shape[1], 1),
                       np.asarray(self.labels[rows]), self.source)  # fmt: skip

    def _columns(self, dense: Any, values: list[Any], lengths: list[Any], labels: Any,
                 weights: list[Any]) -> Any:  # fmt: skip
        lens = np.stack(lengths, 1) if lengths else np.zeros((len(dense), 0), np.int64)
        w = tuple(weights) if self.weighted else None
        return RaggedColumns(dense, tuple(values), lens, labels, self.source, w)


def empty_split(meta: dict[str, Any], folder: str) -> Any:
    """A split without rows (``val_fraction: 0``), in the data set's widths."""
    schema = meta["schema"]
    f = len(schema["sparse"])
    if not any(spec.get("multi_hot") for spec in schema["sparse"].values()):
        return Columns(np.zeros((0, len(schema["dense"])), np.float32),
                       np.zeros((0, f, 1), np.uint32),
                       np.zeros((0, len(meta["labels"])), np.int8), folder)  # fmt: skip
    specs = list(schema["sparse"].values())
    weighted = any(spec.get("weights") for spec in specs)
    return RaggedColumns(
        np.zeros((0, len(schema["dense"])), np.float32),
        tuple(np.zeros(0, np.uint32) for _ in range(f)),
        np.zeros((0, f), np.int64),
        np.zeros((0, len(meta["labels"])), np.int8),
        folder,
        tuple(np.zeros(0, np.float32) if s.get("weights") else None for s in specs)
        if weighted
        else None,
    )


class AbsentShard(RowSource):
    """A shard a worker's cache of a prepared folder in an object store does not hold
    (``recsys.data.prepared.remote``): its length only; its rows lie outside what this worker
    reads."""

    def __init__(self, folder: str, split: str, shard: dict[str, Any], meta: dict[str, Any]
                 ) -> None:  # fmt: skip
        self.rows, self.meta = int(shard["rows"]), meta
        self.source = os.path.join(folder, split, shard["name"])

    def __len__(self) -> int:
        return self.rows

    def _refuse(self, n: int) -> Any:
        if n == 0:
            return empty_split(self.meta, self.source)
        source = self.meta[CACHE_KEY]["source"]
        raise DataError(f"{self.source}: not in this worker's cache of {source}")

    def read(self, start: int, stop: int) -> Any:
        return self._refuse(max(min(stop, self.rows) - start, 0))

    def take(self, idx: np.ndarray) -> Any:
        return self._refuse(len(idx))

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        if not self.meta["schema"].get("group_by"):
            return None
        n = max(min(stop, self.rows) - start, 0)
        return np.zeros(0, np.int64) if n == 0 else self._refuse(n)


def _shard(folder: str, split: str, shard: dict[str, Any], meta: dict[str, Any]) -> RowSource:
    cached = os.path.exists(os.path.join(folder, split, f"{shard['name']}.cached"))
    if CACHE_KEY in meta and not cached:
        return AbsentShard(folder, split, shard, meta)
    return PreparedShard(folder, split, shard, meta["schema"])


def split_source(folder: str, split: str, meta: dict[str, Any]) -> RowSource:
    """A split as one row source: its shards in order (one shard: itself)."""
    shards: list[RowSource] = [_shard(folder, split, s, meta) for s in meta["shards"][split]]
    if not shards:
        return empty_split(meta, os.path.join(folder, split))
    source = shards[0] if len(shards) == 1 else Concat(shards)
    source.source = os.path.join(folder, split)
    return source


def load_splits(paths: list[str], num_dense: int, table_rows: list[int]) -> Splits:
    """The three splits of the one prepared folder in ``paths``, checked against the model."""
    if len(paths) != 1:
        raise DataError(
            f"data.source=prepared reads one prepared folder, got {len(paths)}: {paths}"
        )
    folder = paths[0]
    meta = read_meta(folder)
    dense, sparse = len(meta["schema"]["dense"]), len(meta["schema"]["sparse"])
    if dense != num_dense or sparse != len(table_rows):
        raise DataError(
            f"{folder}: has {dense} dense and {sparse} sparse features; the model expects "
            f"{num_dense} (model.num_dense) and {len(table_rows)} (embeddings.num_embeddings)"
        )
    splits = Splits(*(split_source(folder, s, meta) for s in SPLITS))
    if len(splits.train) == 0:
        raise DataError(f"{folder}: the train split is empty")
    return splits
