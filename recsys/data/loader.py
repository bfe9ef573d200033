"""From a ``DataConfig`` to per-worker batches of ``(dense, KeyedJaggedTensor, labels)``.

Each of ``world_size`` workers reads a disjoint contiguous part of a split
(``shard_range``); across workers every row is read exactly once per epoch.

- Training (``TrainStream``): each worker cycles through its part epoch after epoch (reshuffled
  per epoch from ``(seed, epoch, rank)`` when ``shuffle``), cut into full batches, so every step has
  the same batch size on every rank. Its ``position`` (rows consumed) is the data position saved in
  checkpoints; resuming from it continues the exact same stream.
- Evaluation (``eval_batches``): every worker yields the same number of batches (sharded modules
  run collectives in forward); the last ones are padded and carry a ``valid`` mask.

Ray Data is not used: the preprocessed npy files are memory-mapped, so a worker touches only the
rows it reads, and with shared storage (NFS, a mounted bucket) every worker reads its part directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import DataConfig, SyntheticConfig
from recsys.data import binary, criteo
from recsys.data.columns import Columns, DataError, Splits, split
from recsys.data.synthetic import generate


def load_parts(cfg: DataConfig, num_dense: int, table_rows: list[int]) -> list[Columns]:
    """The configured source as one ``Columns`` per input file (synthetic: one part)."""
    if cfg.source == "synthetic":
        return [synthetic_columns(cfg.synthetic, num_dense, table_rows)]
    if cfg.source == "criteo_tsv":
        parts = [criteo.read_tsv(p, on_bad_row=cfg.on_bad_row) for p in cfg.paths]
    else:
        parts = [day for folder in cfg.paths for day in binary.load_folder(folder)]
    for part in parts:
        check_schema(part, num_dense, len(table_rows))
    return parts


def synthetic_columns(cfg: SyntheticConfig, num_dense: int, table_rows: list[int]) -> Columns:
    return generate(cfg, num_dense, table_rows).columns()


def check_schema(cols: Columns, num_dense: int, num_sparse: int) -> None:
    if cols.num_dense != num_dense or cols.num_sparse != num_sparse:
        raise DataError(
            f"{cols.source}: has {cols.num_dense} dense and {cols.num_sparse} sparse features; "
            f"the model expects {num_dense} (model.num_dense) and {num_sparse} "
            "(len(embeddings.num_embeddings))"
        )


def load_splits(cfg: DataConfig, num_dense: int, table_rows: list[int]) -> Splits:
    """Load and split; a missing file, an empty file or an empty split is a ``DataError``."""
    return split(load_parts(cfg, num_dense, table_rows), cfg)


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of worker ``rank``: contiguous, disjoint, covering ``[0, n)``."""
    return n * rank // world_size, n * (rank + 1) // world_size


def to_batch(cols: Columns, table_rows: list[int], feature_names: list[str]) -> Batch:
    """Rows -> ``Batch(dense [B, I], KJT (F keys, H ids per bag), labels [B, L])``.

    Raw ids map to table rows by ``id mod rows`` (the hashing trick of the DLRM reference).
    """
    b, f, h = cols.sparse.shape
    ids = np.asarray(cols.sparse, dtype=np.int64) % np.asarray(table_rows)[None, :, None]
    kjt = KeyedJaggedTensor(
        keys=feature_names,
        values=torch.from_numpy(np.ascontiguousarray(ids.transpose(1, 0, 2)).reshape(-1)),
        lengths=torch.full((f * b,), h, dtype=torch.int64),
        stride=b,
    )
    return Batch(
        dense_features=torch.from_numpy(np.asarray(cols.dense, dtype=np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.asarray(cols.labels, dtype=np.float32)),
    )


def count_out_of_range(cols: Columns, table_rows: list[int]) -> int:
    """Ids at or beyond their table's size (they are hashed into range by modulo). Raw Criteo
    hashes are nearly all beyond; with contiguous ids (a vocabulary) any count means the tables
    are smaller than the vocabulary."""
    rows = np.asarray(table_rows)[None, :, None]
    return int((np.asarray(cols.sparse) >= rows).sum())


class TrainStream:
    """An endless, resumable stream of full training batches for one worker.

    Args:
        cols: the training split (all workers pass the same one).
        rank / world_size: this worker's place; it reads ``shard_range(len(cols), ...)``.
        position: rows already consumed by this worker (from a checkpoint), 0 to start.
    """

    def __init__(
        self,
        cols: Columns,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        table_rows: list[int],
        feature_names: list[str],
        seed: int,
        shuffle: bool,
        position: int = 0,
    ) -> None:
        start, stop = shard_range(len(cols), rank, world_size)
        if stop == start:
            raise DataError(
                f"{cols.source}: {len(cols)} training rows cannot feed {world_size} workers"
            )
        self.shard = cols.rows(start, stop)
        self.rank, self.batch_size, self.seed, self.shuffle = rank, batch_size, seed, shuffle
        self.table_rows, self.feature_names = table_rows, feature_names
        self.position = position
        self.ids_hashed = 0  # ids at or beyond their table's size seen so far (mapped by modulo)
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    @property
    def epoch(self) -> int:
        return self.position // len(self.shard)

    def _order_of(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            n = len(self.shard)
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch, self.rank])
                self._order = rng.permutation(n)
            else:
                self._order = np.arange(n)
            self._epoch = epoch
        return self._order

    def next_indices(self) -> np.ndarray:
        """Shard-relative row indices of the next batch; advances ``position``."""
        parts, need, n = [], self.batch_size, len(self.shard)
        while need:
            epoch, offset = divmod(self.position, n)
            take = self._order_of(epoch)[offset : offset + need]
            parts.append(take)
            self.position += len(take)
            need -= len(take)
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        rows = self.shard.take(self.next_indices())
        self.ids_hashed += count_out_of_range(rows, self.table_rows)
        return to_batch(rows, self.table_rows, self.feature_names)


def eval_batches(
    cols: Columns,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    table_rows: list[int],
    feature_names: list[str],
    max_batches: int = 0,
) -> Iterator[tuple[Batch, torch.Tensor]]:
    """``(batch, valid [B] bool)`` over this worker's part; the same count on every worker.

    ``max_batches`` (0 = all) caps the batches per worker.
    """
    start, stop = shard_range(len(cols), rank, world_size)
    count = math.ceil(math.ceil(len(cols) / world_size) / batch_size)
    if max_batches:
        count = min(count, max_batches)
    for i in range(count):
        lo = min(start + i * batch_size, stop)
        hi = min(lo + batch_size, stop)
        idx = np.arange(lo, hi)
        valid = torch.zeros(batch_size, dtype=torch.bool)
        valid[: len(idx)] = True
        idx = np.concatenate([idx, np.full(batch_size - len(idx), min(start, len(cols) - 1))])
        yield to_batch(cols.take(idx), table_rows, feature_names), valid
