"""Per-batch transforms of click-log rows (a pyarrow ``Table`` of schema columns) into the
prepared form: the one implementation that preparation (its tasks, on Ray or in one process) and
serving both call, so training and serving see the same ids and values.

- ``check``: the rows whose values are bad (null or non-0/1 label, text or a list in a numeric
  column, a scalar where a list is declared...), per column, with the first bad value.
- ``split_of``: each row's split (0 train, 1 validation, 2 test) by the time cut points, a
  stable hash of its values, its place in the input or its file (``SplitPlan``).
- ``fit_batch``: statistics of the training rows (id counts per table: the columns sharing a
  table counted together; dense sums).
- ``encode``: dense ``[n, I]`` float32 (filled, transformed), labels ``[n, L]`` int8, and per
  sparse feature the ids (``uint32``: vocabulary rows, hash buckets or derived time rows) with
  per-row lengths.

Ids: every value (string or integer) is first hashed to 64 bits (``hash_ids``: pandas' stable
SipHash of the value, computed once per distinct value in the batch); vocabularies are sorted hash
arrays (``Vocabulary``), so lookups are a vectorised ``searchsorted``. Rows (``SparseColumn``):
0 missing (null, ``""``), ``1..N`` unseen values (``1 + hash % N``), then the vocabulary; hashed
columns ``1 + hash % B``. Time features (``derive``) come from their timestamp columns as epoch
seconds (``epoch_seconds``), converted to local time with the time zone database (``zoneinfo``).
The time column that splits by time is read by the same ``epoch_seconds``, with the same rules: a
column that can split can derive time features, and the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.dense import log1p_counts
from recsys.data.schema import UNIT_SECONDS, DatasetSchema, SparseColumn, zone
from recsys.prepare import vocab

TRAIN, VAL, TEST = 0, 1, 2
SPLIT_NAMES = ("train", "val", "test")


def _array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def is_text(tp: pa.DataType) -> bool:
    return bool(pa.types.is_string(tp) or pa.types.is_large_string(tp))


def is_list(tp: pa.DataType) -> bool:
    return bool(pa.types.is_list(tp) or pa.types.is_large_list(tp))


# ---------------------------------------------------------------------------------------------
# Reading columns as numbers and lists (with the bad rows as a mask)


def plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one array of its values' type: dictionary-encoded columns (pandas'
    ``category``) decoded, so every reading of a value is the same however a writer stored it."""
    arr = _array(arr)
    if pa.types.is_dictionary(arr.type):
        return arr.dictionary_decode()
    if is_list(arr.type) and pa.types.is_dictionary(arr.type.value_type):
        values = arr.values.dictionary_decode()
        return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null())
    return arr


def numeric(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values float64 [n] with NaN for missing, missing [n], bad [n])`` of a numeric, boolean
    or (CSV) text column; text that is not a number is bad, and so are ``inf`` and ``-inf``
    (NaN is missing). A column of Arrow's ``null`` type is missing in every row."""
    arr = plain(arr)
    tp = arr.type
    if pa.types.is_null(tp):
        n = len(arr)
        return np.full(n, np.nan), np.ones(n, bool), np.zeros(n, bool)
    if is_text(tp):
        blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(arr), ""), True)
        arr = pc.if_else(blank, pa.scalar(None, tp), arr)
        try:
            arr = pc.cast(arr, pa.float64())
            bad = np.zeros(len(arr), bool)
        except pa.ArrowInvalid:
            return _numeric_slow(arr)
    elif (
        pa.types.is_boolean(tp)
        or pa.types.is_integer(tp)
        or pa.types.is_floating(tp)
        or pa.types.is_decimal(tp)
    ):
        arr = pc.cast(arr, pa.float64())
        bad = np.zeros(len(arr), bool)
    else:
        return np.full(len(arr), np.nan), np.zeros(len(arr), bool), np.ones(len(arr), bool)
    values = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    missing = np.isnan(values)
    return values, missing, bad | np.isinf(values)


