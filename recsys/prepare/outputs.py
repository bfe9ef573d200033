"""What the driver writes beside the shards: the vocabularies and dense statistics fitted from
the pieces' merged statistics (``fitted_from``), the vocabulary files, a few raw example rows (the
served model's input example), and the fields of ``meta.json`` (``meta_of``: the shards' index,
the id types the columns of a table agree on, the label counts, the labels with one class in a
split); ``recsys.data.prepared.meta`` writes the file.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.errors import DataError
from recsys.data.prepared.meta import FORMAT
from recsys.data.schema import DatasetSchema
from recsys.data.schema_columns import SparseColumn
from recsys.prepare.checks import check
from recsys.prepare.fit import BatchStats, Fitted
from recsys.prepare.ids import Vocabulary
from recsys.prepare.passes import PieceFit
from recsys.prepare.sources import Inspection, Piece, read_piece
from recsys.prepare.splits import SPLIT_NAMES, SplitPlan
from recsys.prepare.values import is_list


def fitted_from(stats: BatchStats, schema: DatasetSchema, plan: SplitPlan) -> Fitted:
    vocabs: dict[str, Vocabulary] = {}
    for name in schema.sparse:  # owners before their sharers or after: one vocabulary a table
        if not schema.has_vocabulary(name):
            continue
        table = schema.table_of(name)
        if table not in vocabs:
            spec = schema.sparse[table]
            values, counts = stats.counts.get(table, (np.zeros(0, np.uint64), np.zeros(0)))
            vocabs[table] = Vocabulary.build(values, counts, spec.min_count, spec.max_size,
                                             spec.oov_buckets)  # fmt: skip
        vocabs[name] = vocabs[table]
    dense_stats = {}
    for name in schema.dense:
        n, s, ss, lo, hi = stats.dense.get(name, np.array([0, 0, 0, 0, 0]))
        mean = s / n if n else 0.0
        std = float(np.sqrt(max(ss / n - mean * mean, 0.0))) if n else 1.0
        dense_stats[name] = {"mean": float(mean), "std": std if std > 1e-12 else 1.0,
                             "min": float(lo), "max": float(hi), "count": int(n)}  # fmt: skip
    return Fitted(schema, vocabs, dense_stats, plan)


def write_vocabs(folder: str, fitted: Fitted) -> dict[str, str]:
    """One file per table with a vocabulary (named by its owner's place); per feature with a
    vocabulary, its table's file."""
    schema = fitted.schema
    os.makedirs(os.path.join(folder, "vocab"))
    place = {name: j for j, name in enumerate(schema.sparse)}
    files = {}
    for name in schema.sparse:
        if name not in fitted.vocabs:
            continue
        table = schema.table_of(name)
        files[name] = f"vocab/sparse_{place[table]}.npy"
        if name == table:
            np.save(os.path.join(folder, files[name]), fitted.vocabs[name].hashes)
    return files


def write_examples(folder: str, pieces: list[Piece], schema: DatasetSchema) -> None:
    """A few raw input rows' features (``examples.parquet``): the served model's input example
    (dense values as numbers, ids as the file holds them, a CSV file's lists as lists), from the
    first piece with rows."""
    import pyarrow.parquet as pq

    from recsys.prepare.values import as_list, is_text, numeric

    cols = schema.serving_columns()
    batches = (good(b.table, schema) for p in pieces for b in read_piece(p, schema, cols, []))
    table = next(t for t in batches if t.num_rows).slice(0, 5)
    for name in schema.dense:
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.array(numeric(table.column(name))[0]))
    for name, spec in list_columns(schema).items():  # CSV text lists: as the lists they write
        i = table.column_names.index(name)
        if is_text(table.column(name).type):
            flat, lengths = as_list(table.column(name), spec)
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            table = table.set_column(i, name, pa.ListArray.from_arrays(offsets, flat))
    pq.write_table(table, os.path.join(folder, "examples.parquet"))


def list_columns(schema: DatasetSchema) -> dict[str, SparseColumn]:
    """Every column that holds lists, with the spec that splits its CSV text: the multi-hot
    id columns, their weights and sequence times."""
    out: dict[str, SparseColumn] = {}
    for name, spec in schema.sparse.items():
        if spec.multi_hot and spec.derive is None:
            out[name] = schema.id_spec(name)
            order = spec.sequence.order_by if spec.sequence is not None else None
            for column in (spec.weights, order):
                if column is not None:
                    out.setdefault(column, out[name])
    return out


def good(table: pa.Table, schema: DatasetSchema) -> pa.Table:
    """The rows of ``table`` without a bad value (``skip`` left them out of the output)."""
    bad = np.zeros(table.num_rows, bool)
    for mask, _ in check(table, schema).values():
        bad |= mask
    return table.filter(pa.array(~bad)) if bad.any() else table


def column_id_types(types: dict[str, Any], schema: DatasetSchema) -> dict[str, str]:
    """Per id column, the type its own values hash as (``int`` or ``string``), before a shared
    table's columns are made to agree (``id_types``)."""
    out: dict[str, str] = {}
    for name in schema.roles()["sparse"]:
        inner = _inner(types.get(name))
        out[name] = "int" if inner is not None and pa.types.is_integer(inner) else "string"
    return out  # (hex reads text only)


