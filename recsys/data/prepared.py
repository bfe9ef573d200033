"""A prepared folder (``recsys-preprocess --schema``) as row sources: one memory-mapped
``RowSource`` per split, read by the same loader as every other source.

Each split folder holds ``dense.npy [N, I]``, ``labels.npy [N, L]`` and per sparse feature ``j``
``sparse_{j}.ids.npy [N]`` (one id per row) or ``sparse_{j}.values.npy [nnz]`` with
``sparse_{j}.offsets.npy [N + 1]`` (a list column). A worker reads only its rows: a contiguous
range is a slice of each file, a shuffled batch a gather (``ragged_take``); nothing is loaded
whole. The split is the preparation's (by time, or by hash), so ``data.split`` and the fractions
of ``DataConfig`` do not apply.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from recsys.data.columns import DataError, RaggedColumns, RowSource, Splits, ragged_take
from recsys.data.meta import SPLITS, read_meta


class PreparedSplit(RowSource):
    """One split of a prepared folder, memory-mapped; reads give ``RaggedColumns``."""

    def __init__(self, folder: str, split: str, meta: dict[str, Any]) -> None:
        self.source = os.path.join(folder, split)
        schema = meta["schema"]

        def load(name: str) -> np.ndarray:
            try:
                return np.load(os.path.join(self.source, name), mmap_mode="r")
            except (OSError, ValueError) as e:
                raise DataError(f"{self.source}/{name}: not readable: {e}") from None

        self.dense, self.labels = load("dense.npy"), load("labels.npy")
        self.features: list[tuple[np.ndarray, np.ndarray | None]] = []
        for j, spec in enumerate(schema["sparse"].values()):
            if spec.get("multi_hot"):
                self.features.append(
                    (load(f"sparse_{j}.values.npy"), load(f"sparse_{j}.offsets.npy"))
                )
            else:
                self.features.append((load(f"sparse_{j}.ids.npy"), None))
        n = meta["rows"][split]
        if len(self.dense) != n or len(self.labels) != n:
            raise DataError(f"{self.source}: {len(self.dense)} rows, meta.json says {n}")

    def __len__(self) -> int:
        return len(self.dense)

    def read(self, start: int, stop: int) -> RaggedColumns:
        stop = min(stop, len(self))
        values, lengths = [], []
        for ids, offsets in self.features:
            if offsets is None:
                values.append(np.asarray(ids[start:stop]))
                lengths.append(np.ones(stop - start, np.int64))
            else:
                off = np.asarray(offsets[start : stop + 1], dtype=np.int64)
                values.append(np.asarray(ids[off[0] : off[-1]]))
                lengths.append(np.diff(off))
        return self._columns(np.asarray(self.dense[start:stop]), values, lengths,
                             np.asarray(self.labels[start:stop]))  # fmt: skip

    def take(self, idx: np.ndarray) -> RaggedColumns:
        idx = np.asarray(idx, dtype=np.int64)
        values, lengths = [], []
        for ids, offsets in self.features:
            if offsets is None:
                values.append(np.asarray(ids[idx]))
                lengths.append(np.ones(len(idx), np.int64))
            else:
                v, n = ragged_take(offsets, ids, idx)
                values.append(v)
                lengths.append(n)
        return self._columns(np.asarray(self.dense[idx]), values, lengths,
                             np.asarray(self.labels[idx]))  # fmt: skip

    def _columns(self, dense: Any, values: list[Any], lengths: list[Any], labels: Any) -> Any:
        lens = np.stack(lengths, 1) if lengths else np.zeros((len(dense), 0), np.int64)
        return RaggedColumns(dense, tuple(values), lens, labels, self.source)


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
    splits = Splits(*(PreparedSplit(folder, s, meta) for s in SPLITS))
    if len(splits.train) == 0:
        raise DataError(f"{folder}: the train split is empty")
    return splits
