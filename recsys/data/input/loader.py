"""From a ``DataConfig`` to per-worker batches of ``(dense, KeyedJaggedTensor, labels)``.

Each of ``world_size`` workers reads a disjoint contiguous part of a split (``shard_range``, across
shard and file boundaries as TorchRec's ``get_file_row_ranges_and_remainder``); across workers
every row is read exactly once per epoch. Nothing is loaded whole: a prepared folder's shards
(``recsys.data.prepared.folder``) and TorchRec's day files stay memory-mapped, and synthetic rows
are generated per worker for its own part only.

- Training (``TrainStream``): each worker cycles through its part epoch after epoch, reshuffled per
  epoch from ``(seed, epoch, rank)`` when ``shuffle`` (a keyed permutation evaluated per batch,
  ``recsys.data.input.permutation``: no per-worker index array), cut into full batches, so every
  step has the same batch size on every rank. Its ``position`` (rows consumed) is the data position
  saved in checkpoints; resuming from it continues the exact same stream.
- Evaluation (``eval_batches``): every worker yields the same number of batches (sharded modules
  run collectives in forward); the last ones are padded and carry a ``valid`` mask.
- Batches carry the model's input keys (``SparseLayout``): ids mod table rows, QR features split
  into quotient and remainder keys here, on the host, so the embedding collection's input comes
  straight from the batch (TorchRec's train pipeline then overlaps its input distribution).
- ``pin_memory``: batches in page-locked memory, so the copy to a GPU is asynchronous (GPU hosts
  only: CPU-only torch cannot pin).

Ray Data is not used: memory-mapped npy files on shared storage let each worker read only its own
rows with no extra service, and the data position is one integer per rank in the checkpoint, which
makes resume exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import DataConfig, SparseLayout
from recsys.data.columns import (
    AnyColumns,
    Columns,
    Concat,
    DataError,
    RaggedColumns,
    RowSource,
    Splits,
    shard_range,
    split,
)
from recsys.data.input.permutation import Permutation
from recsys.data.input.synthetic import SyntheticRows
from recsys.data.prepared import folder as prepared_folder
from recsys.data.prepared import torchrec_npy


def load_parts(cfg: DataConfig, num_dense: int, table_rows: list[int]) -> list[RowSource]:
    """The configured source as one row source per input file (synthetic: one part)."""
    if cfg.source == "synthetic":
        return [SyntheticRows(cfg.synthetic, num_dense, table_rows)]
    parts = [d for f in cfg.paths for d in torchrec_npy.load_folder(f, cfg.torchrec_dense_min)]
    for part in parts:
        check_schema(part, num_dense, len(table_rows))
    return list(parts)


def check_schema(part: torchrec_npy.NpyDay, num_dense: int, num_sparse: int) -> None:
    dense, sparse = part.dense.shape[1], part.sparse.shape[1]
    if dense != num_dense or sparse != num_sparse:
        raise DataError(
            f"{part.source}: has {dense} dense and {sparse} sparse features; "
            f"the model expects {num_dense} (model.num_dense) and {num_sparse} "
            "(len(embeddings.num_embeddings))"
        )


def load_splits(cfg: DataConfig, num_dense: int, table_rows: list[int]) -> Splits:
    """Open and split (views: nothing is read yet); a missing file, an empty file or an empty
    split is a ``DataError``. A prepared folder comes split already
    (``recsys.data.prepared.folder``). With ``refit`` the training rows are the training and
    then the validation rows (one view of both, no copy)."""
    if cfg.source == "prepared":
        splits = prepared_folder.load_splits(cfg.paths, num_dense, table_rows)
    else:
        splits = split(load_parts(cfg, num_dense, table_rows), cfg)
    if not cfg.refit:
        return splits
    if len(splits.val) == 0:
        raise DataError(f"data.refit: {splits.val.source} has no validation rows to add")
    return Splits(Concat([splits.train, splits.val]), splits.val, splits.test)


def map_position(position: int, saved_rows: int, rows: int) -> int:
    """A worker's data position (rows consumed of a shard of ``saved_rows`` rows, over epochs)
    carried to a shard of ``rows`` rows, when a run resumes on another number of workers: the
    same epoch, and the same fraction of it done (rounded down). Which rows of the current epoch
    were already seen does not carry over (the shards and their shuffles differ), so up to that
    fraction of one epoch may be seen twice or skipped; every later epoch is whole."""
    if saved_rows <= 0 or saved_rows == rows:
        return position
    epoch, offset = divmod(position, saved_rows)
    return epoch * rows + offset * rows // saved_rows


def sparse_ids(cols: Columns, layout: SparseLayout) -> np.ndarray:
    """``[K, B, H]`` ids in the layout's key order: each feature's ids mod its table's rows, then
    each QR feature's quotient under its key and its remainder under ``key + QR_SUFFIX``."""
    ids = np.asarray(cols.sparse, dtype=np.int64) % np.asarray(layout.rows)[None, :, None]
    ids = ids.transpose(1, 0, 2)  # [F, B, H]
    if not layout.qr:
        return ids
    c = np.array([layout.qr.get(f, 1) for f in layout.names])[:, None, None]
    qr = [i for i, f in enumerate(layout.names) if f in layout.qr]
    return np.concatenate([ids // c, ids[qr] % c[qr]])


def tensor(array: np.ndarray, dtype: type) -> torch.Tensor:
    """``array`` as a tensor of ``dtype``, sharing its memory where it can: a read-only array (a
    view of a memory-mapped shard, read in order) is copied first, since torch requires tensors it
    shares memory with to be writable."""
    return torch.from_numpy(np.require(array, dtype, ["W"]))


def keyed_jagged(
    keys: list[str],
    values: np.ndarray,
    lengths: np.ndarray,
    per_key: list[int],
    batch: int,
    weights: np.ndarray | None = None,
) -> KeyedJaggedTensor:
    """A KJT from key-major flat ids and per-row lengths, with ``length_per_key`` (ids per key)
    and ``offset_per_key`` set from the host: TorchRec's input distribution would otherwise
    compute them from the lengths on the device (a device-to-host sync every step).
    ``weights``: float32 per id (a weighted model's input), or ``None``."""
    return KeyedJaggedTensor(
        keys=keys,
        values=tensor(values, np.int64),
        weights=None if weights is None else tensor(weights, np.float32),
        lengths=tensor(lengths, np.int64),
        stride=batch,
        length_per_key=per_key,
        offset_per_key=[0, *np.cumsum(per_key).tolist()],
    )


def positions(values: np.ndarray, lengths: np.ndarray, max_len: int
              ) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """A sequence's lists (oldest item first, ``lengths [B]``) as ``max_len`` position bags,
    most recent first: position ``j`` holds each row's ``j``-th latest id, ``(ids, lengths)``
    with lengths 1 where the row has one and 0 past its history (a longer list's older items
    are left out: the most recent ``max_len`` are kept)."""
    ends = np.cumsum(lengths)
    out = []
    for j in range(max_len):
        has = lengths > j
        out.append((values[ends[has] - 1 - j], has.astype(np.int64)))
    return out


def ragged_kjt(cols: RaggedColumns, layout: SparseLayout) -> KeyedJaggedTensor:
    """The KJT of rows with variable-length bags: each feature's ids mod its table's rows (a
    sequence's as position bags: ``positions``), the QR keys' quotients under their keys and
    remainders after all keys (as ``sparse_ids``), with the real per-row lengths (never
    padded). Rows with weighted lists (``cols.weights``) give a weighted KJT: each id's weight,
    1 for the ids of unweighted features, a QR remainder's the same as its quotient's."""
    bags: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}  # key: ids, lengths
    for f, name in enumerate(layout.names):
        ids = np.asarray(cols.values[f], dtype=np.int64) % layout.rows[f]
        lens = cols.lengths[:, f]
        if name in layout.sequences:
            found = positions(ids, lens, layout.sequences[name])
            for key, (v, n) in zip(layout.feature_keys(name), found, strict=True):
                bags[key] = (v, n, None)
            continue
        w = None if cols.weights is None else cols.weights[f]
        bags[name] = (ids, lens, None if w is None else np.asarray(w, np.float32))
    split = layout.split()
    parts = [(v if k not in split else v // split[k], n, w) for k, (v, n, w) in bags.items()]
    parts += [(v % split[k], n, w) for k, (v, n, w) in bags.items() if k in split]
    flat_w = None
    if cols.weights is not None:
        flat_w = np.concatenate([np.ones(len(v), np.float32) if w is None else w
                                 for v, _, w in parts])  # fmt: skip
    return keyed_jagged(layout.keys(), np.concatenate([v for v, _, _ in parts]),
                        np.concatenate([n for _, n, _ in parts]), [len(v) for v, _, _ in parts],
                        len(cols), flat_w)  # fmt: skip


def to_batch(cols: AnyColumns, layout: SparseLayout) -> Batch:
    """Rows -> ``Batch(dense [B, I], KJT (layout keys; H ids per bag, or each row's own count),
    labels [B, L])``."""
    if isinstance(cols, RaggedColumns):
        kjt = ragged_kjt(cols, layout)
    else:
        ids = sparse_ids(cols, layout)
        k, b, h = ids.shape
        flat = np.ascontiguousarray(ids).reshape(-1)  # key-major already: no copy per key
        kjt = keyed_jagged(layout.keys(), flat, np.full(k * b, h), [b * h] * k, b)
    return Batch(
        dense_features=tensor(cols.dense, np.float32),
        sparse_features=kjt,
        labels=tensor(cols.labels, np.float32),
    )


def count_out_of_range(cols: AnyColumns, table_rows: list[int]) -> int:
    """Ids at or beyond their table's size (they are hashed into range by modulo). Raw Criteo
    hashes are nearly all beyond; with contiguous ids (a vocabulary) any count means the tables
    are smaller than the vocabulary."""
    if isinstance(cols, RaggedColumns):
        return sum(int((v >= r).sum()) for v, r in zip(cols.values, table_rows, strict=True))
    rows = np.asarray(table_rows)[None, :, None]
    return int((np.asarray(cols.sparse) >= rows).sum())


class TrainStream:
    """An endless, resumable stream of full training batches for one worker.

    Args:
        rows: the training split (all workers pass the same one).
        rank / world_size: this worker's place; it reads ``shard_range(len(rows), ...)``.
        layout: feature names, table rows and QR split of the model's input.
        position: rows already consumed by this worker (from a checkpoint), 0 to start.
        pin_memory: put batches in page-locked memory (for asynchronous copies to a GPU).
    """

    def __init__(
        self,
        rows: RowSource,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        layout: SparseLayout,
        seed: int,
        shuffle: bool,
        position: int = 0,
        pin_memory: bool = False,
    ) -> None:
        start, stop = shard_range(len(rows), rank, world_size)
        if stop == start:
            raise DataError(
                f"{rows.source}: {len(rows)} training rows cannot feed {world_size} workers"
            )
        self.shard = rows.slice(start, stop).resident()
        self.rank, self.batch_size, self.seed, self.shuffle = rank, batch_size, seed, shuffle
        self.layout, self.pin_memory = layout, pin_memory
        self.position = position
        self.ids_hashed = 0  # ids at or beyond their table's size seen so far (mapped by modulo)
        self._epoch, self._perm = -1, Permutation(1, key=())

    @property
    def epoch(self) -> int:
        return self.position // len(self.shard)

    def _order(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        if not self.shuffle:
            return offsets
        if epoch != self._epoch:
            self._perm = Permutation(len(self.shard), key=(self.seed, epoch, self.rank))
            self._epoch = epoch
        return self._perm(offsets)

    def next_indices(self) -> np.ndarray:
        """Shard-relative row indices of the next batch; advances ``position``."""
        parts, need, n = [], self.batch_size, len(self.shard)
        while need:
            epoch, offset = divmod(self.position, n)
            take = min(need, n - offset)
            parts.append(self._order(epoch, np.arange(offset, offset + take)))
            self.position += take
            need -= take
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        rows = self.shard.take(self.next_indices())
        self.ids_hashed += count_out_of_range(rows, self.layout.rows)
        batch = to_batch(rows, self.layout)
        return batch.pin_memory() if self.pin_memory else batch


def eval_plan(rows: int, rank: int, world_size: int, batch_size: int, max_batches: int = 0
              ) -> tuple[int, int, int]:  # fmt: skip
    """``(start, stop, batches)``: this worker's part of a split of ``rows`` rows and the number
    of batches every worker yields over it (``max_batches``: at most that many; 0 = all)."""
    start, stop = shard_range(rows, rank, world_size)
    count = math.ceil(math.ceil(rows / world_size) / batch_size)
    return start, stop, min(count, max_batches) if max_batches else count


def eval_batches(
    rows: RowSource,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    layout: SparseLayout,
    max_batches: int = 0,
) -> Iterator[tuple[Batch, torch.Tensor]]:
    """``(batch, valid [B] bool)`` over this worker's part; the same count on every worker.

    ``max_batches`` (0 = all) caps the batches per worker.
    """
    start, stop, count = eval_plan(len(rows), rank, world_size, batch_size, max_batches)
    part = rows.slice(start, stop).resident() if stop > start else rows.slice(0, 1).resident()
    for i in range(count):
        lo = min(i * batch_size, stop - start)
        hi = min(lo + batch_size, stop - start)
        valid = torch.zeros(batch_size, dtype=torch.bool)
        valid[: hi - lo] = True
        idx = np.concatenate([np.arange(lo, hi), np.zeros(batch_size - (hi - lo), np.int64)])
        yield to_batch(part.take(idx), layout), valid


def eval_groups(
    rows: RowSource, *, rank: int, world_size: int, batch_size: int, max_batches: int = 0
) -> Iterator[torch.Tensor]:
    """The groups (``RowSource.groups``: ``[B]`` int64, 0 on padding rows) of the batches
    ``eval_batches`` yields with the same arguments, batch for batch; a source without groups
    is a ``DataError``."""
    start, stop, count = eval_plan(len(rows), rank, world_size, batch_size, max_batches)
    for i in range(count):
        lo = min(i * batch_size, stop - start)
        hi = min(lo + batch_size, stop - start)
        got = rows.groups(start + lo, start + hi)
        if got is None:
            raise DataError(f"{rows.source}: holds no groups (groups.npy): prepare it again "
                            "with the schema's group_by")  # fmt: skip
        out = torch.zeros(batch_size, dtype=torch.int64)
        out[: hi - lo] = torch.from_numpy(np.array(got, dtype=np.int64))  # (a copy: writable)
        yield out
