"""The sparse side: embedding tables (their dims, QR compression, dtype, pooling, sharing),
how a batch's ids are laid out (``SparseLayout``), and mixed dims."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from recsys.config.choices import QR_SUFFIX, EmbeddingDType, Pooling, QROperation
from recsys.configlib import (
    check,
    check_choices,
    nearest,
)


@dataclass
class QRConfig:
    """Quotient-remainder compositional embeddings (Shi et al., KDD 2020).

    Attributes:
        threshold: tables with more rows than this (but those of ``whole``) are split into a
            quotient table of ``ceil(rows / collisions)`` rows and a remainder table of
            ``collisions`` rows. ``None`` turns QR off.
        collisions: ``c``; id ``i`` looks up quotient row ``i // c`` and remainder row ``i % c``.
        operation: how the two pooled lookups combine: ``mult`` (elementwise product), ``add``,
            or ``concat`` (quotient gets ``dim - dim // 2`` columns, remainder ``dim // 2``).
        whole: features whose tables are never split, whatever their rows (``recsys-retrain``
            sets it: a table its champion kept whole stays whole when its vocabulary grows past
            ``threshold``). Owners only: a sharer follows its owner's table.
    """

    threshold: int | None = None
    collisions: int = 4
    operation: QROperation = "mult"
    whole: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choices(self, "embeddings.qr")
        if self.threshold is not None:
            check(self.threshold >= 1, "qr.threshold", self.threshold, "must be >= 1 or null")
        check(self.collisions >= 1, "qr.collisions", self.collisions, "must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.threshold is not None

    def applies_to(self, rows: int, owner: str) -> bool:
        """Whether the table of ``rows`` rows that feature ``owner`` owns is QR-split (a
        sharer's: ``EmbeddingConfig.qr_split``)."""
        if owner in self.whole:
            return False
        return self.threshold is not None and rows > self.threshold and self.collisions > 1


@dataclass
class EmbeddingConfig:
    """The embedding tables: one table per sparse feature.

    Attributes:
        num_embeddings: rows of each table, one entry per sparse feature (its length is ``F``).
        dim: the common embedding dim ``D``; also the bottom MLP's output width.
        dims: explicit per-table dims (mixed dims); projected to ``D`` where the interaction needs
            equal dims (``dot``, ``sum``, ``dcn``). Exclusive with ``md_alpha``.
        md_alpha: mixed-dimension rule (Ginart et al.): the smallest table gets ``dim`` and table
            ``i`` gets ``dim * (n_min / n_i) ** md_alpha`` rounded to a power of two, at least
            ``md_min_dim``. ``None``: every table has ``dim``.
        md_min_dim: floor of the MD rule.
        pooling: how a multi-hot bag is reduced: ``sum`` or ``mean``.
        feature_pooling: per-feature pooling by feature name (a prepared data set's schema sets
            it); features not named use ``pooling``.
        feature_names: names of the sparse features; default ``cat_0 .. cat_{F-1}``.
        shared: tables read by more than one feature, ``{feature: owner}``: ``feature`` looks its
            ids up in ``owner``'s table (a user's ``history`` of item ids in ``item_id``'s), so its
            ids must be rows of the owner's vocabulary (a prepared data set's ``meta.json`` says
            which columns hold the same ids, and sets it). One table is built, named after the
            owner (``t_<owner>``; QR: ``t_<owner>_q`` and ``t_<owner>_r``), and trained by every
            feature that reads it; each feature is still pooled on its own. A sharer has its
            owner's rows, dim and pooling; an owner shares no other feature's table (no chains).
        weighted: features whose ids carry weights (a user's ``history`` of item ids with its
            ``history_weights`` dwell times; a prepared data set's schema sets it): a bag pools
            to ``sum_j w_j * E[id_j]``. The collection is then one weighted TorchRec collection:
            every other feature's ids weigh 1, and every table must pool by ``sum`` (torch's
            ``EmbeddingBag`` takes weights with ``sum`` only; a list's mean is a weighted sum
            with weights ``1 / length``). A QR feature's quotient and remainder lookups are each
            weighted (``mult``: ``(sum_j w_j q_j) * (sum_j w_j r_j)``). Sharded training, the
            reference models and the exported model take the weights alike.
        sequences: features read as sequences, ``{feature: max_len}`` (a prepared data set's
            schema sets it: ``sparse.<col>.sequence``): each of the ``max_len`` positions is a
            KJT key of its own, ``feature@0`` the most recent item, ``feature@1`` the one before,
            ..., a bag of one id or, past a row's history, of none, all reading the feature's
            table (its own or, shared, its owner's): the lookups stay unpooled over positions,
            and the model pools them (``model.sequence``).
        sequence_targets: ``{sequence: target}``: the one-hot feature of the same table that
            ``attention`` and ``transformer`` pooling compare the sequence with.
        qr: quotient-remainder options.
        dtype: storage type of the tables (``fp32``, ``fp16`` or ``bf16``), set where the tables
            are defined (``EmbeddingBagConfig.data_type``), never by casting a sharded model.
        init_std: the tables' initial values drawn from ``N(0, init_std^2)`` (the plain recipes'
            ``1e-4``); ``None``: DLRM's ``U(-sqrt(1/rows), sqrt(1/rows))``. Either way a value
            depends only on its table, row and column, never on the plan.
    """

    num_embeddings: list[int] = field(default_factory=lambda: [1000] * 8)
    dim: int = 16
    dims: list[int] | None = None
    md_alpha: float | None = None
    md_min_dim: int = 4
    pooling: Pooling = "sum"
    feature_pooling: dict[str, Pooling] = field(default_factory=dict)
    feature_names: list[str] | None = None
    shared: dict[str, str] = field(default_factory=dict)
    weighted: list[str] = field(default_factory=list)
    sequences: dict[str, int] = field(default_factory=dict)
    sequence_targets: dict[str, str] = field(default_factory=dict)
    qr: QRConfig = field(default_factory=QRConfig)
    dtype: EmbeddingDType = "fp32"
    init_std: float | None = None

    def __post_init__(self) -> None:
        check_choices(self, "embeddings")
        if self.init_std is not None:
            std = self.init_std
            ok = isinstance(std, (int, float)) and math.isfinite(std) and std > 0
            check(ok, "embeddings.init_std", std, "must be a number > 0 (null: DLRM's uniform)")
        n = self.num_embeddings
        check(len(n) > 0, "embeddings.num_embeddings", n, "needs at least one table")
        for i, rows in enumerate(n):
            check(rows >= 1, f"embeddings.num_embeddings[{i}]", rows, "a table needs >= 1 row")
        check(self.dim >= 1, "embeddings.dim", self.dim, "must be >= 1")
        check(self.dim % 4 == 0, "embeddings.dim", self.dim, "FBGEMM kernels need a multiple of 4")
        if self.dims is not None:
            check(self.md_alpha is None, "embeddings.dims", self.dims, "exclusive with md_alpha")
            check(len(self.dims) == len(n), "embeddings.dims", self.dims, f"needs {len(n)} dims")
            for i, d in enumerate(self.dims):
                check(d >= 4 and d % 4 == 0, f"embeddings.dims[{i}]", d, "must be a multiple of 4")
        if self.md_alpha is not None:
            check(0 <= self.md_alpha <= 1, "embeddings.md_alpha", self.md_alpha, "in [0, 1]")
        check(self.md_min_dim >= 4, "embeddings.md_min_dim", self.md_min_dim, "must be >= 4")
        if self.feature_names is not None:
            names = self.feature_names
            check(len(names) == len(n), "embeddings.feature_names", names, f"needs {len(n)} names")
            check(len(set(names)) == len(names), "embeddings.feature_names", names, "duplicates")
        for name in self.feature_pooling:
            check(name in self.names(), "embeddings.feature_pooling", name, "not a feature name")
        self._check_shared()
        self._check_weighted()
        self._check_sequences()
        self._check_whole()
        if self.qr.operation == "concat" and self.qr.enabled:
            for i, d in enumerate(self.table_dims()):
                if self.qr_split(self.names()[i]):
                    check(d % 8 == 0, f"embeddings dim of table {i}", d, "QR concat needs % 8")

    def _check_whole(self) -> None:
        """``qr.whole`` names features that own their tables, once each."""
        whole, names = self.qr.whole, self.names()
        check(len(set(whole)) == len(whole), "embeddings.qr.whole", whole, "duplicates")
        for f in whole:
            check(f in names, "embeddings.qr.whole", f, f"not a feature name{nearest(f, names)}")
            owner = self.shared.get(f)
            why = f"{f!r} reads the table of {owner!r}: name {owner!r}"
            check(owner is None, "embeddings.qr.whole", f, why)

    def _check_shared(self) -> None:
        """Each ``shared`` entry names two features, the second one an owner (no chains, not
        itself), with the same rows, dim and pooling: one table holds both."""
        names = self.names()
        rows = dict(zip(names, self.num_embeddings, strict=True))
        dims = dict(zip(names, self.table_dims(), strict=True))
        for f, owner in self.shared.items():
            key, reads = f"embeddings.shared.{f}", f"{f!r} reads the table of {owner!r}"
            check(f in rows, key, owner, f"{f!r} is not a feature name{nearest(f, names)}")
            why = f"{f!r} would read the table of {owner!r}, which is not a feature name"
            check(owner in rows, key, owner, why + nearest(owner, names))
            check(owner != f, key, owner, f"{f!r} cannot share its own table")
            root = self.shared.get(owner, owner)
            why = f"{reads}, which reads the table of {root!r}: name {root!r} (no chains)"
            check(root == owner, key, owner, why)
            check(rows[f] == rows[owner], "embeddings.num_embeddings", self.num_embeddings,
                  f"{reads}, so it has its rows: {f} {rows[f]}, {owner} {rows[owner]}")  # fmt: skip
            check(dims[f] == dims[owner], "embeddings.dims", self.dims,
                  f"{reads}, so it has its dim: {f} {dims[f]}, {owner} {dims[owner]}")  # fmt: skip
            pf, po = self.pooling_of(f), self.pooling_of(owner)
            why = f"{reads}, so it has its pooling: {f} {pf}, {owner} {po}"
            check(pf == po, "embeddings.feature_pooling", self.feature_pooling, why)

    def _check_weighted(self) -> None:
        """Each ``weighted`` entry names a feature, once; with any, every feature pools by
        ``sum``: one weighted collection hands weights to every table, and torch's
        ``EmbeddingBag`` refuses them with ``mean``."""
        names = self.names()
        for f in self.weighted:
            why = f"{f!r} is not a feature name{nearest(f, names)}"
            check(f in names, "embeddings.weighted", self.weighted, why)
        dup = sorted({f for f in self.weighted if self.weighted.count(f) > 1})
        check(not dup, "embeddings.weighted", self.weighted, f"{dup} named more than once")
        if not self.weighted:
            return
        for f in names:
            if self.pooling_of(f) == "mean":
                key = ("embeddings.feature_pooling" if f in self.feature_pooling
                       else "embeddings.pooling")  # fmt: skip
                value = self.feature_pooling if f in self.feature_pooling else self.pooling
                w = f if f in self.weighted else self.weighted[0]
                why = (
                    f"{f!r} pools by mean, but {w!r} is weighted "
                    "(embeddings.weighted): a weighted collection pools every table by sum "
                    "(torch's EmbeddingBag takes weights with sum only); pool "
                    f"{f!r} by sum (a list's mean is a weighted sum with weights 1/length)"
                )
                check(False, key, value, why)

    def _check_sequences(self) -> None:
        """Sequences name features, not weighted, each at least one position long; a target
        is a feature of the same table."""
        names = self.names()
        for f, length in self.sequences.items():
            key = f"embeddings.sequences.{f}"
            clash = set(names) & set(position_keys(f, length))
            check(not clash, key, length, f"{sorted(clash)} would be both a feature and one of "
                  f"{f!r}'s position keys: rename it")  # fmt: skip
            check(f in names, key, length, f"{f!r} is not a feature name{nearest(f, names)}")
            check(length >= 1, key, length, "a sequence keeps >= 1 position")
            check(f not in self.weighted, "embeddings.weighted", self.weighted,
                  f"{f!r} is a sequence: its positions are not weighted")  # fmt: skip
        for f, target in self.sequence_targets.items():
            key = f"embeddings.sequence_targets.{f}"
            check(
                f in self.sequences, key, target, f"{f!r} is not a sequence (embeddings.sequences)"
            )
            check(target in names and target not in self.sequences, key, target,
                  f"not a one-hot feature name{nearest(target, names)}")  # fmt: skip
            table, theirs = self.shared.get(f, f), self.shared.get(target, target)
            check(table == theirs, key, target,
                  f"{f!r} reads the table of {table!r}, {target!r} that of {theirs!r}: a "
                  "target is compared with the items of its own table")  # fmt: skip

    @property
    def num_features(self) -> int:
        return len(self.num_embeddings)

    def names(self) -> list[str]:
        return self.feature_names or [f"cat_{i}" for i in range(self.num_features)]

    def pooling_of(self, feature: str) -> Pooling:
        return self.feature_pooling.get(feature, self.pooling)

    def qr_split(self, feature: str) -> bool:
        """Whether ``feature``'s table (its owner's, where it shares one) is QR-split."""
        owner = self.shared.get(feature, feature)
        rows = dict(zip(self.names(), self.num_embeddings, strict=True))[owner]
        return self.qr.applies_to(rows, owner)

    def table_dims(self) -> list[int]:
        """The dim of each feature's table (before any projection to ``dim``)."""
        if self.dims is not None:
            return list(self.dims)
        if self.md_alpha is not None:
            return md_dims(self.num_embeddings, self.dim, self.md_alpha, self.md_min_dim)
        return [self.dim] * self.num_features

    @property
    def mixed(self) -> bool:
        return any(d != self.dim for d in self.table_dims())

    def layout(self) -> SparseLayout:
        """How raw ids become the model's input keys (the data path builds batches with it)."""
        qr = {f: self.qr.collisions for f in self.names() if self.qr_split(f)}
        return SparseLayout(self.names(), list(self.num_embeddings), qr, dict(self.sequences))


@dataclass(frozen=True)
class SparseLayout:
    """The sparse input the model reads: one KJT key per feature (a sequence: one per position,
    ``position_keys``), ids taken ``mod rows`` of its table, then each QR feature's ids split
    into quotient ``id // c`` (under its own keys) and remainder ``id % c`` (under ``key +
    QR_SUFFIX``, after all feature keys).

    Attributes:
        names: the F feature names. rows: table rows per feature (before QR).
        qr: ``{feature: collisions}`` of the QR-split features.
        sequences: ``{feature: max_len}`` of the sequences (``EmbeddingConfig.sequences``).
    """

    names: list[str]
    rows: list[int]
    qr: dict[str, int] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)

    def feature_keys(self, feature: str) -> list[str]:
        """``feature``'s KJT keys before the QR split: its name, or a sequence's positions."""
        if feature not in self.sequences:
            return [feature]
        return position_keys(feature, self.sequences[feature])

    def id_keys(self) -> list[str]:
        """Every feature's keys, in feature order (the keys of raw ids: serving's input)."""
        return [k for f in self.names for k in self.feature_keys(f)]

    def split(self) -> dict[str, int]:
        """``{key: collisions}`` of the keys whose ids are QR-split (``qr_split_kjt``)."""
        return {k: self.qr[f] for f in self.names if f in self.qr for k in self.feature_keys(f)}

    def keys(self) -> list[str]:
        return [*self.id_keys(), *(k + QR_SUFFIX for k in self.split())]


POSITION = "@"  # a sequence's position keys: ``history@0`` (the most recent item), ...


def position_keys(feature: str, max_len: int) -> list[str]:
    """A sequence's KJT keys, most recent position first."""
    return [f"{feature}{POSITION}{j}" for j in range(max_len)]


def md_dims(rows: list[int], dim: int, alpha: float, min_dim: int = 4) -> list[int]:
    """Mixed-dimension rule: ``d_i = dim * (n_min / n_i) ** alpha``, rounded to a power of 2.

    The smallest table gets ``dim``; results are clamped to ``[min_dim, dim]``.

    >>> md_dims([10, 1000, 100000], dim=64, alpha=0.5)
    [64, 8, 4]
    """
    n_min = min(rows)
    out = []
    for n in rows:
        d = dim * (n_min / n) ** alpha
        d_pow2 = 2 ** round(math.log2(d))
        out.append(int(min(dim, max(min_dim, d_pow2))))
    return out
