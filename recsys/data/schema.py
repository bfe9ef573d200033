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
import itertools
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from recsys.config import BadRowPolicy, Pooling
from recsys.configlib import ConfigError, check, check_choices, from_dict, nearest, to_dict

Format = Literal["parquet", "csv"]
Transform = Literal["log1p", "standardize", "none"]
SplitBy = Literal["auto", "hash", "time", "order", "files"]
Derive = Literal["hour", "weekday", "age"]
TimeUnit = Literal["seconds", "minutes", "hours", "days"]
SCHEMAS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "schemas")


@dataclass
class DenseColumn:
    """A numeric column.

    Attributes:
        transform: ``log1p``: ``log(1 + max(x, 0))`` (counts, prices; DLRM's transform of
            Criteo's counts, negatives clamped to 0); ``standardize``: ``(x - mean) / std``
            with mean and std of the training rows; ``none``: as is.
        fill: the raw value that replaces a missing (null, NaN, empty) value, before the
            transform. ``inf`` and ``-inf`` are bad values, not missing ones (``on_bad_row``).
    """

    transform: Transform = "none"
    fill: float = 0.0

    def __post_init__(self) -> None:
        check_choices(self, "dense.<column>")


@dataclass
class Sequence:
    """A list column read as a **sequence** (``SparseColumn.sequence``): its items in order, the
    most recent ``max_len`` kept, each position looked up on its own (not pooled into one bag)
    and pooled by the model (``model.sequence.pooling``: a sum, target attention or a
    transformer over the positions, ``recsys.models.sequence``).

    Attributes:
        max_len: positions kept: each row keeps its ``max_len`` most recent items (the last ones
            in the list's order); the cut rows and ids are counted in ``meta.json``.
        order_by: a list column of numbers as long as the id list (epoch seconds, or any number
            that orders the items; CSV: joined by ``separator``), each item's time: a row's items
            are ordered by it (ties keep the list's order) before the cut. None: the list is
            oldest first as written. A missing time beside an item, a length that differs, a
            value that is not a finite number are bad values.
        target: a one-hot column of the same table (the candidate item of the row), which
            ``attention`` and ``transformer`` pooling compare the history with. None: only
            ``sum`` pooling applies.
    """

    max_len: int = 20
    order_by: str | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        check(self.max_len >= 1, f"{COLUMN}.sequence.max_len", self.max_len, "must be >= 1")


