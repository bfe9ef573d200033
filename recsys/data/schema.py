"""The dataset schema: the user's click-log columns and what each one is, written once (YAML).

Preparation reads it (``recsys-preprocess --schema``), writes it into the prepared folder's
``meta.json`` together with what it fitted (vocabularies, dense statistics), and every later
stage reads it from there: the loader (columns, ragged features), the model (one table per sparse
feature or shared table, its pooling, one head per label), the metrics (one set per task) and
serving (raw rows mapped with the same vocabularies and transforms). Nothing downstream
re-guesses a column.

Example (every key is documented on the dataclasses below)::

    format: parquet                 # parquet | csv
    labels: [click, like]           # one task per label, in this order; values 0/1 (or bool)
    time: event_ts                  # optional: train < validation < test by this column
    split: {val_fraction: 0.1, test_fraction: 0.1}   # by: time here (hash | order | files)
    dense:                          # optional: a log of ids only has none
      price: {transform: log1p}     # log1p | standardize | none; missing -> fill (default 0)
      age:   {transform: standardize, fill: 30}
    sparse:                         # row 0 of every table: missing values
      user_id: {}                   # string or integer ids; a vocabulary (min_count 1)
      item_id: {min_count: 2, max_size: 100000, oov_buckets: 8}   # the 100,000 most frequent
                                    # values seen >= 2 times; the others hashed into 8 OOV rows
      country: {hash_buckets: 64}   # no vocabulary: hashed into 64 rows
      history: {multi_hot: true, max_len: 50, table: item_id}   # a list column, truncated to
                                    # 50, counted; its ids share item_id's table (vocabulary)
      recent: {multi_hot: true, table: item_id,          # a user's history as a sequence: the
               sequence: {max_len: 20, order_by: recent_ts, target: item_id}}   # 20 latest
                                    # items by recent_ts, attended to from item_id (model.sequence)
      tags:    {multi_hot: true, pooling: mean}
      event_hour:    {derive: hour, source: event_ts, time_zone: Europe/Berlin}   # 0-23 there
      event_weekday: {derive: weekday, source: event_ts}         # in UTC; Monday is 0
      item_age: {derive: age, source: event_ts, since: published_ts, unit: days,
                 buckets: [1, 7, 30, 365]}                       # < 1, 1-7, ..., >= 365 days

Delimited text without a header (Criteo's TSV: ``schemas/criteo_kaggle.yaml``) names its columns
in file order::

    format: csv
    csv: {delimiter: "\t", header: false, columns: [label, I1, ..., C26]}
    split: {by: order, val_fraction: 0.05, test_fraction: 0.05}   # the last rows: val, test

Shapes (later stages): ``I`` dense features (``len(dense)``), ``F`` sparse features
(``len(sparse)``, derived ones included), ``L`` labels.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from recsys.config import BadRowPolicy, Pooling
from recsys.configlib import ConfigError, check, check_choices, from_dict, nearest, to_dict
from recsys.data.schema_columns import (
    DEFAULTS,
    VOCABULARY_KEYS,
    DenseColumn,
    Sequence,
    SparseColumn,
)

Format = Literal["parquet", "csv"]
SplitBy = Literal["auto", "hash", "time", "order", "files"]
SCHEMAS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "schemas")


@dataclass
class SplitSpec:
    """How rows become training, validation and test rows (``by``).

    - ``time`` (the default with a ``time`` column): the rows with the latest ``test_fraction``
      of timestamps are test, the ``val_fraction`` before them validation, the rest training
      (cut points from a histogram of the time column over all rows).
    - ``hash`` (the default without one): each row is assigned at random from a stable hash of
      its values and ``seed`` (the same values give the same split whether or not a Parquet writer
      dictionary-encoded a column; a CSV copy of a Parquet file hashes its text, so it may split
      otherwise).
    - ``order``: the input's rows in order (files as given, rows as written): the last
      ``test_fraction`` of them are test, the ``val_fraction`` before them validation (Criteo
      Kaggle). Fractions count input rows, bad ones included.
    - ``files``: whole files: those whose name matches a pattern of ``test_files`` are test, of
      ``val_files`` validation, the rest training (Criteo Terabyte: ``day_23*`` test).

    The exact counts are in ``meta.json``.

    Attributes:
        by: ``auto`` (``time`` with a time column, else ``hash``), ``hash``, ``time``,
            ``order`` or ``files``.
        val_fraction / test_fraction: shares of the rows (not ``files``).
        seed: the hash assignment's seed.
        val_files / test_files: file name patterns (``fnmatch``, on the name without its
            folder) of ``files``.
    """

    by: SplitBy = "auto"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0
    val_files: list[str] = field(default_factory=list)
    test_files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choices(self, "split")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            check(0 <= v < 1, f"split.{name}", v, "must be in [0, 1)")
        total = self.val_fraction + self.test_fraction
        check(total < 1, "split.val_fraction + split.test_fraction", total, "leaves no training")
        named = self.val_files or self.test_files
        if self.by == "files":
            check(bool(named), "split.test_files", self.test_files, "split.by=files names files")
        else:
            check(not named, "split.val_files", named, f"only with split.by=files, not {self.by}")


@dataclass
class CsvOptions:
    """How delimited text (``format: csv``) is read.

    Attributes:
        delimiter: the field separator (``"\t"`` for TSV).
        header: the first line of every file names the columns; ``false``: no header line, and
            ``columns`` names them in file order.
        columns: the column names in file order (needed without a header; with one, must be
            omitted: the header names them).

    A file compressed with gzip (by its first bytes, whatever its name) is decompressed as it
    is read; a plain file is cut into byte ranges at line starts, read in parallel (so a quoted
    field may not hold a line break).
    """

    delimiter: str = ","
    header: bool = True
    columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(len(self.delimiter) == 1, "csv.delimiter", self.delimiter, "must be one character")
        if self.header:
            check(not self.columns, "csv.columns", self.columns, "only with csv.header: false")
        else:
            check(bool(self.columns), "csv.columns", self.columns, "name the columns (no header)")
            dup = sorted({c for c in self.columns if self.columns.count(c) > 1})
            check(not dup, "csv.columns", dup, "names a column twice")


@dataclass
class DatasetSchema:
    """A click-log data set: its files' format and what each used column is.

    Attributes:
        format: ``parquet`` or ``csv`` (delimited text; see ``csv``).
        csv: delimiter, header and column names of ``csv`` files.
        labels: the label columns, one task each, in this order (the first is the primary task:
            ``val_auc`` is its AUC). Values 0/1 or booleans; a null is an error.
        time: an optional timestamp column that orders the split: a timestamp, a date, epoch
            seconds (years 1678-2261: milliseconds are refused) or ISO-8601 text, the rules of
            derived time features' columns; see ``SplitSpec``.
        dense: numeric columns by name, in model order; none at all is fine (a log of ids only:
            DLRM then has no bottom MLP).
        sparse: id and list columns, and derived time features, by name, in model order (at
            least one); one table each, or one per shared table (``SparseColumn.table``).
        split: the split's shares.
        on_bad_row: ``error`` stops at the first bad value naming file, column and row;
            ``skip`` drops such rows and counts them per column in ``meta.json``.
        group_by: an optional column that groups rows for ranking (a user): each evaluation
            then also reports GAUC, each group's AUC weighted by its rows
            (``recsys.metrics.ranking``). Any one-valued column but a label: an id column that
            is also a feature, or one the model does not read; its raw values are kept (a 64-bit
            hash per row, ``groups.npy``), so rare users stay groups of their own where their
            ids share a vocabulary's unseen row. A row without a value is in no group.
    """

    format: Format = "parquet"
    csv: CsvOptions = field(default_factory=CsvOptions)
    labels: list[str] = field(default_factory=list)
    time: str | None = None
    dense: dict[str, DenseColumn] = field(default_factory=dict)
    sparse: dict[str, SparseColumn] = field(default_factory=dict)
    split: SplitSpec = field(default_factory=SplitSpec)
    on_bad_row: BadRowPolicy = "error"
    group_by: str | None = None

    def __post_init__(self) -> None:
        check_choices(self, "schema")
        check(len(self.labels) > 0, "labels", self.labels, "name at least one label column")
        check(len(self.sparse) > 0, "sparse", self.sparse, "name at least one id column")
        self._check_split()
        seen: dict[str, str] = {}
        for role, names in self.roles().items():
            for name in names:
                check(name not in seen, role, name, f"is already used as {seen.get(name)}")
                seen[name] = role
        for name, spec in self.sparse.items():
            if spec.derive is not None:
                self._check_timestamps(name, spec)
            elif spec.table is not None:
                self._check_shared(name, spec)
        for name in self.derived:
            why = "a derived feature's name must not be a column the schema reads"
            check(name not in seen, f"sparse.{name}", name, f"{why} ({seen.get(name)})")
        self._check_pooling()
        self._check_weighted()
        self._check_sequences()
        self._check_group(seen)
        if self.format == "csv" and not self.csv.header:
            absent = [c for c in self.columns() if c not in self.csv.columns]
            check(not absent, "csv.columns", absent, "lacks columns the schema uses")

    def _check_group(self, roles: dict[str, str]) -> None:
        """``group_by`` names a one-valued column that is no label (``roles``: column -> its
        role) nor a derived feature."""
        name = self.group_by
        if name is None:
            return
        check(bool(name), "group_by", name, "name a column, or leave group_by out")
        role = roles.get(name)
        why = {"labels": "a label", "weights": "a list's weights", "orders": "a list's times"}
        check(role not in why, "group_by", name, f"is {why.get(role or '')}: name the column "
              "that groups rows (a user id)")  # fmt: skip
        spec = self.sparse.get(name)
        check(spec is None or spec.derive is None, "group_by", name, "is a derived feature: "
              "name a column of the input")  # fmt: skip
        check(spec is None or not spec.multi_hot, "group_by", name, "is a multi-hot column: "
              "a row's group is one value")  # fmt: skip

    def _check_split(self) -> None:
        by = self.split.by
        if by == "time":
            check(self.time is not None, "split.by", by, "needs a time column (time: <column>)")
        elif self.time is not None:
            check(by == "auto", "split.by", by, f"a time column ({self.time}) splits by time")
        if self.format != "csv":
            check(self.csv == CsvOptions(), "csv", to_dict(self.csv), "only with format: csv")

    def _check_timestamps(self, name: str, spec: SparseColumn) -> None:
        """A derived feature's columns are neither labels nor features without timestamps."""
        for key in ("source", "since"):
            column = getattr(spec, key)
            if column is None:
                continue
            check(column != name, f"sparse.{name}", name, "a derived feature's name must not be "
                  f"a column the schema reads (its own {key})")  # fmt: skip
            other = self.sparse.get(column)
            what = (
                "a label" if column in self.labels
                else "a derived feature" if other is not None and other.derive
                else "a multi-hot column" if other is not None and other.multi_hot
                else "a weight column" if column in self.roles()["weights"]
                else "a sequence's order column" if column in self.roles()["orders"]
                else None
            )  # fmt: skip
            check(what is None, f"sparse.{name}.{key}", column, f"is {what}, not a timestamp")

    def _check_shared(self, name: str, spec: SparseColumn) -> None:
        """``table`` names another column that owns its table; the vocabulary keys agree."""
        owner = spec.table
        key = f"sparse.{name}.table"
        check(owner != name, key, owner, "names the column itself; name another sparse column")
        check(owner in self.sparse, key, owner, f"not a sparse column ({list(self.sparse)})")
        assert owner is not None
        own = self.sparse[owner]
        check(own.derive is None, key, owner, f"sparse.{owner} is derived: it has no ids")
        check(own.table is None, key, owner, f"sparse.{owner} uses sparse.{own.table}'s table "
              f"itself: name that one (no chains)")  # fmt: skip
        for k in VOCABULARY_KEYS:
            mine, theirs = getattr(spec, k), getattr(own, k)
            if mine != DEFAULTS[k] and mine != theirs:
                check(False, f"sparse.{name}.{k}", mine,
                      f"sparse.{name} shares sparse.{owner}'s table, whose vocabulary keys are "
                      f"sparse.{owner}'s ({k}={theirs!r}): set it there")  # fmt: skip

    def _check_pooling(self) -> None:
        """The multi-hot columns of one table pool alike."""
        first: dict[str, str] = {}
        for name, spec in self.sparse.items():
            if not spec.multi_hot:
                continue
            table = self.table_of(name)
            other = first.setdefault(table, name)
            pooled = self.sparse[other].pooling
            check(spec.pooling == pooled, f"sparse.{name}.pooling", spec.pooling,
                  f"sparse.{name} and sparse.{other} share a table ({table}) but pool "
                  f"differently (sparse.{other}.pooling={pooled})")  # fmt: skip

    def _check_weighted(self) -> None:
        """With a weighted list every table pools by sum: one weighted lookup serves them all,
        and TorchRec's (torch's ``EmbeddingBag``) takes weights with sum pooling only."""
        weighted = self.weighted
        if not weighted:
            return
        for name, spec in self.sparse.items():
            check(spec.pooling == "sum", f"sparse.{name}.pooling", spec.pooling,
                  f"with a weighted list (sparse.{weighted[0]}.weights) every table pools by "
                  "sum; a list's mean is its weighted sum with weights 1 / length")  # fmt: skip

    def _check_sequences(self) -> None:
        """A sequence's target is a one-hot id column of the sequence's table."""
        for name, seq in self.sequences.items():
            if seq.target is None:
                continue
            key, target = f"sparse.{name}.sequence.target", seq.target
            check(target in self.sparse and target != name, key, target,
                  f"not another sparse column{nearest(target, list(self.sparse))}")  # fmt: skip
            spec = self.sparse[target]
            check(spec.derive is None and not spec.multi_hot, key, target,
                  "the target is the row's candidate: a one-hot id column")  # fmt: skip
            table, theirs = self.table_of(name), self.table_of(target)
            check(table == theirs, key, target,
                  f"the target must share the sequence's table ({table}) to be compared with "
                  f"its items; sparse.{target} has {theirs}'s: set table: on one of them",
                  )  # fmt: skip

    @property
    def sequences(self) -> dict[str, Sequence]:
        """The sequence columns (``sequence``), by name."""
        return {n: c.sequence for n, c in self.sparse.items() if c.sequence is not None}

    @property
    def weighted(self) -> list[str]:
        """The weighted list columns (``weights``)."""
        return [n for n, c in self.sparse.items() if c.weights is not None]

    @property
    def split_by(self) -> str:
        """The split actually used: ``time``, ``hash``, ``order`` or ``files``."""
        if self.split.by != "auto":
            return self.split.by
        return "time" if self.time is not None else "hash"

    def roles(self) -> dict[str, list[str]]:
        """Column names by role (``labels``, ``time``, ``dense``, ``sparse``: the columns with
        ids; ``weights``: the weighted lists' weights; ``orders``: the sequences' ``order_by``
        lists; ``timestamps``: the derived features' other columns)."""
        roles = {
            "labels": list(self.labels),
            "time": [self.time] if self.time else [],
            "dense": list(self.dense),
            "sparse": [n for n, c in self.sparse.items() if c.derive is None],
            "weights": [c.weights for c in self.sparse.values() if c.weights is not None],
            "orders": [s.order_by for s in self.sequences.values() if s.order_by is not None],
        }
        taken = {c for names in roles.values() for c in names}
        roles["timestamps"] = [c for c in self.timestamps() if c not in taken]
        return roles

    def columns(self) -> list[str]:
        """Every column the preparation reads (``group_by`` too, once)."""
        out = [c for names in self.roles().values() for c in names]
        return [*out, self.group_by] if self.group_by and self.group_by not in out else out

    def timestamps(self) -> list[str]:
        """The columns derived features are computed from (``source``, ``since``), in order."""
        out: list[str] = []
        for spec in self.sparse.values():
            for column in (spec.source, spec.since):
                if column is not None and column not in out:
                    out.append(column)
        return out

    def serving_columns(self) -> list[str]:
        """The raw columns serving maps: dense, ids, and the derived features' timestamps."""
        roles = self.roles()
        names = [*self.dense, *roles["sparse"], *roles["weights"], *roles["orders"]]
        return names + [c for c in self.timestamps() if c not in names]

    @property
    def multi_hot(self) -> list[str]:
        return [n for n, c in self.sparse.items() if c.multi_hot]

    @property
    def derived(self) -> list[str]:
        """The derived (time) features."""
        return [n for n, c in self.sparse.items() if c.derive is not None]

    def table_of(self, name: str) -> str:
        """The column owning ``name``'s table: ``table``, or ``name`` itself when not shared."""
        return self.sparse[name].table or name

    def shared(self) -> dict[str, str]:
        """Each column using another column's table: ``{sharer: owner}``."""
        return {n: c.table for n, c in self.sparse.items() if c.table is not None}

    def table_pooling(self, name: str) -> Pooling:
        """The pooling of ``name``'s table (``pooling_by_table``)."""
        sparse = {
            n: {"pooling": c.pooling, "multi_hot": c.multi_hot} for n, c in self.sparse.items()
        }
        return pooling_by_table(sparse, self.shared())[name]  # type: ignore[return-value]

    def id_spec(self, name: str) -> SparseColumn:
        """``name``'s keys with its table's vocabulary keys (a sharer's are its owner's): how
        its ids are read, hashed and looked up."""
        spec, owner = self.sparse[name], self.table_of(name)
        if owner == name:
            return spec
        table = self.sparse[owner]
        return dataclasses.replace(spec, **{k: getattr(table, k) for k in VOCABULARY_KEYS})

    def has_vocabulary(self, name: str) -> bool:
        """Whether ``name``'s ids go through a fitted vocabulary (neither hashed nor derived)."""
        spec = self.id_spec(name)
        return spec.derive is None and spec.hash_buckets is None

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "schema") -> DatasetSchema:
        """From a plain dict; unknown keys and bad values raise ``ConfigError`` naming them."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping, got {data!r}")
        try:
            data = {
                **data,
                "csv": data.get("csv") or {},
                "dense": _columns(DenseColumn, "dense", data.get("dense")),
                "sparse": _columns(SparseColumn, "sparse", data.get("sparse")),
            }
            return from_dict(cls, data)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str) -> DatasetSchema:
        """A schema file, or the name of a shipped one (``criteo_kaggle``: ``schemas/``)."""
        shipped = os.path.join(SCHEMAS_DIR, f"{path}.yaml")
        if not os.path.isfile(path) and os.sep not in path and os.path.isfile(shipped):
            path = shipped
        if not os.path.isfile(path):
            names = sorted(f[:-5] for f in os.listdir(SCHEMAS_DIR) if f.endswith(".yaml"))
            raise ConfigError(f"{path}: no such schema file (or a shipped one: {names})")
        with open(path) as f:
            try:
                raw = yaml.safe_load(f)
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: not valid YAML: {e}") from None
        return cls.from_dict(raw, path)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def pooling_by_table(sparse: dict[str, Any], shared: dict[str, str]) -> dict[str, str]:
    """Each sparse column's pooling, by name: its table's. A table that columns share
    (``shared``: ``{sharer: owner}``) has one pooling for all its readers: that of its multi-hot
    columns (the schema makes them agree), else its owner's. A one-hot column pools one id, where
    ``sum`` and ``mean`` agree, so a one-hot ``item_id`` takes the ``mean`` of the ``history``
    list that shares its table.

    Args:
        sparse: the sparse columns as ``meta.json`` holds them (``pooling``, ``multi_hot``).
        shared: the folder's ``shared``.
    """
    own = {n: s.get("pooling", "sum") for n, s in sparse.items()}
    table = {n: own[n] for n in sparse if n not in shared}  # owner -> the table's pooling
    for n, s in sparse.items():
        if s.get("multi_hot"):
            table[shared.get(n, n)] = own[n]
    return {n: table.get(shared.get(n, n), own[n]) for n in sparse}


def _columns(cls: type, role: str, entries: Any) -> Any:
    """A role's column entries as ``cls`` (empty entries: the defaults), a bad key or value
    named with its column (``sparse.item_id.min_count``)."""
    if not isinstance(entries, dict):
        return entries or {}
    out = {}
    for name, entry in entries.items():
        if isinstance(entry, cls):
            out[name] = entry
            continue
        if entry is not None and not isinstance(entry, dict):
            raise ConfigError(f"{role}.{name}: expected a mapping, got {entry!r}")
        try:
            out[name] = from_dict(cls, entry or {}, f"{role}.{name}")
        except ConfigError as e:
            raise ConfigError(str(e).replace(f"{role}.<column>", f"{role}.{name}")) from None
    return out
