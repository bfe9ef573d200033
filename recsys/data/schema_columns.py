"""A dataset schema's columns, each checked on its own (``recsys.data.schema`` checks them
together): ``DenseColumn`` (a number), ``SparseColumn`` (ids, a list of ids, or a time feature
derived from timestamp columns, with its table's vocabulary keys) and ``Sequence`` (a list read as
a sequence); the groups of keys that go together, and ``zone`` (a time zone by its IANA name).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from recsys.config import Pooling
from recsys.configlib import check, check_choices, to_dict

Transform = Literal["log1p", "standardize", "none"]
Derive = Literal["hour", "weekday", "age"]
TimeUnit = Literal["seconds", "minutes", "hours", "days"]


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
        return [k for k in keys if getattr(self, k) != DEFAULTS[k]]

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
            if getattr(self, key) != DEFAULTS[key]:
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
DEFAULTS = {f.name: f.default for f in dataclasses.fields(SparseColumn)}
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