@dataclass
class SparseColumn:
    """A categorical column (one id per row), with ``multi_hot`` a list column (ids per row), or
    with ``derive`` a feature computed from timestamp columns (the hour, the weekday, an age).

    Ids may be strings or integers. Every table's row 0 is **missing**: a null, ``""``, or a
    null or empty element inside a list. With a vocabulary (the default), rows ``1..N``
    (``N = oov_buckets``) are **unseen** values: never seen in the training rows, seen fewer
    than ``min_count`` times, or beyond ``max_size``; with ``N > 1`` a value's stable 64-bit
    hash picks row ``1 + hash % N`` (two unseen values need not collide). The vocabulary
    follows from row ``N + 1`` on, by descending training count (ties by the value's hash):
    ``1 + N + V`` rows. With ``hash_buckets: B`` there is no vocabulary: a value is row
    ``1 + hash % B`` (``B + 1`` rows). With ``identity`` id ``i`` is row ``i mod B``
    (``B`` rows); a missing id is row 0 too, shared with id 0 (the upstream encoding owns the
    rows). ``meta.json`` says which rows are which per feature (``features``).

    **Shared tables** (``table``): the column's ids are rows of another column's table: ONE
    vocabulary fitted on the training values of every column sharing it (joint counts), so a
    value has the same row whichever column it came from. The vocabulary keys (``min_count``,
    ``max_size``, ``oov_buckets``, ``hash_buckets``, ``hex``, ``identity``) are the table's:
    set them on the owner; the multi-hot columns of one table pool alike. Int and string ids
    in one table are refused (``"5"`` and ``5`` are different ids).

    **Time features** (``derive``): no vocabulary, a one-hot feature whose rows are known
    from the keys, computed from timestamp columns at preparation and serving alike (serving
    takes the ``source`` / ``since`` columns, not a column named like the feature). Those
    columns are read but are no features unless declared as well; the ``time`` column may be
    one. A timestamp is a Parquet timestamp (without a time zone: UTC) or date, a number
    (seconds since 1970-01-01 UTC, within the years 1678-2261: milliseconds are bad values)
    or ISO-8601 text (CSV; with or without an offset, without: UTC). Missing is row 0; a
    value that is no timestamp is a bad value (``on_bad_row``).

    - ``hour``: ``1 + hour`` (0-23) in ``time_zone``, daylight saving time included: 25 rows.
    - ``weekday``: ``1 + weekday`` (Monday 0 .. Sunday 6) in ``time_zone``: 8 rows.
    - ``age``: ``source - since`` in ``unit``s, bucketed by the ``buckets`` edges: row
      ``1 + k``, ``k`` the number of edges ``<= age`` (so an age below the first edge,
      negative ones included, is row 1; one at or past the last edge is
      ``len(buckets) + 1``); row 0 when either timestamp is missing: ``len(buckets) + 2``
      rows.

    Attributes:
        min_count: occurrences in the training rows a value needs to get its own row.
        max_size: keep at most this many values (the most frequent, after ``min_count``);
            the others are unseen. None: no cap.
        oov_buckets: rows for unseen values (rows ``1..oov_buckets``); more than one hashes
            unseen values apart. Vocabulary columns only.
        hash_buckets: hash into this many rows (rows ``1..hash_buckets``) instead of building
            a vocabulary.
        multi_hot: the column holds a list of ids per row (Parquet ``list<...>``; CSV: the ids
            joined by ``separator``). Empty lists and missing values are bags of length 0.
        max_len: longer lists keep their first ``max_len`` ids (0: no limit); the truncated
            rows and ids are counted in ``meta.json``.
        pooling: how a bag's embeddings are reduced: ``sum`` or ``mean``.
        separator: list separator in CSV files.
        hex: the ids are hexadecimal numbers (Criteo's 8-digit hashes): each must be 1 to 16
            hex digits (anything else is a bad value naming file, column and row) and is read
            as the number it writes, so ``0a`` and ``A`` are one id.
        identity: the ids are already rows (non-negative integers an upstream pipeline
            encoded): id ``i`` is row ``i mod hash_buckets`` (required), without a vocabulary
            or hashing.
        table: the sparse column whose table this one uses (shared tables, above); that
            column must have its own table (no ``table`` of its own) and not be derived.
        weights: a list column's weight column: per row a list of numbers as long as the id
            list (CSV: joined by ``separator``), each id's weight in the bag's weighted sum
            (dwell times, recency weights). Both lists are cut by ``max_len`` alike; a missing
            weight list beside a non-empty id list, a length that differs, a weight that is not
            a finite number are bad values. A model with weighted lists pools every table by
            ``sum`` (TorchRec's weighted lookup); a list's mean is the weighted sum with
            weights ``1 / length``.
        sequence: a list column read as a sequence (``Sequence``: the most recent ``max_len``
            items, each position its own lookup, ``order_by`` and ``target``); needs
            ``multi_hot: true`` and none of ``max_len``, ``weights`` or ``pooling: mean`` (the
            model pools it: ``model.sequence``).
        derive: a time feature: ``hour``, ``weekday`` or ``age`` (above); its other keys are
            ``source``, ``since``, ``time_zone``, ``unit`` and ``buckets`` only.
        source: ``derive``: the timestamp column the feature is computed from.
        since: ``derive: age``: the earlier timestamp column (the age is ``source - since``).
        time_zone: ``derive: hour | weekday``: an IANA time zone name (``Europe/Berlin``);
            None: UTC.
        unit: ``derive: age``: the age's unit: ``seconds``, ``minutes``, ``hours`` or
            ``days`` (required).
        buckets: ``derive: age``: the bucket edges, strictly increasing, in ``unit``s
            (required).
    """

    min_count: int = 1
    max_size: int | None = None
    oov_buckets: int = 1
    hash_buckets: int | None = None
    multi_hot: bool = False
    max_len: int = 0
    pooling: Pooling = "sum"
    separator: str = "|"
    hex: bool = False
    identity: bool = False
    table: str | None = None
    weights: str | None = None
    sequence: Sequence | None = None
    derive: Derive | None = None
    source: str | None = None
    since: str | None = None
    time_zone: str | None = None
    unit: TimeUnit | None = None
    buckets: list[float] | None = None

    def __post_init__(self) -> None:
        check_choices(self, COLUMN)
        if self.derive is None:
            self._check_ids()
        else:
            self._check_derived()

    def _set(self, keys: tuple[str, ...]) -> list[str]:
        """Those of ``keys`` whose value is not the default."""
        return [k for k in keys if getattr(self, k) != _DEFAULTS[k]]

    def _check_ids(self) -> None:
        p = COLUMN
        for key in self._set(DERIVE_KEYS):
            check(False, f"{p}.{key}", getattr(self, key), "only with derive (a time feature)")
        check(self.min_count >= 1, f"{p}.min_count", self.min_count, "must be >= 1")
        check(self.oov_buckets >= 1, f"{p}.oov_buckets", self.oov_buckets, "must be >= 1")
        if self.max_size is not None:
            check(self.max_size >= 1, f"{p}.max_size", self.max_size, "must be >= 1 (or null)")
        if self.identity:
            why = "identity ids need hash_buckets: the table's rows"
            check(self.hash_buckets is not None, f"{p}.identity", True, why)
        if self.hash_buckets is not None:
            check(self.hash_buckets >= 1, f"{p}.hash_buckets", self.hash_buckets, "must be >= 1")
            other = "identity" if self.identity else "hash_buckets"
            for key in self._set(("max_size", "oov_buckets")):
                check(False, f"{p}.{key}", getattr(self, key),
                      f"not with {p}.{other}: only a vocabulary has unseen values")  # fmt: skip
        check(self.max_len >= 0, f"{p}.max_len", self.max_len, ">= 0 (0: no limit)")
        check(len(self.separator) == 1, f"{p}.separator", self.separator, "1 char")
        if self.weights is not None:
            check(self.multi_hot, f"{p}.weights", self.weights,
                  "weighs the ids of a list: only with multi_hot: true")  # fmt: skip
            check(self.pooling == "sum", f"{p}.weights", self.weights,
                  f"a weighted list pools by sum, not {p}.pooling={self.pooling}")  # fmt: skip
        if self.sequence is not None:
            self._check_sequence()

    def _check_sequence(self) -> None:
        p = f"{COLUMN}.sequence"
        check(self.multi_hot, p, to_dict(self.sequence), "a sequence is a list: multi_hot: true")
        for key, why in (("max_len", "sequence.max_len cuts a sequence (its most recent items)"),
                         ("weights", "a sequence's positions are pooled by the model, unweighted"),
                         ("pooling", "model.sequence.pooling pools a sequence")):  # fmt: skip
            if getattr(self, key) != _DEFAULTS[key]:
                check(False, f"{COLUMN}.{key}", getattr(self, key), f"not with sequence: {why}")

    def _check_derived(self) -> None:
        p, derive = COLUMN, self.derive
        for key in self._set(ID_KEYS):
            check(False, f"{p}.{key}", getattr(self, key),
                  f"not on a derived feature ({p}.derive={derive}): it is one-hot, its rows "
                  "known from derive")  # fmt: skip
        check(self.source is not None, f"{p}.source", None, f"derive: {derive} needs a column")
        if derive == "age":
            check(self.time_zone is None, f"{p}.time_zone", self.time_zone,
                  "not with derive: age (a duration has no time zone)")  # fmt: skip
            for key in ("since", "unit", "buckets"):
                check(getattr(self, key) is not None, f"{p}.{key}", None, "derive: age needs it")
            edges = self.buckets or []
            ok = len(edges) > 0 and all(math.isfinite(e) for e in edges)
            ok = ok and all(a < b for a, b in itertools.pairwise(edges))
            check(ok, f"{p}.buckets", edges, "needs finite edges in increasing order")
            return
        for key in self._set(("since", "unit", "buckets")):
            check(False, f"{p}.{key}", getattr(self, key), f"only with derive: age, not {derive}")
        if self.time_zone is not None:
            try:
                zone(self.time_zone)
            except ValueError as e:
                check(False, f"{p}.time_zone", self.time_zone, "not an IANA time zone name "
                      f"(e.g. Europe/Berlin, America/New_York, UTC), or this machine has no time "
                      f"zone database (pip install tzdata): {e}")  # fmt: skip

    @property
    def rows(self) -> int | None:
        """A derived feature's table rows (None: a column with ids)."""
        if self.derive == "age":
            return len(self.buckets or []) + 2
        return DERIVED_ROWS[self.derive] + 1 if self.derive else None