def _numeric_slow(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = np.full(len(arr), np.nan)
    bad = np.zeros(len(arr), bool)
    for i, v in enumerate(arr.to_pylist()):
        if v is None:
            continue
        try:
            out[i] = float(v)
        except ValueError:
            bad[i] = True
    bad |= np.isinf(out)
    return out, np.isnan(out) & ~bad, bad


def as_list(arr: pa.Array, spec: SparseColumn) -> tuple[pa.Array, np.ndarray]:
    """``(flat values, lengths int64 [n])`` of a list column (CSV: text split by the separator);
    a null list is empty, and so is every row of a column of Arrow's ``null`` type."""
    arr = plain(arr)
    if pa.types.is_null(arr.type):
        return pa.array([], pa.string()), np.zeros(len(arr), np.int64)
    if is_text(arr.type):
        arr = pc.split_pattern(arr, spec.separator)
        empty = pc.fill_null(pc.equal(pc.list_value_length(arr), 1), False)
        first_blank = (
            pc.fill_null(pc.equal(pc.list_element(arr, 0), ""), False) if len(arr) else empty
        )
        arr = pc.if_else(pc.and_(empty, first_blank), pa.scalar([], arr.type), arr)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    return pc.list_flatten(arr), lengths.astype(np.int64)


def list_numbers(arr: pa.Array, spec: SparseColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values float64 [nnz], lengths int64 [n], bad [n])`` of a column of number lists (a
    weighted list's weights, a sequence's ``order_by`` times; CSV: joined by
    ``spec.separator``). A row is bad where an element is null or not a finite number in float32
    range, or where the column holds no lists; a null list is empty (``parallel_problem`` then
    compares it with the ids). Bad elements read 0."""
    arr = plain(arr)
    n = len(arr)
    if not (is_list(arr.type) or is_text(arr.type) or pa.types.is_null(arr.type)):
        return np.zeros(0), np.zeros(n, np.int64), np.ones(n, bool)
    flat, lengths = as_list(arr, spec)
    values, missing, bad = numeric(flat)
    with np.errstate(invalid="ignore"):
        wrong = bad | missing | (np.abs(values) > np.finfo(np.float32).max)  # inf as float32
    rows = np.bincount(np.repeat(np.arange(n), lengths)[wrong], minlength=n) > 0
    return np.where(wrong, 0, values), lengths, rows


def list_weights(arr: pa.Array, spec: SparseColumn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``list_numbers`` of a weighted list's weight column (``SparseColumn.weights``), the
    weights as float32."""
    values, lengths, bad = list_numbers(arr, spec)
    return values.astype(np.float32), lengths, bad


WEIGHTS_WHY = "a weight list needs finite numbers (in float32 range), one per id of its list"


ORDER_WHY = "a sequence's order_by list needs finite numbers, one per item of its list"


def parallel_lists(schema: DatasetSchema) -> dict[str, str]:
    """The number lists that go with an id list, item by item: ``{column: its id list}`` (the
    weighted lists' ``weights``, the sequences' ``order_by``)."""
    out = {c.weights: n for n, c in schema.sparse.items() if c.weights is not None}
    for name, seq in schema.sequences.items():
        if seq.order_by is not None:
            out[seq.order_by] = name
    return out


def parallel_problem(
    table: pa.Table, schema: DatasetSchema, codes: Codes | None = None
) -> dict[str, tuple[np.ndarray, str]]:
    """Per number list of ``table`` (``parallel_lists``) whose id list is read too, ``(bad rows,
    why)`` where a row's numbers are not as many as its ids."""
    out = {}
    for column, name in parallel_lists(schema).items():
        if column not in table.column_names or name not in table.column_names:
            continue
        spec = schema.id_spec(name)
        # the id lists' lengths: the batch's codes have them, else the lists (no hashing)
        ids = codes[name][1] if codes and name in codes else as_list(table.column(name), spec)[1]
        numbers = list_numbers(table.column(column), spec)[1]
        bad = ids != numbers
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            what = "weights" if column == schema.sparse[name].weights else "times"
            why = f"must hold as many {what} as {name} has ids, row by row (row {k}: "
            out[column] = (bad, why + f"{ids[k]} ids, {numbers[k]} {what})")
    return out


# ---------------------------------------------------------------------------------------------
# Ids


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
    arr = _array(arr)
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
    arr = pc.cast(_array(arr), pa.large_string())
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


# ---------------------------------------------------------------------------------------------
# Checking rows


TIMESTAMPS = "a timestamp, a date, epoch seconds (years 1678-2261) or ISO-8601 text"
TIMESTAMP_WHY = (
    f"a derived feature's timestamp column needs {TIMESTAMPS} (or null; epoch milliseconds: "
    "divide by 1000)"
)
TIME_WHY = f"the time column needs {TIMESTAMPS} in every row (epoch milliseconds: divide by 1000)"


def column_problem(
    name: str, arr: pa.Array, schema: DatasetSchema, codes: Codes | None = None
) -> tuple[np.ndarray, str]:
    """``(bad rows [n], why)`` of one schema column in a batch (``codes``: the batch's
    ``batch_codes``, which find bad hex ids without a second pass over the values); a column
    that derived features read must hold timestamps too."""
    arr = plain(arr)
    bad, why = _role_problem(name, arr, schema, codes)
    if name not in schema.timestamps():
        return bad, why
    wrong = epoch_seconds(arr)[2]
    if not wrong.any():
        return bad, why
    first = int(np.flatnonzero(bad | wrong)[0])
    return bad | wrong, why if bad[first] else TIMESTAMP_WHY


def _role_problem(
    name: str, arr: pa.Array, schema: DatasetSchema, codes: Codes | None
) -> tuple[np.ndarray, str]:
    n = len(arr)
    if name in schema.labels:
        values, missing, bad = numeric(arr)
        bad = bad | is_list(arr.type) | (~missing & ~np.isin(values, (0.0, 1.0)))
        first = np.flatnonzero(bad | missing)
        if len(first) and missing[first[0]]:
            return bad | missing, "a label is null"
        return bad | missing, "a label must be 0 or 1 (true/false)"
    if name in schema.dense:
        if is_list(arr.type):
            return np.ones(n, bool), "a dense column holds lists, not numbers"
        bad = numeric(arr)[2]
        return bad, "a dense column needs a finite number (or null)"
    if name == schema.time:
        values, missing, bad = epoch_seconds(arr)
        return bad | missing, TIME_WHY
    lists = parallel_lists(schema)
    if name in lists:
        why = WEIGHTS_WHY if name in schema.roles()["weights"] else ORDER_WHY
        return list_numbers(arr, schema.id_spec(lists[name]))[2], why
    if name not in schema.sparse or schema.sparse[name].derive is not None:
        return np.zeros(n, bool), ""  # read for derived features only: checked by the caller
    spec = schema.id_spec(name)
    if pa.types.is_null(arr.type):
        return np.zeros(n, bool), ""  # missing in every row (empty lists)
    csv_text = schema.format == "csv" and is_text(arr.type)  # CSV lists: ids joined by separator
    if spec.multi_hot and not (is_list(arr.type) or csv_text):
        return np.ones(n, bool), "declared multi_hot: true, but holds one value per row, not lists"
    if not spec.multi_hot and is_list(arr.type):
        return np.ones(n, bool), "holds lists; declare it with multi_hot: true"
    tp = arr.type.value_type if is_list(arr.type) else arr.type
    if pa.types.is_floating(tp) or pa.types.is_boolean(tp):
        return np.ones(n, bool), f"ids must be strings or integers, not {tp}"
    if spec.identity and not spec.hex:
        bad = _not_row(arr, spec)
        if bad.any():
            return bad, "identity ids must be non-negative whole numbers"
    if spec.hex and (is_text(tp) or csv_text):
        why = "declared hex: true, but not 1 to 16 hex digits"
        got, lengths = codes[name] if codes and name in codes else sparse_codes_of(arr, spec)
        bad = got.bad_rows()
        if lengths is None:
            return bad, why
        return np.bincount(np.repeat(np.arange(n), lengths)[bad], minlength=n) > 0, why
    return np.zeros(n, bool), ""


def row_numbers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(int64 values, blank, wrong)`` of ``identity`` ids: integers as they are, text parsed
    as a whole decimal number (exactly: not through floats); negative or other text is wrong."""
    arr = _array(arr)
    if not is_text(arr.type):
        values = pc.fill_null(pc.cast(arr, pa.int64()), 0).to_numpy(zero_copy_only=False)
        return values, arr.is_null().to_numpy(zero_copy_only=False), values < 0
    blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(arr), ""), True)
    try:
        cast = pc.cast(pc.if_else(blank, None, arr), pa.int64())
        values = pc.fill_null(cast, 0).to_numpy(zero_copy_only=False)
        wrong = values < 0
    except pa.ArrowInvalid:
        values, wrong = np.zeros(len(arr), np.int64), np.zeros(len(arr), bool)
        for i, v in enumerate(arr.to_pylist()):
            try:
                values[i] = int(v) if v is not None and v.strip() else 0
            except (ValueError, OverflowError):
                wrong[i] = True
        wrong |= values < 0
    blank_np = blank.to_numpy(zero_copy_only=False)
    return values, blank_np, wrong & ~blank_np


def _not_row(arr: pa.Array, spec: SparseColumn) -> np.ndarray:
    """Rows of an ``identity`` column holding something other than a non-negative integer."""
    n = len(arr)
    flat, lengths = as_list(arr, spec) if spec.multi_hot else (arr, np.ones(n, np.int64))
    if pa.types.is_floating(flat.type):
        return np.ones(n, bool)
    bad = row_numbers(flat)[2]
    return np.bincount(np.repeat(np.arange(n), lengths)[bad], minlength=n) > 0


_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
MAX_SECONDS = 9.2e9  # about 2261-07: pandas' nanosecond timestamps end in 2262


def text_seconds(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds float64, missing, bad)`` of text timestamps: a number is epoch seconds,
    other text ISO-8601 (an offset converts to UTC, none is UTC); blank is missing."""
    arr = pc.utf8_trim_whitespace(arr)
    blank = pc.fill_null(pc.equal(arr, ""), True)
    number = pc.fill_null(pc.match_substring_regex(arr, _NUMBER), False)
    numbers = pc.cast(pc.if_else(number, arr, pa.scalar(None, arr.type)), pa.float64())
    values = numbers.to_numpy(zero_copy_only=False).astype(np.float64)
    missing = blank.to_numpy(zero_copy_only=False)
    other = ~number.to_numpy(zero_copy_only=False) & ~missing
    if other.any():
        text = pd.Series(arr.filter(pa.array(other)).to_numpy(zero_copy_only=False))
        stamps = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        values[other] = seconds
    bad = other & np.isnan(values)
    return values, missing, bad


def epoch_seconds(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A timestamp column as float64 ``(seconds since 1970-01-01 UTC, missing, bad)``:
    timestamps by their unit (without a time zone: UTC), dates at midnight UTC, numbers as
    seconds, text as a number or ISO-8601; outside the years 1678-2261 (milliseconds read as
    seconds, say) a value is bad."""
    arr = plain(arr)
    tp, n = arr.type, len(arr)
    if pa.types.is_null(tp):
        return np.full(n, np.nan), np.ones(n, bool), np.zeros(n, bool)
    if pa.types.is_timestamp(tp) or pa.types.is_date(tp):
        if pa.types.is_timestamp(tp):
            per_second = float(_PER_SECOND[tp.unit])
        else:
            per_second = 1 / 86400 if pa.types.is_date32(tp) else 1000.0
        ints = pc.cast(arr, pa.int32() if pa.types.is_date32(tp) else pa.int64())
        values = ints.to_numpy(zero_copy_only=False).astype(np.float64) / per_second
        missing, bad = np.isnan(values), np.zeros(n, bool)
    elif is_text(tp):
        values, missing, bad = text_seconds(arr)
    elif pa.types.is_integer(tp) or pa.types.is_floating(tp) or pa.types.is_decimal(tp):
        values, missing, bad = numeric(arr)
    else:
        return np.full(n, np.nan), np.zeros(n, bool), np.ones(n, bool)
    with np.errstate(invalid="ignore"):
        bad = bad | (~missing & ~(np.abs(values) < MAX_SECONDS))
    return values, missing, bad


def check(
    table: pa.Table, schema: DatasetSchema, codes: Codes | None = None
) -> dict[str, tuple[np.ndarray, str]]:
    """Per schema column of ``table``, ``(bad rows, why)`` for the columns with a bad row."""
    out = {}
    for name in schema.columns():
        if name not in table.column_names:
            continue  # a pass that reads some columns only
        bad, why = column_problem(name, table.column(name), schema, codes)
        if bad.any():
            out[name] = (bad, why)
    for name, (bad, why) in parallel_problem(table, schema, codes).items():
        out[name] = (bad | out[name][0], out[name][1]) if name in out else (bad, why)
    return out


# ---------------------------------------------------------------------------------------------
# Splitting


@dataclass(frozen=True)
class SplitPlan:
    """What assigns rows to splits, fixed before any row is fitted (``DatasetSchema.split_by``).

    Attributes:
        by: ``time``, ``hash``, ``order`` or ``files``.
        cuts: ``time``: ``(val_from, test_from)`` timestamps.
        bounds: ``order``: ``(val_from, test_from)`` input row numbers over all files.
        files: ``files``: each input file's split (``TRAIN``, ``VAL``, ``TEST``).
    """

    by: str
    cuts: tuple[float, float] | None = None
    bounds: tuple[int, int] | None = None
    files: dict[str, int] = field(default_factory=dict)


def split_of(
    table: pa.Table,
    schema: DatasetSchema,
    plan: SplitPlan,
    rows: np.ndarray | None = None,
    path: str = "",
) -> np.ndarray:
    """Each row's split, int8 ``[n]`` (``SplitPlan``): ``rows`` are the batch's input row
    numbers over all files (``order``), ``path`` its file (``files``)."""
    n = table.num_rows
    if plan.by == "time":
        assert schema.time is not None and plan.cuts is not None
        t = epoch_seconds(table.column(schema.time))[0]
        return (t >= plan.cuts[0]).astype(np.int8) + (t >= plan.cuts[1]).astype(np.int8)
    if plan.by == "order":
        assert rows is not None and plan.bounds is not None
        return (rows >= plan.bounds[0]).astype(np.int8) + (rows >= plan.bounds[1]).astype(np.int8)
    if plan.by == "files":
        return np.full(n, plan.files[path], np.int8)
    u = row_hash(table, schema)
    val_from = 1 - schema.split.val_fraction - schema.split.test_fraction
    test_from = 1 - schema.split.test_fraction
    return (u >= val_from).astype(np.int8) + (u >= test_from).astype(np.int8)


def row_hash(table: pa.Table, schema: DatasetSchema) -> np.ndarray:
    """A uniform number in ``[0, 1)`` per row from the split seed and the row's scalar values
    (labels, dense, one-hot ids), as values: a dictionary-encoded column hashes as its values."""
    h = np.full(table.num_rows, np.uint64(schema.split.seed) * np.uint64(0x9E3779B97F4A7C15))
    scalar = [
        *schema.labels,
        *schema.dense,
        *(k for k, c in schema.sparse.items() if not c.multi_hot and c.derive is None),
    ]
    with np.errstate(over="ignore"):
        for name in scalar:
            col = plain(table.column(name))
            if is_text(col.type) or pa.types.is_integer(col.type) or pa.types.is_null(col.type):
                ch, _ = hash_ids(col)
            else:
                ch = pd.util.hash_array(numeric(col)[0], categorize=False).astype(np.uint64)
            h = h * np.uint64(1099511628211) + ch
    return np.asarray((h >> np.uint64(11)).astype(np.float64) / float(1 << 53))


# ---------------------------------------------------------------------------------------------
# Fitting (training rows only) and encoding


@dataclass
class BatchStats:
    """What one batch contributes to the fit: rows per split, id counts per sparse column and
    dense sums over its training rows."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)  # [n, sum, sum of squares, min, max]
    positives: np.ndarray = field(default_factory=lambda: np.zeros((3, 0), np.int64))  # [3, L]

    @staticmethod
    def merge_all(parts: list[BatchStats]) -> BatchStats:
        """The statistics of all ``parts`` at once (one sort per column, not one per part)."""
        out = BatchStats()
        for part in parts:
            out = BatchStats(out.rows + part.rows, positives=_add(out.positives, part.positives),
                             dense=out.dense)  # fmt: skip
            for k, v in part.dense.items():
                out.dense[k] = v if k not in out.dense else _merge_dense(out.dense[k], v)
        for k in {k for p in parts for k in p.counts}:
            got = [p.counts[k] for p in parts if k in p.counts]
            joined = (np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
            out.counts[k] = vocab.merge_counts(joined, (joined[0][:0], joined[1][:0]))
        return out

    def merge(self, other: BatchStats) -> BatchStats:
        return BatchStats.merge_all([self, other])


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.size == 0:
        return b
    return a if b.size == 0 else a + b


def _merge_dense(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.array([a[0] + b[0], a[1] + b[1], a[2] + b[2], min(a[3], b[3]), max(a[4], b[4])])


def filled_dense(table: pa.Table, schema: DatasetSchema, name: str) -> np.ndarray:
    values, missing, _ = numeric(table.column(name))
    return np.where(missing, schema.dense[name].fill, values)


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


def fit_batch(
    table: pa.Table, schema: DatasetSchema, split: np.ndarray, codes: Codes | None = None
) -> BatchStats:
    """The training rows' statistics of a (checked) batch, and every split's positives per
    label (``meta.json``: a split whose label has one class cannot score an AUC)."""
    labels = np.stack([numeric(table.column(c))[0] for c in schema.labels], 1)
    positives = np.stack([(labels[split == s] == 1).sum(0) for s in range(3)]).astype(np.int64)
    stats = BatchStats(np.bincount(split, minlength=3).astype(np.int64), positives=positives)
    train = split == TRAIN
    part = table.filter(pa.array(train))
    for name in schema.sparse:
        if not schema.has_vocabulary(name):
            continue
        got, lengths = codes[name] if codes else sparse_codes(table, name, schema.id_spec(name))
        rows = train if lengths is None else np.repeat(train, lengths)
        counts, table_name = id_counts(got, rows), schema.table_of(name)
        if table_name in stats.counts:  # a shared table: its columns' values counted together
            counts = vocab.merge_counts(stats.counts[table_name], counts)
        stats.counts[table_name] = counts
    for name in schema.dense:
        x = filled_dense(part, schema, name)
        if len(x):
            stats.dense[name] = np.array([len(x), x.sum(), (x * x).sum(), x.min(), x.max()])
    return stats


@dataclass
class Fitted:
    """What preparation learned from the training rows, and everything encoding needs.
    ``vocabs``: per feature with a vocabulary (the columns sharing a table: one object)."""

    schema: DatasetSchema
    vocabs: dict[str, Vocabulary]
    dense_stats: dict[str, dict[str, float]]
    plan: SplitPlan | None = None
    id_types: dict[str, str] = field(default_factory=dict)  # "int" | "string" per id column

    def table_sizes(self) -> list[int]:
        """Rows per feature, in schema order (a sharer's: its table's)."""
        return [self.layout(name)["size"] for name in self.schema.sparse]

    def layout(self, name: str) -> dict[str, Any]:
        """A feature's table (``meta.json`` ``features``): its owner (``table``), how ids
        become rows (``kind``), its ``size`` and which ``rows`` are which (ranges
        ``[first, last]``)."""
        spec = self.schema.id_spec(name)
        out: dict[str, Any] = {"table": self.schema.table_of(name)}
        if spec.derive is not None:
            assert spec.rows is not None
            labels = {"hour": "hour", "weekday": "weekday", "age": "buckets"}
            rows = {"missing": 0, labels[spec.derive]: [1, spec.rows - 1]}
            return {**out, "kind": spec.derive, "size": spec.rows, "rows": rows}
        if spec.identity:
            b = spec.hash_buckets or 0
            rows = {"missing": 0, "identity": [0, b - 1]}  # id i: row i mod b (0: also missing)
            return {**out, "kind": "identity", "size": b, "rows": rows}
        if spec.hash_buckets:
            rows = {"missing": 0, "hashed": [1, spec.hash_buckets]}
            return {**out, "kind": "hash", "size": spec.hash_buckets + 1, "rows": rows}
        v = self.vocabs[name]
        return {**out, "kind": "vocabulary", "size": v.rows, "rows": v.layout()}


@dataclass
class Encoded:
    """A batch in the prepared form: ``dense [n, I]`` float32, ``labels [n, L]`` int8 (or None),
    per sparse feature ``ids`` (uint32, flat) and ``lengths`` (int64 ``[n]``, None: one-hot),
    rows and ids cut by ``max_len`` per feature."""

    dense: np.ndarray
    labels: np.ndarray | None
    ids: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray | None]
    truncated: dict[str, tuple[int, int]]
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # float32, as ``ids``

    def __len__(self) -> int:
        return len(self.dense)

    def take(self, mask: np.ndarray) -> Encoded:
        """The rows where ``mask`` is set."""
        ids: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray | None] = {}
        weights: dict[str, np.ndarray] = {}
        for name, v in self.ids.items():
            lens = self.lengths[name]
            if lens is None:
                ids[name], lengths[name] = v[mask], None
            else:
                flat = np.repeat(mask, lens)
                ids[name], lengths[name] = v[flat], lens[mask]
                if name in self.weights:
                    weights[name] = self.weights[name][flat]
        labels = None if self.labels is None else self.labels[mask]
        return Encoded(self.dense[mask], labels, ids, lengths, self.truncated, weights)


def transform_dense(x: np.ndarray, kind: str, stats: dict[str, float]) -> np.ndarray:
    if kind == "log1p":
        return log1p_counts(x)
    if kind == "standardize":
        return (x - stats["mean"]) / stats["std"]
    return x


def truncate(
    lengths: np.ndarray, max_len: int, last: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(keep mask over the flat values, new lengths)``: each list's first ``max_len`` ids
    (``last``: its last ``max_len``, a sequence's most recent)."""
    if not max_len or len(lengths) == 0 or lengths.max() <= max_len:
        return np.ones(int(lengths.sum()), bool), lengths
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(int(lengths.sum())) - starts
    if last:
        position = np.repeat(lengths, lengths) - 1 - position  # counted from the end
    return position < max_len, np.minimum(lengths, max_len)


def time_order(lengths: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The flat values' order that sorts each list by ``times`` (float ``[nnz]``), ties in the
    list's order, the lists staying where they are."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    return np.lexsort((np.arange(len(times)), times, row))


def encode(
    table: pa.Table, fitted: Fitted, with_labels: bool = True, codes: Codes | None = None
) -> Encoded:
    """A checked batch in the prepared form (``with_labels=False``: serving's rows)."""
    schema = fitted.schema
    dense = np.empty((table.num_rows, len(schema.dense)), np.float32)
    for j, (name, spec) in enumerate(schema.dense.items()):
        x = filled_dense(table, schema, name)
        dense[:, j] = transform_dense(x, spec.transform, fitted.dense_stats.get(name, {}))
    labels = None
    if with_labels:
        labels = np.stack([numeric(table.column(c))[0] for c in schema.labels], 1).astype(np.int8)
    ids: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray | None] = {}
    truncated: dict[str, tuple[int, int]] = {}
    weights: dict[str, np.ndarray] = {}
    seconds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in schema.sparse:
        sparse = schema.id_spec(name)
        if sparse.derive is not None:
            ids[name], lengths[name] = derived_ids(table, sparse, seconds), None
            continue
        got, lens = codes[name] if codes else sparse_codes(table, name, sparse)
        if sparse.hash_buckets:  # identity: id i is row i mod B; hashed: 1 + hash mod B
            first = np.uint64(0 if sparse.identity else 1)
            per_value = (first + got.hashes % np.uint64(sparse.hash_buckets)).astype(np.uint32)
        else:
            per_value = fitted.vocabs[name].ids(got.hashes)
        rows = got.per_row(per_value)
        if sparse.sequence is not None:
            rows, lens = _sequence(table, sparse, rows, lens)
        if lens is not None:
            seq = sparse.sequence
            keep, new = truncate(lens, seq.max_len if seq else sparse.max_len, seq is not None)
            truncated[name] = (int((new < lens).sum()), int(len(keep) - keep.sum()))
            if sparse.weights is not None:  # as many as the ids (checked), cut alike
                weights[name] = list_weights(table.column(sparse.weights), sparse)[0][keep]
            rows, lens = rows[keep], new
        ids[name], lengths[name] = rows, lens
    return Encoded(dense, labels, ids, lengths, truncated, weights)


def _sequence(
    table: pa.Table, spec: SparseColumn, rows: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's ids in time order (``Sequence.order_by``; as written without one)."""
    assert spec.sequence is not None
    if spec.sequence.order_by is None:
        return rows, lens
    times = list_numbers(table.column(spec.sequence.order_by), spec)[0]
    return rows[time_order(lens, times)], lens


def derived_ids(
    table: pa.Table, spec: SparseColumn, seconds: dict[str, tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """A time feature's rows (uint32 ``[n]``, ``SparseColumn``): 0 where a timestamp is
    missing; ``seconds``: the batch's timestamp columns converted so far (filled here)."""
    for column in (spec.source, spec.since):
        if column is not None and column not in seconds:
            values, missing, bad = epoch_seconds(table.column(column))
            seconds[column] = (values, missing | bad)
    assert spec.source is not None
    t, missing = seconds[spec.source]
    out = np.zeros(len(t), np.uint32)
    if spec.derive == "age":
        assert spec.since is not None and spec.unit is not None
        since, gone = seconds[spec.since]
        ok = ~missing & ~gone
        age = (t[ok] - since[ok]) / UNIT_SECONDS[spec.unit]
        edges = np.asarray(spec.buckets, np.float64)
        out[ok] = np.searchsorted(edges, age, side="right") + 1
        return out
    ok = ~missing
    whole = np.floor(t[ok]).astype(np.int64)
    local = pd.to_datetime(whole, unit="s", utc=True).tz_convert(zone(spec.time_zone))
    values = local.hour if spec.derive == "hour" else local.day_of_week
    out[ok] = 1 + np.asarray(values, np.int64)
    return out
