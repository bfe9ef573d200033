"""Typed, validated configs: one small dataclass per concern.

Each component receives only its own piece (the model never sees ``TrainConfig``). A whole
experiment round-trips through a plain dict, which is what Ray Tune hands a trial::

    cfg = ExperimentConfig.from_dict(trial_dict)   # once, at the top of the worker
    trial_dict == cfg.to_dict()

Search spaces address fields by dotted keys (``embeddings.qr.threshold``); see
``ExperimentConfig.all_keys()``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from recsys import archs
from recsys.configlib import (
    ConfigError,
    check,
    check_choices,
    dotted_keys,
    from_dict,
    nearest,
    set_dotted,
    to_dict,
)

Interaction = Literal["dot", "cat", "sum", "dcn"]
TaskSharing = Literal["shared", "mmoe", "ple"]
MLPNorm = Literal["none", "batch", "layer"]
QROperation = Literal["mult", "add", "concat"]
Pooling = Literal["sum", "mean"]
SequencePooling = Literal["sum", "attention", "transformer"]
EmbeddingDType = Literal["fp32", "fp16", "bf16"]
LossKind = Literal["bce", "wbce", "mse"]
Source = Literal["synthetic", "prepared", "torchrec"]
SplitMode = Literal["fraction", "files"]
BadRowPolicy = Literal["error", "skip"]
EmbeddingOptimizer = Literal["exact_rowwise_adagrad", "exact_adagrad", "exact_sgd", "adam"]
EmbeddingDecayMode = Literal["l2", "decoupled"]
DenseOptimizer = Literal["adagrad", "sgd", "adam"]
DenseTables = Literal["dense", "embedding"]
Solver = Literal["sgd", "lbfgs"]
ShardingType = Literal["table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"]
ComputeKernel = Literal["fused", "dense"]
PipelineMode = Literal["auto", "on", "off"]
Mode = Literal["max", "min"]
# validation metrics a run is scored by (gauc: where the data's schema names group_by)
MONITORED = ("auc", "log_loss", "ne", "accuracy", "gauc")
MEAN_TASK = "mean"  # val_<metric>/mean: the average over the tasks

QR_SUFFIX = "__qr_r"  # the KJT key of a QR feature's remainder ids: f"{feature}{QR_SUFFIX}"
INTERACTIONS: tuple[Interaction, ...] = get_args(Interaction)
SHARDING_TYPES: tuple[ShardingType, ...] = get_args(ShardingType)
CUDA_ONLY_SHARDING: tuple[ShardingType, ...] = ("row_wise", "table_row_wise")


@dataclass
class QRConfig:
    """Quotient-remainder compositional embeddings (Shi et al., KDD 2020).

    Attributes:
        threshold: tables with more rows than this are split into a quotient table of
            ``ceil(rows / collisions)`` rows and a remainder table of ``collisions`` rows.
            ``None`` turns QR off.
        collisions: ``c``; id ``i`` looks up quotient row ``i // c`` and remainder row ``i % c``.
        operation: how the two pooled lookups combine: ``mult`` (elementwise product), ``add``,
            or ``concat`` (quotient gets ``dim - dim // 2`` columns, remainder ``dim // 2``).
    """

    threshold: int | None = None
    collisions: int = 4
    operation: QROperation = "mult"

    def __post_init__(self) -> None:
        check_choices(self, "embeddings.qr")
        if self.threshold is not None:
            check(self.threshold >= 1, "qr.threshold", self.threshold, "must be >= 1 or null")
        check(self.collisions >= 1, "qr.collisions", self.collisions, "must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.threshold is not None

    def applies_to(self, rows: int) -> bool:
        """Whether a table of ``rows`` rows is QR-split."""
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
        if self.qr.operation == "concat" and self.qr.enabled:
            for i, d in enumerate(self.table_dims()):
                if self.qr.applies_to(n[i]):
                    check(d % 8 == 0, f"embeddings dim of table {i}", d, "QR concat needs % 8")

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
        qr = {f: self.qr.collisions for f, r in zip(self.names(), self.num_embeddings, strict=True)
              if self.qr.applies_to(r)}  # fmt: skip
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


@dataclass
class ExpertsConfig:
    """Multi-task experts above DLRM's interaction (``model.tasks: mmoe | ple``), in place of
    its top MLP. MMoE (Ma et al., KDD 2018): ``count`` experts (MLPs) read the interaction's
    output; each task mixes them by its own gate (a softmax over the experts of a linear map of
    the same input) and scores the mixture with its own tower (an MLP, then one logit). PLE
    (Tang et al., RecSys 2020): ``levels`` extraction levels, each with ``count`` shared experts
    and ``task_count`` experts of each task; a task's gate mixes its own experts and the shared
    ones, and the shared gate (every level but the last) all experts of the level; a level's
    outputs are the next level's inputs, task by task.

    Attributes:
        count: shared experts (per level for PLE).
        task_count: PLE: each task's own experts per level (at least 1); MMoE has none.
        mlp: each expert's layer widths (``Linear -> norm -> ReLU -> dropout``).
        tower: each task tower's hidden widths; a ``Linear`` to its logit follows.
        levels: PLE: extraction levels (MMoE: one).
    """

    count: int = 4
    task_count: int = 1
    mlp: list[int] = field(default_factory=lambda: [32])
    tower: list[int] = field(default_factory=lambda: [16])
    levels: int = 1

    def __post_init__(self) -> None:
        check(self.count >= 1, "model.experts.count", self.count, "at least one expert")
        check(self.task_count >= 1, "model.experts.task_count", self.task_count, ">= 1")
        check(self.levels >= 1, "model.experts.levels", self.levels, "must be >= 1")
        for name in ("mlp", "tower"):
            widths = getattr(self, name)
            check(len(widths) >= 1, f"model.experts.{name}", widths, "at least one layer")
            for i, w in enumerate(widths):
                check(w >= 1, f"model.experts.{name}[{i}]", w, "layer widths must be >= 1")


@dataclass
class FinalMLPConfig:
    """FinalMLP's two streams and their fusion (``model.arch: finalmlp``; Mao et al., "FinalMLP:
    An Enhanced Two-Stream MLP Model for CTR Prediction", AAAI 2023). Both streams read the
    same input, the dense features and every pooled embedding concatenated (``W`` values); each
    first scales it by its own feature-selection gate, ``2 * sigmoid(gate(c))`` of a learnt
    context vector ``c`` of ``embeddings.dim`` values (``[W]``: one factor per input value).
    Their outputs are fused per head by a bilinear term plus linear ones, summed over the heads:
    one logit per task. ``model.norm`` and ``model.dropout`` apply to the streams' layers.

    Attributes:
        stream1: the first stream's layer widths (``Linear -> norm -> ReLU -> dropout`` each).
        stream2: the second stream's layer widths.
        heads: heads of the bilinear fusion; each stream's last width must divide by it.
        gate: the hidden widths of each stream's gate (its output layer has ``W`` values).
    """

    stream1: list[int] = field(default_factory=lambda: [64, 32])
    stream2: list[int] = field(default_factory=lambda: [64, 32])
    heads: int = 1
    gate: list[int] = field(default_factory=lambda: [32])

    def __post_init__(self) -> None:
        for name in ("stream1", "stream2", "gate"):
            widths = getattr(self, name)
            check(len(widths) >= 1, f"model.finalmlp.{name}", widths, "at least one layer")
            for i, w in enumerate(widths):
                check(w >= 1, f"model.finalmlp.{name}[{i}]", w, "layer widths must be >= 1")
        check(self.heads >= 1, "model.finalmlp.heads", self.heads, "must be >= 1")
        for name in ("stream1", "stream2"):
            last = getattr(self, name)[-1]
            why = f"model.finalmlp.{name}'s last width {last} must divide into the heads"
            check(last % self.heads == 0, "model.finalmlp.heads", self.heads, why)


@dataclass
class SequenceConfig:
    """How DLRM and FinalMLP pool each sequence (``embeddings.sequences``: ``L`` positions of
    ``[B, d]`` lookups, a mask of the positions a row has) into one ``[B, d]`` feature, which
    the interaction then reads as any other (``recsys.models.sequence``). The reference models
    sum the positions always (a multi-hot bag).

    - ``sum``: the positions' sum (a multi-hot bag of the history).
    - ``attention``: DIN's target attention (Zhou et al., KDD 2018): an MLP over each item
      ``e_j``, the target ``t`` (``embeddings.sequence_targets``), ``e_j - t`` and ``e_j * t``
      scores item ``j``, and the output is ``sum_j a_j e_j`` over the row's items, the weights
      not normalised by a softmax (as the paper: their sum keeps the history's intensity).
    - ``transformer``: BST's (Chen et al., 2019) one self-attention layer over the items and the
      target, each with a learnt position embedding (``transformer``: ``TransformerEncoderLayer``,
      post-norm, feed-forward ``4 d``), the row's missing positions masked; the output is the
      target's output vector.

    Attributes:
        pooling: ``sum``, ``attention`` or ``transformer``; the last two need every sequence's
            target.
        attention_mlp: the hidden widths of DIN's scoring MLP (a ``Linear`` to one score
            follows; PReLU activations, as the paper's).
        heads: the transformer's attention heads: each sequence's table dim and
            ``embeddings.dim`` (the width DLRM projects mixed dims to) must divide by it.
    """

    pooling: SequencePooling = "attention"
    attention_mlp: list[int] = field(default_factory=lambda: [36])
    heads: int = 1

    def __post_init__(self) -> None:
        check_choices(self, "model.sequence")
        for i, w in enumerate(self.attention_mlp):
            check(w >= 1, f"model.sequence.attention_mlp[{i}]", w, "layer widths must be >= 1")
        check(self.heads >= 1, "model.sequence.heads", self.heads, "must be >= 1")


@dataclass
class ModelConfig:
    """The model: DLRM, or a reference model (``recsys.models.reference``).

    Attributes:
        arch: a registered architecture (``recsys.archs``): ``dlrm``; ``finalmlp`` (two gated
            MLP streams fused by bilinear heads: ``finalmlp``, with ``dropout`` and ``norm``);
            or a reference built from the same TorchRec tables: ``lr`` (logistic regression: a
            weight per id and per dense feature) or ``fm`` (a factorization machine: those
            linear terms plus the pairwise dot products of ``embeddings.dim``-wide factors). The
            MLP and interaction fields below are DLRM's; an architecture that does not read a
            field ignores it, and a search space may not set it for one.
        num_dense: dense (integer) features per sample, ``I``; ``0``: none (a click log of
            categorical columns only). DLRM then has no bottom MLP (``bottom_mlp`` is unused) and
            its interaction runs over the embeddings alone (``dot``: the pairs among them;
            ``cat``, ``sum``, ``dcn``: over their concatenation or sum); ``lr`` and ``fm`` have no
            dense terms (a bias, the id weights, the pairs of id factors). The dense input is
            then ``[B, 0]`` and ignored.
        bottom_mlp: hidden widths of the bottom MLP; its output layer has width
            ``embeddings.dim`` appended automatically, so dims can be swept freely.
        top_mlp: hidden widths of the top MLP; a final linear layer to one logit per task follows.
            Its input width follows from the interaction.
        interaction: ``dot``, ``cat``, ``sum`` or ``dcn``.
        interaction_itself: ``dot`` only: keep the diagonal (self-interaction) too.
        dcn_layers / dcn_low_rank: depth and rank of the ``dcn`` low-rank cross network.
        dropout: the probability, in ``[0, 1)``, of zeroing an activation while training
            (``torch.nn.Dropout``: the kept ones are scaled by ``1 / (1 - dropout)``; evaluation
            and the exported model use every activation, unscaled). Applied after the activation
            of every layer of the bottom MLP (its ``embeddings.dim``-wide output layer included)
            and of every hidden layer of the top MLP, never after the final layer to the logits;
            with ``interaction: dcn`` also to the cross network's output, before the top MLP.
            ``0``: none. The reference models (``lr``, ``fm``) have no MLP and ignore it; their
            regularisation is weight decay (``optim.embedding_weight_decay``,
            ``optim.weight_decay``).
        norm: a normalisation after each of those MLP layers' ``Linear``, before its ReLU
            (``Linear -> norm -> ReLU -> dropout``): ``none``, ``layer`` (``LayerNorm`` over the
            layer's width: per sample, the same in training, evaluation and export, and on any
            number of workers) or ``batch`` (``BatchNorm1d``: in training each worker normalises
            over its own batch of ``train.batch_size`` rows, never the global one: synchronised
            batch norm is GPU-only in torch, and the statistics of ``train.batch_size`` rows are
            what it sees on any number of workers; a batch of one row cannot be normalised, so
            ``train.batch_size`` must then be at least 2).
            Batch norm keeps running means and variances, which evaluation, checkpoints and the
            exported model (FP32, INT8 or INT4 tables alike: the MLPs are not quantized) use in
            place of a batch's: before every evaluation and every checkpoint the trainer replaces
            each worker's running statistics by their mean over the workers, so every worker
            evaluates the same model and a checkpoint, which stores one copy of them, resumes
            exactly. The reference models ignore it.
        finalmlp: ``model.arch: finalmlp``'s streams, gates and fusion (``FinalMLPConfig``).
        tasks: how DLRM's tasks share the layers above its interaction: ``shared`` (one top MLP,
            then a logit per task: a shared bottom), ``mmoe`` or ``ple`` (experts, a gate and a
            tower per task, in place of the top MLP: ``experts``).
        experts: the experts of ``tasks: mmoe | ple`` (``ExpertsConfig``).
        sequence: how DLRM and FinalMLP pool the sequences (``SequenceConfig``); no sequence:
            unused.
    """

    arch: str = "dlrm"
    num_dense: int = 13
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 32])
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])
    interaction: Interaction = "dot"
    interaction_itself: bool = False
    dcn_layers: int = 2
    dcn_low_rank: int = 16
    dropout: float = 0.0
    norm: MLPNorm = "none"
    finalmlp: FinalMLPConfig = field(default_factory=FinalMLPConfig)
    tasks: TaskSharing = "shared"
    experts: ExpertsConfig = field(default_factory=ExpertsConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)

    def __post_init__(self) -> None:
        check_choices(self, "model")
        archs.get(self.arch)  # a registered architecture (``recsys.archs``)
        check(self.num_dense >= 0, "model.num_dense", self.num_dense, "must be >= 0")
        for name, widths in (("bottom_mlp", self.bottom_mlp), ("top_mlp", self.top_mlp)):
            for i, w in enumerate(widths):
                check(w >= 1, f"model.{name}[{i}]", w, "layer widths must be >= 1")
        check(self.dcn_layers >= 1, "model.dcn_layers", self.dcn_layers, "must be >= 1")
        check(self.dcn_low_rank >= 1, "model.dcn_low_rank", self.dcn_low_rank, "must be >= 1")
        why = "a probability in [0, 1) (0: no dropout)"
        check(0 <= self.dropout < 1, "model.dropout", self.dropout, why)


def model_tables(model: ModelConfig, emb: EmbeddingConfig, num_tasks: int) -> EmbeddingConfig:
    """The tables a model builds: ``emb`` for an architecture that takes the tables as
    configured (DLRM); else one table per feature as DLRM's (same rows, QR, dtype, pooling,
    names) at the architecture's own width (``recsys.archs``: ``lr`` ``LINEAR_WIDTH * T``,
    since FBGEMM needs widths in multiples of 4 and an id's weight for task ``t`` is the sum of
    the columns ``4t..4t+3``; ``fm`` ``D + LINEAR_WIDTH * T``: ``D`` factor columns, then the
    linear ones)."""
    width = archs.get(model.arch).table_width
    if width is None:
        return emb
    return dataclasses.replace(emb, dim=width(emb.dim, num_tasks), dims=None, md_alpha=None)


@dataclass
class TaskConfig:
    """One prediction head: its label column in the data and its weight in the total loss.

    Attributes:
        name: the task's name (a prepared data set's label column); with several tasks its
            metrics are reported as ``val_auc/<name>``, ...
        label_column: the position of its label among the data's labels.
        weight: its weight in the total loss (``loss.task_weights`` sets it by name).
    """

    name: str = "click"
    label_column: int = 0
    weight: float = 1.0

    def __post_init__(self) -> None:
        check(self.label_column >= 0, f"task {self.name}.label_column", self.label_column, ">= 0")
        check(self.weight >= 0, f"task {self.name}.weight", self.weight, "must be >= 0")


@dataclass
class LossConfig:
    """Training loss.

    Attributes:
        kind: ``bce`` (on logits), ``wbce`` (class-weighted bce) or ``mse`` (on probabilities).
        weights: ``(w0, w1)``: the weights of negative and positive samples for ``wbce``, as the
            DLRM reference's ``--loss-weights "w0-w1"``. ``(1, 1)`` equals ``bce``.
        tasks: the heads; the total loss is ``sum_t weight_t * loss_t``. With a prepared data
            set they are its labels, in the schema's order.
        task_weights: task weights by task name (``loss.task_weights.like: 0.5``; sweepable);
            they replace the named tasks' ``weight``.
    """

    kind: LossKind = "bce"
    weights: tuple[float, float] = (1.0, 1.0)
    tasks: list[TaskConfig] = field(default_factory=lambda: [TaskConfig()])
    task_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choices(self, "loss")
        check(len(self.weights) == 2, "loss.weights", self.weights, "needs (w0, w1)")
        check(min(self.weights) >= 0, "loss.weights", self.weights, "weights must be >= 0")
        check(max(self.weights) > 0, "loss.weights", self.weights, "not both zero")
        check(len(self.tasks) >= 1, "loss.tasks", self.tasks, "needs at least one task")
        names = [t.name for t in self.tasks]
        check(len(set(names)) == len(names), "loss.tasks", names, "task names must be unique")
        for name, weight in self.task_weights.items():
            check(name in names, f"loss.task_weights.{name}", weight,
                  f"no such task; the tasks are {names}{nearest(name, names)}")  # fmt: skip
            check(weight >= 0, f"loss.task_weights.{name}", weight, "must be >= 0")
        self.tasks = [
            TaskConfig(t.name, t.label_column, float(self.task_weights.get(t.name, t.weight)))
            for t in self.tasks
        ]
        check(sum(t.weight for t in self.tasks) > 0, "loss.tasks", names, "all weights are 0")

    def names(self) -> list[str]:
        return [t.name for t in self.tasks]


@dataclass
class SyntheticConfig:
    """Synthetic click log with a planted logistic signal (see ``recsys.data.input.synthetic``).

    Attributes:
        num_samples: rows generated in total (before the train/val/test split).
        seed: the generator's seed; same seed, same data.
        positive_rate: target share of positive labels (Criteo: about 0.25).
        zipf_alpha: exponent of the power-law id frequencies.
        signal: strength of the planted signal (logit scale); 0 makes labels pure noise.
        multi_hot: ids per bag (1 = one-hot, as Criteo).
    """

    num_samples: int = 20_000
    seed: int = 0
    positive_rate: float = 0.25
    zipf_alpha: float = 1.1
    signal: float = 2.0
    multi_hot: int = 1

    def __post_init__(self) -> None:
        check(self.num_samples >= 1, "data.synthetic.num_samples", self.num_samples, ">= 1")
        check(0 < self.positive_rate < 1, "data.synthetic.positive_rate", self.positive_rate, "")
        check(self.zipf_alpha > 0, "data.synthetic.zipf_alpha", self.zipf_alpha, "must be > 0")
        check(self.multi_hot >= 1, "data.synthetic.multi_hot", self.multi_hot, "must be >= 1")


@dataclass
class DataConfig:
    """Where samples come from and how they are split.

    Attributes:
        source: ``synthetic`` (generated, ``synthetic``); ``prepared`` (a folder made by
            ``recsys-preprocess`` from click logs, Criteo's included: features, table sizes,
            poolings, dense count and tasks all come from its ``meta.json``
            (``recsys.data.dataset.resolve``), and so does the split); ``torchrec`` (a folder of
            TorchRec's own preprocessed Criteo, ``day_N_{dense,sparse,labels}.npy``).
        paths: the prepared folder (one; a local path, or an object store URI such as
            ``s3://bucket/prepared``), or TorchRec folders in time order.
        split: ``synthetic`` and ``torchrec`` only (a prepared folder is split already):
            ``fraction``: the rows in file order are cut into train / val / test by
            ``val_fraction`` and ``test_fraction``; ``files``: the last day is test, the one
            before it validation (Terabyte: day 23 test, day 22 validation).
        val_fraction / test_fraction: ``split: fraction``: the shares of the rows (the last
            ones, in file order) that are validation and test.
        shuffle: reshuffle each worker's training rows every epoch (seeded); off keeps time order.
        synthetic: generator options when ``source`` is ``synthetic``.
        prefetch: training batches made ahead of the step in a background thread (0: on the
            training thread); the data order and exact resume are the same either way.
        cache_dir: where a worker caches the shards it reads of a prepared folder in an object
            store (``recsys.data.prepared.remote``: only its own rows' shards, shared by the
            workers of a node, free space checked first); empty: ``recsys-data-cache`` in the
            system's temp folder.
        torchrec_dense_min: a folder made by TorchRec's own preprocessing stores dense features
            as ``log(x - min + 2)`` without recording ``min``; it is read off each day's first
            rows unless declared here (``recsys.data.prepared.torchrec_npy``).
        refit: train on the training and the validation rows together, the validation rows
            after the training rows (a chosen configuration trained again on all rows before the
            test period: ``recsys-export --refit``). Its validation metrics are then measured on
            rows it trained on; the test split is its only held-out score.
        group_by: the column that groups rows for ranking, as the prepared folder's schema
            names it (set from its ``meta.json``, like the features): every evaluation then
            also reports GAUC (``val_gauc``, ``val_gauc_left_out``), which a sweep or a retrain
            may then score by; None for other sources.
    """

    source: Source = "synthetic"
    paths: list[str] = field(default_factory=list)
    split: SplitMode = "fraction"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    shuffle: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    prefetch: int = 2
    cache_dir: str = ""
    torchrec_dense_min: int | None = None
    refit: bool = False
    group_by: str | None = None

    def __post_init__(self) -> None:
        check_choices(self, "data")
        check(self.prefetch >= 0, "data.prefetch", self.prefetch, "must be >= 0 (0: off)")
        if self.source != "synthetic":
            check(len(self.paths) > 0, "data.paths", self.paths, f"{self.source} needs paths")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            check(0 <= v < 1, f"data.{name}", v, "must be in [0, 1)")
        check(
            self.val_fraction + self.test_fraction < 1,
            "data.val_fraction + data.test_fraction",
            self.val_fraction + self.test_fraction,
            "leaves no training data",
        )


@dataclass
class OptimConfig:
    """Optimizers and the learning-rate policy.

    Attributes:
        embedding_optimizer: FBGEMM optimizer fused into the embedding backward
            (``exact_rowwise_adagrad``, ``exact_adagrad``, ``exact_sgd``, ``adam``).
        embedding_lr: its learning rate.
        dense_optimizer: optimizer of the MLPs and interaction (``adagrad``, ``sgd``, ``adam``).
        lr: dense learning rate (peak of the schedule).
        eps: epsilon of Adagrad/Adam, both fused and dense.
        warmup_steps: linear warmup from 0 to the peak.
        decay_start_step / decay_steps: polynomial decay (power ``decay_power``) to
            ``end_lr_factor * peak`` over ``decay_steps`` steps, as the DLRM reference's
            ``LRPolicyScheduler``. ``decay_steps = 0`` keeps the peak.
        decay_power: the decay's exponent.
        end_lr_factor: the final learning rate as a share of the peak.
        weight_decay: dense weight decay (the ``dense_optimizer``'s own ``weight_decay``: L2, added
            to the gradient). It also applies to a table trained by the dense optimizer: one whose
            ``sharding`` names ``data_parallel`` or the ``dense`` compute kernel. Such a table is
            trained by ``dense_optimizer`` at ``lr``, not at ``embedding_lr``. The planner never
            makes a table data-parallel on its own (TorchRec's would, for small tables on GPUs).
        embedding_weight_decay: weight decay on the embedding tables, applied by the fused FBGEMM
            optimizer in backward (``0``: none). FBGEMM updates only the rows a batch looks up,
            so a row is decayed at the steps that read it, never in between (a rare id is decayed
            less often than a frequent one). How, by ``embedding_weight_decay_mode``. A table
            trained by the dense optimizer (see ``weight_decay``) gets ``weight_decay`` instead.
            CPU workers need ``embeddings.dtype: fp16`` for it: FBGEMM's CPU kernel for fp32
            tables drops the decay (it is refused there, when the worker shards the model);
            GPU workers apply it to tables of every dtype.
        embedding_weight_decay_mode: ``l2``: ``wd * w`` is added to the row's gradient before the
            optimizer sees it (as ``weight_decay`` does for the dense part): for
            ``exact_rowwise_adagrad``, ``g' = g + wd * w``, the row's state ``+= mean(g'^2)``,
            ``w -= lr * g' / (sqrt(state) + eps)``, ``lr`` the scheduled ``embedding_lr``. ``g``
            is the gradient of the loss's mean over the global batch whatever the number of
            workers (TorchRec divides the workers' sum by their number, as DDP averages the dense
            gradients), so one worker and several regularise alike. ``decoupled``: the row is
            shrunk apart from the gradient, ``w *= 1 - lr * wd`` at each update (AdamW's rule;
            the optimizer's state sees the plain gradient). Which optimizer supports which
            (FBGEMM's kernels):
            ``exact_rowwise_adagrad`` both, ``adam`` ``decoupled`` only, ``exact_adagrad`` and
            ``exact_sgd`` none (refused with ``embedding_weight_decay > 0``).
        dense_tables: which optimizer trains a table held dense (data-parallel, TorchRec's
            ``dense`` kernel: every worker a replica, its whole gradient all-reduced). ``dense``:
            the dense optimizer at ``lr`` with ``weight_decay`` (TorchRec's way; the references'
            dense rule). ``embedding``: the embedding optimizer's own rule at ``embedding_lr``
            with ``embedding_weight_decay``, as torch's optimizers run it on the whole table
            (``adam``: Adam, AdamW with ``decoupled`` decay; ``exact_adagrad``: Adagrad;
            ``exact_rowwise_adagrad``: one Adagrad state per row; ``exact_sgd``: SGD), so a
            table trains by the same keys whether FBGEMM fuses its optimizer or not. A worker
            without FBGEMM's fused Adam (a CPU worker) sets it, with the ``dense`` kernel, for
            ``embedding_optimizer: adam`` (``recsys.distributed.preflight``).
    """

    embedding_optimizer: EmbeddingOptimizer = "exact_rowwise_adagrad"
    embedding_lr: float = 0.05
    dense_optimizer: DenseOptimizer = "adagrad"
    lr: float = 0.05
    eps: float = 1e-8
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    end_lr_factor: float = 0.0
    weight_decay: float = 0.0
    embedding_weight_decay: float = 0.0
    embedding_weight_decay_mode: EmbeddingDecayMode = "l2"
    dense_tables: DenseTables = "dense"

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        check(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        check(self.embedding_lr > 0, "optim.embedding_lr", self.embedding_lr, "must be > 0")
        check(self.eps > 0, "optim.eps", self.eps, "must be > 0")
        for name in ("warmup_steps", "decay_start_step", "decay_steps"):
            check(getattr(self, name) >= 0, f"optim.{name}", getattr(self, name), "must be >= 0")
        if self.decay_steps > 0:
            check(
                self.decay_start_step >= self.warmup_steps,
                "optim.decay_start_step",
                self.decay_start_step,
                f"must be >= warmup_steps ({self.warmup_steps})",
            )
        check(0 <= self.end_lr_factor <= 1, "optim.end_lr_factor", self.end_lr_factor, "in [0,1]")
        check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        self._check_embedding_decay()

    def _check_embedding_decay(self) -> None:
        """``embedding_weight_decay`` a number >= 0 that the embedding optimizer supports in
        ``embedding_weight_decay_mode`` (``EMBEDDING_DECAY_MODES``)."""
        wd, mode = self.embedding_weight_decay, self.embedding_weight_decay_mode
        ok = math.isfinite(wd) and wd >= 0
        check(ok, "optim.embedding_weight_decay", wd, "must be a number >= 0 (0: none)")
        if wd == 0:
            return
        opt = self.embedding_optimizer
        modes = EMBEDDING_DECAY_MODES[opt]
        if not modes:
            why = (
                f"optim.embedding_optimizer={opt!r} has no weight decay in FBGEMM: use "
                "exact_rowwise_adagrad (l2 or decoupled) or adam (decoupled), or 0"
            )
            check(False, "optim.embedding_weight_decay", wd, why)
        why = (
            f"optim.embedding_optimizer={opt!r} with optim.embedding_weight_decay={wd!r} "
            f"supports {' or '.join(modes)} only in FBGEMM"
        )
        check(mode in modes, "optim.embedding_weight_decay_mode", mode, why)
        if mode == "decoupled":
            shrink = self.embedding_lr * wd
            why = (
                f"decoupled decay multiplies a row by 1 - embedding_lr * embedding_weight_decay "
                f"= {1 - shrink:.3g} at each update: embedding_lr * embedding_weight_decay must "
                "be < 1"
            )
            check(shrink < 1, "optim.embedding_weight_decay", wd, why)


# Which weight-decay modes FBGEMM's fused optimizers apply (its optimizer codegen): row-wise
# Adagrad both (``weight_decay_mode`` L2 / DECOUPLE), Adam decoupled only (it takes no mode: ``w -=
# lr * (update + wd * w)``), Adagrad and SGD none (their kernels take no ``weight_decay``).
EMBEDDING_DECAY_MODES: dict[str, tuple[EmbeddingDecayMode, ...]] = {
    "exact_rowwise_adagrad": ("l2", "decoupled"),
    "adam": ("decoupled",),
    "exact_adagrad": (),
    "exact_sgd": (),
}


@dataclass
class TrainConfig:
    """The training loop.

    Attributes:
        batch_size: samples per worker per step (the global batch is ``batch_size * world_size``).
        steps: training steps (the data is cycled by epochs if it runs out). With ``epochs`` set
            it is derived (below) and a value given here is replaced.
        epochs: the budget in epochs instead of steps (0: off, ``steps`` counts; fractions
            allowed). One epoch is the training split once over all workers: ``steps_per_epoch
            = ceil(train_rows / (batch_size * world_size))``; ``steps = ceil(epochs *
            steps_per_epoch)``, and ``eval_every`` and ``checkpoint_every`` both become the
            report interval ``max(1, steps_per_epoch // reports_per_epoch)`` (the last step
            always reports). The workers derive them (``recsys.data.dataset.with_budget``, from
            the training rows and their number), and so does a sweep's driver for its table and
            its trials' status; ASHA counts in epochs (its grace period one epoch, its maximum
            ``epochs``). The budget is in samples: a run resumed on another number of workers
            derives again and trains the samples it has left at its new global batch. Every
            report carries ``epochs_done`` (``samples_seen / train_rows``); patience and the
            kept best checkpoint work as with steps.
        reports_per_epoch: with ``epochs``: evaluate, checkpoint and report this many times per
            epoch (at most once a step).
        eval_every: validate every N steps (0: only at the end; with ``epochs``: derived).
        checkpoint_every: checkpoint and report every N steps (0: only at the end; with
            ``epochs``: derived). Metrics are reported together with a checkpoint, so a restarted
            worker never reports a step twice.
        eval_batches: cap on validation batches per evaluation (0: the whole split).
        seed: seeds model init, data order and RNGs.
        log_every: record the training loss every N steps (reported with the next checkpoint).
        monitor / monitor_mode: the validation metric that scores the run and whether higher
            (``max``) or lower is better: ``val_auc``, ``val_log_loss``, ``val_ne`` or
            ``val_accuracy`` (of the first task), ``val_auc/<task>`` (of one task) or
            ``val_auc/mean`` (the tasks' average). Every report carries its best value so far
            (``best_<monitor>``, ``best_step``), the best checkpoints are kept by it, and a sweep
            sets both from its space's ``metric`` and ``mode``.
        patience: stop early after this many reports with validation metrics whose ``monitor``
            did not improve on the best (0: never); the best checkpoint is kept.
        quiet: no per-step loss lines (sweeps: their progress table shows the trials).
        checkpoint_staging: where a worker stages its checkpoint before Ray uploads it, when the
            run's storage is not a file system (an object store URI); empty: the system's temp
            folder. Its free space is checked before each checkpoint. On a file-system storage
            (a local or mounted path) checkpoints are written there directly, never staged.
        deterministic: GPU workers run deterministic kernels where torch offers them
            (``torch.use_deterministic_algorithms(True, warn_only=True)``,
            ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` for cuBLAS, cuDNN's deterministic mode), so a
            resumed run repeats an uninterrupted one and two runs of one seed agree. FBGEMM's
            ``exact_*`` optimizers and its embedding Adam are deterministic by design (rows are
            sorted before their updates). ``false``: torch's faster defaults. CPU kernels are
            deterministic either way.
        solver: ``sgd``: the optimizers above, a batch a step. ``lbfgs``: a full-batch convex
            solver (``recsys.train.solver``): each step one L-BFGS iteration with a line search
            over the whole training split, minimising the mean loss plus ``optim.weight_decay /
            2`` times the squared parameters but the biases; ``steps`` is then the iteration
            cap and a step that changes the objective by under 1e-9 (relative) ends the run
            (``converged``). Logistic regression only (a convex problem: it starts from zero
            weights and reaches its optimum for each L2 strength), every table a replica
            (``sharding``: ``data_parallel``); ``optim.*`` rates and optimizers are unused.
        init_from: a checkpoint folder (or object store URI) a new run starts from: its weights
            and optimizer state (a warm start: ``recsys-retrain`` sets it to the champion's),
            resharded to this run's plan; a table whose rows grew since (a grown vocabulary)
            gets its saved rows and keeps its new rows' initial values. The run's step, data
            position and scores start afresh; a resumed run starts from its own checkpoint.
            Empty: from its initialisation.
    """

    batch_size: int = 256
    steps: int = 200
    epochs: float = 0.0
    reports_per_epoch: int = 1
    eval_every: int = 100
    checkpoint_every: int = 100
    eval_batches: int = 0
    seed: int = 0
    log_every: int = 20
    monitor: str = "val_auc"
    monitor_mode: Mode = "max"
    patience: int = 0
    quiet: bool = False
    checkpoint_staging: str = ""
    deterministic: bool = True
    solver: Solver = "sgd"
    init_from: str = ""

    def __post_init__(self) -> None:
        check_choices(self, "train")
        monitor_parts(self.monitor)
        check(self.patience >= 0, "train.patience", self.patience, "must be >= 0 (0: off)")
        check(self.batch_size >= 1, "train.batch_size", self.batch_size, "must be >= 1")
        check(self.steps >= 1, "train.steps", self.steps, "must be >= 1")
        ok = math.isfinite(self.epochs) and self.epochs >= 0
        check(ok, "train.epochs", self.epochs, "must be a number >= 0 (0: train.steps counts)")
        rpe = self.reports_per_epoch
        check(rpe >= 1, "train.reports_per_epoch", rpe, "must be >= 1")
        for name in ("eval_every", "checkpoint_every", "eval_batches"):
            check(getattr(self, name) >= 0, f"train.{name}", getattr(self, name), "must be >= 0")
        check(self.log_every >= 1, "train.log_every", self.log_every, "must be >= 1")
        if self.eval_every and self.checkpoint_every:
            check(
                self.eval_every % self.checkpoint_every == 0,
                "train.eval_every",
                self.eval_every,
                f"must be a multiple of train.checkpoint_every ({self.checkpoint_every}): "
                "results are reported with checkpoints",
            )


@dataclass
class TableSharding:
    """Constraints on how one table may be sharded (TorchRec ``ParameterConstraints``).

    Attributes:
        sharding_types: allowed types (``table_wise``, ``column_wise``, ``row_wise``,
            ``table_row_wise``, ``data_parallel``); empty = any of these but ``data_parallel``
            (which the dense optimizer would train: see ``optim.weight_decay``), and on CPU
            ``table_wise`` or ``column_wise``.
        compute_kernels: allowed kernels (``fused``, ``dense``); empty = any.
        min_partition: smallest column-wise shard width.
    """

    sharding_types: list[ShardingType] = field(default_factory=list)
    compute_kernels: list[ComputeKernel] = field(default_factory=list)
    min_partition: int | None = None

    def __post_init__(self) -> None:
        check_choices(self, "sharding.<table>")
        if self.min_partition is not None:
            check(self.min_partition >= 4, "min_partition", self.min_partition, "must be >= 4")


@dataclass
class ShardingConfig:
    """How ``DistributedModelParallel`` may shard the tables; the planner picks within this.

    Attributes:
        default: constraints for every table without its own entry in ``tables``.
        tables: per-table constraints by table name (``t_<feature>``, or ``t_<feature>_q`` /
            ``t_<feature>_r`` for QR tables); a table that features share
            (``embeddings.shared``) is named after its owner.
        pipeline: drive training with TorchRec's ``TrainPipelineSparseDist`` (overlaps input
            distribution with compute on GPU). ``auto``: on GPU only.
    """

    default: TableSharding = field(default_factory=TableSharding)
    tables: dict[str, TableSharding] = field(default_factory=dict)
    pipeline: PipelineMode = "auto"

    def __post_init__(self) -> None:
        check_choices(self, "sharding")


@dataclass
class ExperimentConfig:
    """One trial's whole configuration: a composition of the per-concern configs.

    Attributes:
        name: the experiment's name; ``recsys-train`` names its run after it (unless ``--name``).
    """

    name: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    embeddings: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)

    def __post_init__(self) -> None:
        _, task = monitor_parts(self.train.monitor)
        if task is not None and task != MEAN_TASK:
            names = self.loss.names()
            why = f"no task {task!r}; the tasks are {names} (or 'mean'){nearest(task, names)}"
            check(task in names, "train.monitor", self.train.monitor, why)
        arch = archs.get(self.model.arch)
        archs.check_tables(arch, self.embeddings)
        if arch.check is not None:
            arch.check(self)
        self._check_shared_sharding()
        if arch.table_width is None:  # the references sum a sequence's positions
            self._check_sequence_pooling()
        if self.train.solver == "lbfgs":
            self._check_full_batch()

    def _check_full_batch(self) -> None:
        """``train.solver: lbfgs`` solves a convex problem (logistic regression), passes over
        every worker's rows with every table a replica and needs a deterministic objective (no
        dropout, no batch norm)."""
        arch = self.model.arch
        why = "a convex solver: logistic regression (model.arch: lr) only"
        check(arch == "lr", "train.solver", self.train.solver, f"{why}; model.arch is {arch!r}")
        why = "train.solver=lbfgs passes over the whole split with every table a replica"
        s = self.sharding
        for name, t in [("sharding.default", s.default)] + [
            (f"sharding.tables.{n}", t) for n, t in s.tables.items()
        ]:
            ok = t.sharding_types == ["data_parallel"] or t.compute_kernels == ["dense"]
            check(ok, f"{name}.sharding_types", t.sharding_types, f"{why}: data_parallel only")
        check(s.pipeline != "on", "sharding.pipeline", s.pipeline, f"{why}: no train pipeline")
        m = self.model
        why = "train.solver=lbfgs minimises a deterministic objective"
        check(m.dropout == 0, "model.dropout", m.dropout, f"{why}: 0")
        check(m.norm != "batch", "model.norm", m.norm, f"{why}: none or layer")

    def _check_sequence_pooling(self) -> None:
        """``attention`` and ``transformer`` need each sequence's target; the transformer's
        heads divide each sequence's width."""
        emb, seq = self.embeddings, self.model.sequence
        if not emb.sequences or seq.pooling == "sum":
            return
        for f in emb.sequences:
            why = (
                f"{seq.pooling} pooling compares sequence {f!r} with its target; it has none: "
                f"name one in the schema (sparse.{f}.sequence.target, which sets "
                "embeddings.sequence_targets) or pool it by sum"
            )
            check(f in emb.sequence_targets, "model.sequence.pooling", seq.pooling, why)
        if seq.pooling != "transformer":
            return
        dims = dict(zip(emb.names(), emb.table_dims(), strict=True))
        for f in emb.sequences:
            for d in {dims[f], emb.dim}:
                check(d % seq.heads == 0, "model.sequence.heads", seq.heads,
                      f"sequence {f!r} is {d} wide: the heads must divide it")  # fmt: skip

    def _check_shared_sharding(self) -> None:
        """A constraint on a sharer's table (``sharding.tables.t_history``) names a table that is
        not built: the sharer reads its owner's, which the error names."""
        emb, owners = self.embeddings, set(self.embeddings.names()) - set(self.embeddings.shared)
        built = {f"t_{o}{s}" for o in owners for s in ("", "_q", "_r")}
        for table in self.sharding.tables:
            for f, owner in emb.shared.items():
                for s in ("", "_q", "_r"):
                    if table == f"t_{f}{s}" and table not in built:
                        why = (f"{f!r} reads the table of {owner!r} (embeddings.shared): "
                               f"constrain t_{owner}{s}")  # fmt: skip
                        check(False, "sharding.tables", table, why)

    @property
    def tables(self) -> EmbeddingConfig:
        """The embedding tables this experiment's model builds (``model_tables``)."""
        return model_tables(self.model, self.embeddings, len(self.loss.tasks))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Build from a plain dict (no file is read: a prepared folder's features, table sizes
        and tasks are taken into a config by ``recsys.data.dataset.resolve``)."""
        return from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def all_keys(cls) -> list[str]:
        """All dotted leaf keys (what a search space may address)."""
        return dotted_keys(cls)

    @classmethod
    def sections(cls) -> set[str]:
        """Dotted names of every section (``embeddings``, ``embeddings.qr``, ...)."""
        parts = [k.split(".")[:-1] for k in cls.all_keys()]
        return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)}

    def with_overrides(self, overrides: dict[str, Any]) -> ExperimentConfig:
        """A copy with dotted-key overrides applied and everything re-validated. A key may also
        name a whole section (``sharding.default``) with a mapping as its value."""
        data = self.to_dict()
        valid = self.all_keys() + sorted(self.sections())
        for key, value in overrides.items():
            set_dotted(data, key, value, valid + ([key] if is_map_key(key) else []))
        return ExperimentConfig.from_dict(data)


MAP_KEYS = ("loss.task_weights", "embeddings.feature_pooling", "embeddings.shared")  # by name


def is_map_key(key: str) -> bool:
    """Whether ``key`` addresses one entry of a by-name map (``loss.task_weights.like``)."""
    parent, _, leaf = key.rpartition(".")
    return parent in MAP_KEYS and bool(leaf)


def monitor_parts(monitor: str) -> tuple[str, str | None]:
    """``val_auc/like`` -> ``("auc", "like")``; ``val_ne`` -> ``("ne", None)``; else an error."""
    name, _, task = monitor.partition("/")
    metric = name.removeprefix("val_")
    if not name.startswith("val_") or metric not in MONITORED or (_ and not task):
        options = [f"val_{m}" for m in MONITORED]
        raise ConfigError(
            f"train.monitor={monitor!r}: one of {options}, optionally /<task> or /mean "
            f"(val_auc/like){nearest(name, options)}"
        )
    return metric, task or None


__all__ = [
    "ConfigError",
    "DataConfig",
    "EmbeddingConfig",
    "ExperimentConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "QRConfig",
    "ShardingConfig",
    "SparseLayout",
    "SyntheticConfig",
    "TableSharding",
    "TaskConfig",
    "TrainConfig",
    "md_dims",
]