def _inner(tp: Any) -> Any:
    """A column's value type: a list's items, a dictionary's values."""
    inner = tp.value_type if tp is not None and is_list(tp) else tp
    return inner.value_type if inner is not None and pa.types.is_dictionary(inner) else inner


def holds_nothing(tp: Any) -> bool:
    inner = _inner(tp)
    return inner is not None and pa.types.is_null(inner)


def id_types(types: dict[str, Any], schema: DatasetSchema) -> dict[str, str]:
    """Per id column, the type its ids are hashed as (serving casts raw values to it). The
    columns of a shared table must agree (``5`` and ``"5"`` hash apart); one holding no value
    (Arrow's ``null`` type) takes its table's type."""
    out = column_id_types(types, schema)
    known: dict[str, tuple[str, str]] = {}  # table: (a column with a type, its type)
    for name in out:
        if holds_nothing(types.get(name)):
            continue
        table = schema.table_of(name)
        other, kind = known.setdefault(table, (name, out[name]))
        if kind != out[name]:
            raise DataError(f"columns {other!r} ({kind} ids) and {name!r} ({out[name]} ids) "
                            f"share table {table!r}: ids of one table must be all integers or "
                            "all strings (cast one column)")  # fmt: skip
    for name in out:
        if schema.table_of(name) in known:
            out[name] = known[schema.table_of(name)][1]
    return out


def label_counts(stats: BatchStats, schema: DatasetSchema) -> dict[str, dict[str, Any]]:
    """Rows and positives per split and label."""
    out: dict[str, dict[str, Any]] = {}
    for s, split in enumerate(SPLIT_NAMES):
        rows = int(stats.rows[s])
        pos = stats.positives[s] if stats.positives.size else np.zeros(len(schema.labels))
        out[split] = {lab: {"rows": rows, "positives": int(pos[k])}
                      for k, lab in enumerate(schema.labels)}  # fmt: skip
    return out


def one_class(counts: dict[str, dict[str, Any]]) -> list[str]:
    """A line per split and label whose rows are all of one class (its AUC is undefined)."""
    out = []
    for split, labels in counts.items():
        for lab, c in labels.items():
            if c["rows"] and c["positives"] in (0, c["rows"]):
                cls = 1 if c["positives"] else 0
                out.append(f"label {lab!r} has one class in {split} ({c['rows']:,} rows, all "
                           f"{cls}): its AUC there cannot be computed")  # fmt: skip
    return out


def unseen_of(shards: dict[str, list[dict[str, Any]]], fitted: Fitted) -> dict[str, Any]:
    """Per split and feature with a vocabulary, the ids that went to its unseen rows (values
    the vocabulary lacks: rarer than ``min_count``, beyond ``max_size``, or new)."""
    names = [n for n in fitted.schema.sparse if n in fitted.vocabs]
    return {s: {n: sum(x.get("unseen", {}).get(n, 0) for x in shards[s]) for n in names}
            for s in SPLIT_NAMES}  # fmt: skip


def meta_of(
    schema: DatasetSchema, files: list[str], fitted: Fitted, fit: PieceFit,
    written: list[dict[str, Any]], vocab_files: dict[str, str], seen: Inspection,
) -> dict[str, Any]:  # fmt: skip
    """The prepared folder's ``meta.json``: the schema, the sources, the rows and ids per split,
    the shards' index (from the pieces' ``written``), what was skipped and truncated, the split,
    the label counts, what was fitted, the features' tables, and the warnings."""
    shards: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLIT_NAMES}
    truncated: dict[str, dict[str, int]] = {}
    for w in written:
        for s, shard in w["shards"].items():
            if shard["rows"]:
                shards[s].append(shard)
        for k, (rows, ids) in w["truncated"].items():
            t = truncated.setdefault(k, {"rows": 0, "ids": 0})
            t["rows"], t["ids"] = t["rows"] + rows, t["ids"] + ids
    plan = fitted.plan
    assert plan is not None
    counts = label_counts(fit.stats, schema)
    return {
        "format": FORMAT,
        "schema": schema.to_dict(),
        "sources": files,
        "rows": {s: sum(x["rows"] for x in shards[s]) for s in SPLIT_NAMES},
        "ids": {
            s: {n: sum(x["ids"][n] for x in shards[s]) for n in schema.sparse} for s in SPLIT_NAMES
        },
        "unseen": unseen_of(shards, fitted),
        "shards": shards,
        "skipped": {
            **fit.skips.columns,
            **({"lines": len(fit.skips.lines)} if fit.skips.lines else {}),
        },
        "truncated": truncated,
        "split": {
            "by": plan.by,
            "time_cuts": list(plan.cuts) if plan.cuts else None,
            "row_bounds": list(plan.bounds) if plan.bounds else None,
        },
        "label_counts": counts,
        "dense_stats": fitted.dense_stats,
        "feature_names": list(schema.sparse),
        "table_sizes": fitted.table_sizes(),
        "shared": schema.shared(),
        "features": {name: fitted.layout(name) for name in schema.sparse},
        "vocab": vocab_files,
        "id_types": fitted.id_types,
        "labels": list(schema.labels),
        "warnings": seen.warnings() + one_class(counts),
    }
