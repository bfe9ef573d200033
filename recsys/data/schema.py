"""The dataset schema: the user's click-log columns and what each one is, written once (YAML).

Preparation reads it (``recsys-preprocess --schema``), writes it into the prepared folder's
``meta.json`` together with what it fitted (vocabulary sizes, dense statistics), and every later
stage reads it from there: the loader (columns, ragged features), the model (one table per sparse
feature, its pooling, one head per label), the metrics (one set per task) and serving (raw rows
mapped with the same vocabularies and transforms). Nothing downstream re-guesses a column.

Example (every key is documented on the dataclasses below)::

    format: parquet                 # parquet | csv
    labels: [click, like]           # one task per label, in this order; values 0/1 (or bool)
    time: event_ts                  # optional: train < validation < test by this column
    split: {val_fraction: 0.1, test_fraction: 0.1}   # by: time here (hash | order | files)
    dense:                          # optional: a log of ids only has none
      price: {transform: log1p}     # log1p | standardize | none; missing -> fill (default 0)
      age:   {transform: standardize, fill: 30}
    sparse:
      user_id: {}                   # string or integer ids; vocabulary (min_count 1)
      item_id: {min_count: 2}       # values seen < 2 times in training share row 0
      country: {hash_buckets: 64}   # no vocabulary: hashed into 64 rows
      history: {multi_hot: true, max_len: 50}      # a list column, truncated to 50, counted
      tags:    {multi_hot: true, pooling: mean}

Delimited text without a header (Criteo's TSV: ``schemas/criteo_kaggle.yaml``) names its columns
in file order::

    format: csv
    csv: {delimiter: "\t", header: false, columns: [label, I1, ..., C26]}
    split: {by: order, val_fraction: 0.05, test_fraction: 0.05}   # the last rows: val, test

Shapes (later stages): ``I`` dense features (``len(dense)``), ``F`` sparse features
(``len(sparse)``), ``L`` labels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from recsys.config import BadRowPolicy, Pooling
from recsys.configlib import ConfigError, check, check_choices, from_dict, to_dict

Format = Literal["parquet", "csv"]
Transform = Literal["log1p", "standardize", "none"]
SplitBy = Literal["auto", "hash", "time", "order", "files"]
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
class SparseColumn:
    """A categorical column (one id per row), or with ``multi_hot`` a list column (ids per row).

    Ids may be strings or integers. With a vocabulary (the default), values seen at least
    ``min_count`` times in the training rows get rows ``1..V`` by descending frequency; rare,
    unseen and missing values share row 0; the table has ``V + 1`` rows. With ``hash_buckets``
    there is no vocabulary: each value is hashed (64-bit, stable) into that many rows.

    Attributes:
        min_count: occurrences in the training rows a value needs to get its own row.
        hash_buckets: hash into this many rows instead of building a vocabulary.
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
    """

    min_count: int = 1
    hash_buckets: int | None = None
    multi_hot: bool = False
    max_len: int = 0
    pooling: Pooling = "sum"
    separator: str = "|"
    hex: bool = False
    identity: bool = False

    def __post_init__(self) -> None:
        check_choices(self, "sparse.<column>")
        if self.identity:
            why = "identity ids need hash_buckets: the table's rows"
            check(self.hash_buckets is not None, "sparse.<column>.identity", True, why)
        check(self.min_count >= 1, "sparse.<column>.min_count", self.min_count, "must be >= 1")
        if self.hash_buckets is not None:
            check(self.hash_buckets >= 1, "hash_buckets", self.hash_buckets, "must be >= 1")
        check(self.max_len >= 0, "sparse.<column>.max_len", self.max_len, ">= 0 (0: no limit)")
        check(len(self.separator) == 1, "sparse.<column>.separator", self.separator, "1 char")


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
        time: an optional timestamp column (integer, float, date or timestamp) that orders the
            split; see ``SplitSpec``.
        dense: numeric columns by name, in model order; none at all is fine (a log of ids only:
            DLRM then has no bottom MLP).
        sparse: id and list columns by name, in model order (at least one); one table each.
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

    @property
    def split_by(self) -> str:
        """The split actually used: ``time``, ``hash``, ``order`` or ``files``."""
        if self.split.by != "auto":
            return self.split.by
        return "time" if self.time is not None else "hash"

    def roles(self) -> dict[str, list[str]]:
        """Column names by role (``labels``, ``time``, ``dense``, ``sparse``)."""
        return {
            "labels": list(self.labels),
            "time": [self.time] if self.time else [],
            "dense": list(self.dense),
            "sparse": list(self.sparse),
        }

    def columns(self) -> list[str]:
        """Every column the preparation reads."""
        return [c for names in self.roles().values() for c in names]

    @property
    def multi_hot(self) -> list[str]:
        return [n for n, c in self.sparse.items() if c.multi_hot]

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "schema") -> DatasetSchema:
        """From a plain dict; unknown keys and bad values raise ``ConfigError`` naming them."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping, got {data!r}")
        data = {
            **data,
            "csv": data.get("csv") or {},
            "dense": {k: v or {} for k, v in (data.get("dense") or {}).items()},
            "sparse": {k: v or {} for k, v in (data.get("sparse") or {}).items()},
        }
        try:
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
