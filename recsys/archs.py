"""The architectures ``model.arch`` names, each registered once (``ARCHS``).

An entry says everything the layers above need to know of a model without importing it: its
builder (``module:Class``, imported by ``recsys.models.build`` when a model is built), the
``model.*`` keys it reads (what a search space may sweep for it; a key it does not read is
refused), the width of its tables (``None``: the embeddings as configured, mixed dims
included), whether it reads whole rows (QR ``concat`` refused), its own check of a config, and,
for a reference model that a sweep trains as a bar (``baselines``), its default grid.

Adding a model is one module in ``recsys/models/`` (``Class(model, embeddings, num_tasks,
embedding_device=..., init_seed=...)``, ``forward(dense [B, I], kjt) -> logits [B, T]``) plus
one ``register`` call here; docs/extending.md walks through it with the tests to copy.

Pure: this module imports no torch and no other ``recsys`` module than ``configlib``, so that
``recsys.config`` can check ``model.arch`` against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recsys.configlib import ConfigError, check, nearest

LINEAR_WIDTH = 4  # a reference model's weight of an id for a task: the sum of a row's 4 columns


@dataclass(frozen=True)
class Arch:
    """One architecture.

    Attributes:
        name: the ``model.arch`` value.
        builder: ``"module:Class"``; the class takes ``(model, embeddings, num_tasks,
            embedding_device=..., init_seed=...)`` and maps ``(dense [B, I], kjt)`` to logits
            ``[B, T]``.
        summary: one line for errors and the docs.
        reads: the ``model.*`` keys (besides ``model.arch`` and ``model.num_dense``) it reads.
        table_width: ``(embeddings.dim, tasks) -> width`` of every table it builds; ``None``:
            the tables as ``embeddings`` configures them (mixed dims allowed).
        whole_rows: it reads whole rows of a table (QR ``concat``, which splits a row's columns
            between two tables, is refused).
        check: its own check of an ``ExperimentConfig`` (a ``ConfigError`` naming the key).
        reference_grid: a reference model a sweep can train (``baselines``): its default grid
            (dotted key -> values); ``None``: not a reference.
        dense_reference: the default grid (``grid``) and fixed keys (``overrides``) of the
            reference where its tables are small enough to train dense (``recsys.tune.space``:
            every row decayed at every step by the dense optimizer's ``weight_decay``).
    """

    name: str
    builder: str
    summary: str
    reads: tuple[str, ...] = ()
    table_width: Callable[[int, int], int] | None = None
    whole_rows: bool = False
    check: Callable[[Any], None] | None = None
    reference_grid: dict[str, list[Any]] | None = field(default=None)
    dense_reference: dict[str, dict[str, Any]] | None = field(default=None)


ARCHS: dict[str, Arch] = {}


def register(arch: Arch) -> Arch:
    """Add ``arch`` to ``ARCHS`` (a name registered twice is a programming error)."""
    if arch.name in ARCHS:
        raise ValueError(f"model.arch {arch.name!r} is registered twice")
    ARCHS[arch.name] = arch
    return arch


def get(name: str) -> Arch:
    """The registered ``name``; a ``ConfigError`` naming the choices otherwise."""
    if name not in ARCHS:
        raise ConfigError(
            f"model.arch={name!r}: not one of {tuple(ARCHS)}{nearest(str(name), list(ARCHS))}"
        )
    return ARCHS[name]


def references() -> tuple[str, ...]:
    """The reference models a sweep can train as bars (``baselines``), in registration order."""
    return tuple(n for n, a in ARCHS.items() if a.reference_grid is not None)


def check_tables(arch: Arch, emb: Any) -> None:
    """What ``arch``'s tables cannot be: mixed dims for one table width, QR ``concat`` for a
    model reading whole rows."""
    if arch.table_width is not None:
        why = f"model.arch={arch.name!r} has one table width; mixed dims are DLRM's"
        check(emb.dims is None, "embeddings.dims", emb.dims, why)
        check(emb.md_alpha is None, "embeddings.md_alpha", emb.md_alpha, why)
    if arch.whole_rows and emb.qr.enabled:
        op, why = emb.qr.operation, f"model.arch={arch.name!r} reads whole rows: use mult or add"
        check(op != "concat", "embeddings.qr.operation", op, why)


def _dlrm_check(cfg: Any) -> None:
    m = cfg.model
    if m.interaction == "dot" and not m.interaction_itself:
        pairs = cfg.embeddings.num_features + (1 if m.num_dense else 0)
        why = "dot needs two vectors (no numeric feature and one id feature): use cat or sum"
        check(pairs >= 2, "model.interaction", m.interaction, why)


SEQUENCE_KEYS = (
    "model.sequence",
    "model.sequence.pooling",
    "model.sequence.attention_mlp",
    "model.sequence.heads",
)  # how DLRM and FinalMLP pool a sequence
register(Arch(
    name="dlrm",
    builder="recsys.models.dlrm:DLRM",
    summary="DLRM: bottom MLP, an interaction (dot, cat, sum, dcn) over the embeddings, top MLP",
    reads=("model.bottom_mlp", "model.top_mlp", "model.interaction", "model.interaction_itself",
           "model.dcn_layers", "model.dcn_low_rank", "model.dropout", "model.norm",
           "model.tasks", "model.experts", *(f"model.experts.{k}" for k in
                                              ("count", "task_count", "mlp", "tower", "levels")),
           *SEQUENCE_KEYS),
    check=_dlrm_check,
))  # fmt: skip
register(Arch(
    name="finalmlp",
    builder="recsys.models.finalmlp:FinalMLP",
    summary="FinalMLP: two gated MLP streams over the embeddings, fused by bilinear heads",
    reads=("model.finalmlp", "model.finalmlp.stream1", "model.finalmlp.stream2",
           "model.finalmlp.heads", "model.finalmlp.gate", "model.dropout", "model.norm",
           *SEQUENCE_KEYS),
))  # fmt: skip
# Each reference's default grids (a space's ``baselines.<arch>.grid`` replaces its rule's): under
# FBGEMM's fused rule two learning rates, without and with weight decay; under the dense rule
# (small tables, ``dense_reference``) the dense optimizer's rates and decays over decades. LR's
# tables are LINEAR_WIDTH columns whose sum is the weight: it learns at four times its table
# learning rate, hence its smaller rates.
register(Arch(
    name="lr",
    builder="recsys.models.reference:LogisticRegression",
    summary="logistic regression: a weight per id and a bias",
    table_width=lambda dim, tasks: LINEAR_WIDTH * tasks,
    whole_rows=True,
    reference_grid={"optim.embedding_lr": [0.01, 0.03],
                    "optim.embedding_weight_decay": [0.0, 1.0e-3]},
    dense_reference={"grid": {"optim.lr": [0.01, 0.03],
                              "optim.weight_decay": [1.0e-4, 1.0e-3, 3.0e-3, 1.0e-2]},
                     "overrides": {"optim.dense_optimizer": "adagrad"}},
))  # fmt: skip
register(Arch(
    name="fm",
    builder="recsys.models.reference:FactorizationMachine",
    summary="factorization machine: LR's terms plus the pairwise dot products of id factors",
    table_width=lambda dim, tasks: dim + LINEAR_WIDTH * tasks,
    whole_rows=True,
    reference_grid={"optim.embedding_lr": [0.03, 0.1],
                    "optim.embedding_weight_decay": [0.0, 1.0e-3]},
    dense_reference={"grid": {"optim.lr": [1.0e-3, 3.0e-3, 1.0e-2],
                              "optim.weight_decay": [0.0, 1.0e-5]},
                     "overrides": {"optim.dense_optimizer": "adam"}},
))  # fmt: skip
