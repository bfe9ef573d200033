"""A column's ids: hashed once per distinct value (``IdCodes``), and looked up in a table's
``Vocabulary`` (row 0 missing, then the unseen values' rows, then the vocabulary by descending
training count).

Every value (string or integer) is hashed to 64 bits by pandas' stable SipHash of the value
(``id_codes``), so a value hashes the same in every batch, process and run; hexadecimal ids
(``hex``) are read as the numbers they write, ``identity`` ids are rows already. A vocabulary is a
sorted hash array: a lookup is a vectorised ``searchsorted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.schema import DatasetSchema
from recsys.data.schema_columns import SparseColumn
from recsys.prepare import vocab
from recsys.prepare.values import as_list, is_text, one_array, row_numbers


@dataclass(frozen=True)
class IdCodes:
    """A column's ids as distinct values and indices: ``hashes [d]`` (uint64) of the distinct
    values, ``index [n]`` each row's value, ``missing [n]`` (null or ``""``). Lookups and counts
    run over the ``d`` distinct values, then are taken per row."""

    hashes: np.ndarray
    index: np.ndarray
    missing: np.ndarray
    wrong: np.ndarray | None = None  # per distinct value: not a hex id (``hex`` columns)

    def bad_rows(self) -> np.ndarray:
        """Per value ``[n]``: holds something ``wrong`` (a bad hex id)."""
        if self.wrong is None or len(self.wrong) == 0:
            return np.zeros(len(self.index), bool)
        return self.per_row(self.wrong, False)

    def per_row(self, per_value: np.ndarray, fill: Any = 0) -> np.ndarray:
        """``per_value [d]`` taken for every row, ``fill`` where missing."""
        if len(per_value) == 0:
            return np.full(len(self.index), fill, per_value.dtype)
        out = per_value[self.index]
        out[self.missing] = fill
        return out


def id_codes(arr: pa.Array, hex_ids: bool = False, identity: bool = False) -> IdCodes:
    """The ``IdCodes`` of string or integer ids: pandas' stable SipHash of each distinct value
    (so the same value hashes the same in every batch, process and run). ``hex_ids``: text ids
    are hexadecimal numbers, hashed as the numbers they write (a bad one is a ``ValueError``;
    ``column_problem`` finds it first). Null and ``""`` are missing; so is every row of a
    column of Arrow's ``null`` type. ``identity``: the values themselves, not hashed (ids that
    are rows already)."""
    arr = one_array(arr)
    n = len(arr)
    if n == 0 or pa.types.is_null(arr.type):
        return IdCodes(np.zeros(0, np.uint64), np.zeros(n, np.int64), np.ones(n, bool))
    enc = arr if pa.types.is_dictionary(arr.type) else pc.dictionary_encode(arr)
    dictionary = enc.dictionary
    wrong = None
    if hex_ids and is_text(dictionary.type):
        numbers, blank, wrong = _hex(dictionary)
        wrong &= ~blank
        values: np.ndarray = numbers.view(np.int64)
    elif identity and is_text(dictionary.type):
        values, blank, wrong = row_numbers(dictionary)
    elif is_text(dictionary.type) or pa.types.is_binary(dictionary.type):
        values = dictionary.to_numpy(zero_copy_only=False).astype(object)
        blank = values == ""
    else:
        values = dictionary.to_numpy(zero_copy_only=False).astype(np.int64)
        blank = np.zeros(len(values), bool)
    if identity:
        hashes = values.astype(np.uint64)
    else:
        hashes = pd.util.hash_array(values, categorize=False).astype(np.uint64)
    indices = enc.indices
    missing = indices.is_null().to_numpy(zero_copy_only=False)
    idx = pc.fill_null(indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(hashes) == 0:
        return IdCodes(hashes, np.zeros(n, np.int64), np.ones(n, bool))
    return IdCodes(hashes, idx, missing | blank[idx], wrong)


Codes = dict[str, tuple[IdCodes, Any]]  # a batch's sparse columns: (codes, lengths or None)


def batch_codes(table: pa.Table, schema: DatasetSchema) -> Codes:
    """Every sparse column's ``IdCodes`` of a batch, computed once for the check, the fit and
    the encoding."""
    names = [n for n in schema.roles()["sparse"] if n in table.column_names]
    return {name: sparse_codes(table, name, schema.id_spec(name)) for name in names}


def hash_ids(arr: pa.Array, hex_ids: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(uint64 hashes [n], missing [n])`` of a column's ids (``id_codes``; 0 where missing)."""
    codes = id_codes(arr, hex_ids)
    return codes.per_row(codes.hashes), codes.missing


