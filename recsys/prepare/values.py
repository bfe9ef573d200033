"""A column's values read as numbers, lists and timestamps, each reading with the rows whose
values are bad: what the checks, the split, the fit and the encoding read a batch's columns with
(``recsys.prepare.encode`` names them all).

A timestamp (``epoch_seconds``) is a Parquet timestamp (without a time zone: UTC) or date, a
number of epoch seconds, or text (a number, or ISO-8601): the split's time column and the derived
time features' columns are read alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.schema_columns import SparseColumn


def one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one array (a chunked column's chunks combined)."""
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def is_text(tp: pa.DataType) -> bool:
    return bool(pa.types.is_string(tp) or pa.types.is_large_string(tp))


def is_list(tp: pa.DataType) -> bool:
    return bool(pa.types.is_list(tp) or pa.types.is_large_list(tp))


def plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one array of its values' type: dictionary-encoded columns (pandas'
    ``category``) decoded, so every reading of a value is the same however a writer stored it."""
    arr = one_array(arr)
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


def row_numbers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(int64 values, blank, wrong)`` of ``identity`` ids: integers as they are, text parsed
    as a whole decimal number (exactly: not through floats); negative or other text is wrong."""
    arr = one_array(arr)
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
