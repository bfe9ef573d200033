"""The model (its arch, interaction, MLPs, experts, FinalMLP, sequences), its tasks and its
loss."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from recsys import archs
from recsys.config.choices import Interaction, LossKind, MLPNorm, SequencePooling, TaskSharing
from recsys.config.embeddings import EmbeddingConfig
from recsys.configlib import (
    check,
    check_choices,
    nearest,
)


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