_NIBBLE = np.full(256, 255, np.uint8)
_NIBBLE[48:58] = np.arange(10)
_NIBBLE[97:103] = np.arange(10, 16)
_NIBBLE[65:71] = np.arange(10, 16)
MAX_HEX = 16  # digits of a 64-bit id


def _hex(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, blank, wrong)`` of a text array (null: blank): each value's last 16 bytes as
    one row of a ``[n, 16]`` byte window, hex digits to nibbles, packed big-endian into a
    64-bit word (the bytes before a short value are zero digits)."""
    arr = pc.cast(one_array(arr), pa.large_string())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    blank = (lengths == 0) | arr.is_null().to_numpy(zero_copy_only=False)
    padded = np.concatenate([np.zeros(MAX_HEX, np.uint8), data[: offsets[-1]]])
    window = np.lib.stride_tricks.sliding_window_view(padded, MAX_HEX)[offsets[1:]]  # [n, 16]
    live = np.arange(MAX_HEX) >= (MAX_HEX - np.minimum(lengths, MAX_HEX))[:, None]
    nib = _NIBBLE[window]
    wrong = (lengths > MAX_HEX) | (live & (nib == 255)).any(1)
    digits = np.where(live & (nib != 255), nib, 0).astype(np.uint8)
    packed = np.ascontiguousarray((digits[:, 0::2] << 4) | digits[:, 1::2])  # [n, 8]
    values = packed.view(">u8").ravel().astype(np.uint64)
    return values, blank, wrong


@dataclass
class Vocabulary:
    """One table's vocabulary: row 0 is missing, rows ``1..oov_buckets`` unseen values (an
    unseen value's hash picks ``1 + hash % oov_buckets``), and ``hashes[i]`` (a value's 64-bit
    hash) has row ``1 + oov_buckets + i``."""

    hashes: np.ndarray  # uint64 [V], in row order (descending training count)
    oov_buckets: int = 1

    def __post_init__(self) -> None:
        self._order = np.argsort(self.hashes, kind="stable")
        self._sorted = self.hashes[self._order]

    @property
    def rows(self) -> int:
        return 1 + self.oov_buckets + len(self.hashes)

    @classmethod
    def build(cls, values: np.ndarray, counts: np.ndarray, min_count: int,
              max_size: int | None = None, oov_buckets: int = 1) -> Vocabulary:  # fmt: skip
        kept = vocab.build((values, counts), min_count, max_size)
        return cls(kept.astype(np.uint64), oov_buckets)

    def ids(self, hashes: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``hashes`` (uint32): the vocabulary's row, an unseen value's OOV row, or 0
        where ``missing``."""
        unseen = (1 + hashes % np.uint64(self.oov_buckets)).astype(np.int64)
        if len(self._sorted) == 0:
            out = unseen
        else:
            pos = np.minimum(np.searchsorted(self._sorted, hashes), len(self._sorted) - 1)
            found = self._sorted[pos] == hashes
            out = np.where(found, self._order[pos] + 1 + self.oov_buckets, unseen)
        if missing is not None:
            out = np.where(missing, 0, out)
        return out.astype(np.uint32)

    def layout(self) -> dict[str, Any]:
        """Which rows are which (``meta.json``): missing, unseen and vocabulary rows, each
        range ``[first, last]`` (None: no vocabulary value)."""
        n, v = self.oov_buckets, len(self.hashes)
        return {"missing": 0, "unseen": [1, n], "vocabulary": [n + 1, n + v] if v else None}


def sparse_codes(table: pa.Table, name: str, spec: SparseColumn) -> tuple[IdCodes, Any]:
    """``(IdCodes, lengths or None)`` of a sparse column (lists flattened)."""
    return sparse_codes_of(table.column(name), spec)


def sparse_codes_of(col: Any, spec: SparseColumn) -> tuple[IdCodes, Any]:
    if not spec.multi_hot:
        return id_codes(col, spec.hex, spec.identity), None
    flat, lengths = as_list(col, spec)
    return id_codes(flat, spec.hex, spec.identity), lengths


def id_counts(codes: IdCodes, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, counts)`` of the present ids (of the rows where ``rows`` is set)."""
    keep = ~codes.missing if rows is None else rows & ~codes.missing
    counts = np.bincount(codes.index[keep], minlength=len(codes.hashes))
    seen = counts > 0
    return codes.hashes[seen], counts[seen].astype(np.int64)