def zone(name: str | None) -> tzinfo:
    """The time zone of an IANA name (None or ``UTC``: UTC, needing no time zone database);
    an unknown name is a ``ValueError``."""
    if name is None or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"unknown time zone {name!r}: {e}") from None


COLUMN = "sparse.<column>"  # a column's keys in messages (from_dict names the column)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SparseColumn)}
VOCABULARY_KEYS = ("min_count", "max_size", "oov_buckets", "hash_buckets", "hex", "identity")
ID_KEYS = (
    *VOCABULARY_KEYS,
    "multi_hot",
    "max_len",
    "pooling",
    "separator",
    "table",
    "weights",
    "sequence",
)
DERIVE_KEYS = ("source", "since", "time_zone", "unit", "buckets")
DERIVED_ROWS = {"hour": 24, "weekday": 7}  # values; the table adds the missing row
UNIT_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}


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
    """

    format: Format = "parquet"
    csv: CsvOptions = field(default_factory=CsvOptions)
    labels: list[str] = field(default_factory=list)
    time: str | None = None
    dense: dict[str, DenseColumn] = field(default_factory=dict)
    sparse: dict[str, SparseColumn] = field(default_factory=dict)
    split: SplitSpec = field(default_factory=SplitSpec)
    on_bad_row: BadRowPolicy = "error"

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
        if self.format == "csv" and not self.csv.header:
            absent = [c for c in self.columns() if c not in self.csv.columns]
            check(not absent, "csv.columns", absent, "lacks columns the schema uses")

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
            if mine != _DEFAULTS[k] and mine != theirs:
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
        """Every column the preparation reads."""
        return [c for names in self.roles().values() for c in names]

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
