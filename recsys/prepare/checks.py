"""Checking a batch's rows: per schema column, the rows whose values are bad (a null or non-0/1
label, text or a list in a numeric column, a scalar where a list is declared, a bad hex id, a
weight list or an order list whose length differs from its ids'...), with why in words.
Preparation stops at, or skips, such rows; serving refuses them alike.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recsys.data.schema import DatasetSchema
from recsys.data.schema_columns import SparseColumn
from recsys.prepare.ids import Codes, sparse_codes_of
from recsys.prepare.values import (
    as_list,
    epoch_seconds,
    is_list,
    is_text,
    list_numbers,
    numeric,
    plain,
    row_numbers,
)

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


def _not_row(arr: pa.Array, spec: SparseColumn) -> np.ndarray:
    """Rows of an ``identity`` column holding something other than a non-negative integer."""
    n = len(arr)
    flat, lengths = as_list(arr, spec) if spec.multi_hot else (arr, np.ones(n, np.int64))
    if pa.types.is_floating(flat.type):
        return np.ones(n, bool)
    bad = row_numbers(flat)[2]
    return np.bincount(np.repeat(np.arange(n), lengths)[bad], minlength=n) > 0


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
