"""A later period prepared like an earlier one (``recsys-preprocess --like PREPARED``): the earlier
folder's schema, vocabularies, dense statistics, id types and transforms, read back
(``load_fitted``, which serving reads too), so a model trained on the earlier folder reads the new
one unchanged: a known id keeps its row, an unseen one goes to the unseen rows (counted per
feature and split in ``meta.json``'s ``unseen``), derived features and sequences are computed as
before, and the dense columns are transformed with the earlier training rows' statistics.

The new files must have the columns the schema reads, each of the type it had: an id column whose
ids were integers and are text now (or the other way) would hash every id apart from its earlier
self, so it is refused naming the column (``check_types``), as is a column gone missing
(``recsys.prepare.sources.inspect``).

``--grow-vocab`` (``grown``): ids seen at least ``min_count`` times in the new period's training
rows that the vocabulary lacks take new rows at the end of its table, the most frequent first, up
to ``max_size`` in all; the earlier rows keep their place, so a warm start (``train.init_from``)
loads them and initialises the new ones. ``meta.json``'s ``like`` names the earlier folder and
the rows each table grew by.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.data.errors import DataError
from recsys.data.prepared.meta import OldFormat, read_meta
from recsys.data.schema import DatasetSchema
from recsys.prepare import vocab
from recsys.prepare.fit import BatchStats, Fitted
from recsys.prepare.ids import Vocabulary
from recsys.prepare.splits import SplitPlan


def load_fitted(folder: str) -> Fitted:
    """The preparation's fitted transforms (schema, vocabularies, dense statistics, id types)
    from a prepared folder (or its copy beside an export); a shared table's file is read once.
    A folder of an earlier format is a ``ValueError`` saying to prepare again."""
    try:
        meta = read_meta(folder)
    except OldFormat as e:  # beside an export made from data prepared by an earlier version
        why = "prepare the data again and retrain"
        raise ValueError(f"{folder}: format {e.format!r} of an earlier version; {why}") from None
    schema = DatasetSchema.from_dict(meta["schema"])
    vocabs: dict[str, Vocabulary] = {}
    by_file: dict[str, Vocabulary] = {}
    for name, path in meta["vocab"].items():
        if path not in by_file:
            oov = schema.id_spec(name).oov_buckets
            by_file[path] = Vocabulary(np.load(os.path.join(folder, path)), oov)
        vocabs[name] = by_file[path]
    return Fitted(schema, vocabs, meta["dense_stats"], id_types=meta["id_types"])


def check_types(folder: str, earlier: dict[str, str], now: dict[str, str]) -> None:
    """Each id column's type in the new files (``now``: ``int`` or ``string``, as
    ``recsys.prepare.outputs.column_id_types`` gives them, columns holding no value left out)
    is the one it had in ``folder``
    (``earlier``), or a ``DataError`` names the column and both types."""
    for name, kind in now.items():
        was = earlier.get(name)
        if was is not None and was != kind:
            raise DataError(
                f"column {name!r}: {kind} ids here, {was} ids in {folder} (--like): the same id "
                f"would hash apart from its earlier self; cast the column to {was}"
            )


def check_dense(types: dict[str, pa.DataType | None], schema: DatasetSchema, folder: str) -> None:
    """A dense column the earlier folder read as numbers is not text now (Parquet's types; a text
    file's values are checked one by one)."""
    for name in schema.dense:
        tp = types.get(name)
        if tp is not None and (pa.types.is_string(tp) or pa.types.is_large_string(tp)):
            raise DataError(
                f"column {name!r}: text here, numbers in {folder} (--like): cast it to numbers"
            )


def grown(earlier: Fitted, stats: BatchStats, schema: DatasetSchema, plan: SplitPlan) -> Fitted:
    """``earlier``'s transforms for a new period (its ``plan``), each vocabulary grown by the ids
    the new training rows (``stats``) hold at least ``min_count`` times that it lacks, the most
    frequent first, up to ``max_size`` rows of values in all (no growth without ``stats``)."""
    vocabs: dict[str, Vocabulary] = {}
    for name in schema.sparse:
        if name not in earlier.vocabs:
            continue
        table = schema.table_of(name)
        if table not in vocabs:
            old = earlier.vocabs[table]
            values, counts = stats.counts.get(table, (np.zeros(0, np.uint64), np.zeros(0)))
            vocabs[table] = Vocabulary(grow(old.hashes, (values, counts), schema, table),
                                       old.oov_buckets)  # fmt: skip
        vocabs[name] = vocabs[table]
    return Fitted(schema, vocabs, earlier.dense_stats, plan, dict(earlier.id_types))


def grow(hashes: np.ndarray, counts: vocab.Counts, schema: DatasetSchema, table: str
         ) -> np.ndarray:  # fmt: skip
    """``hashes`` (a vocabulary's values in row order) followed by the new ones ``counts`` keeps
    (``vocab.build``'s order) that it lacks, up to the table's ``max_size`` in all."""
    spec = schema.sparse[table]
    new = vocab.build(counts, spec.min_count).astype(np.uint64)
    new = new[~np.isin(new, hashes)]
    room = len(new) if spec.max_size is None else max(spec.max_size - len(hashes), 0)
    return np.concatenate([hashes, new[:room]]).astype(np.uint64)


def like_meta(folder: str, earlier: Fitted, now: Fitted) -> dict[str, Any]:
    """``meta.json``'s ``like``: the earlier folder, and per table the rows it grew by."""
    rows = {t: now.vocabs[t].rows - earlier.vocabs[t].rows for t in earlier.vocabs
            if t in now.vocabs and earlier.schema.table_of(t) == t}  # fmt: skip
    return {"folder": os.path.abspath(folder), "grown": {t: n for t, n in rows.items() if n}}
