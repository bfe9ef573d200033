"""The architectures ``model.arch`` names, each registered once (``ARCHS``).

An entry says everything the configuration needs to know of a model without importing it: the
``model.*`` keys it reads (what a search space may sweep for it; a key it does not read is
refused), the width of its tables (``None``: the embeddings as configured, mixed dims
included), whether it reads whole rows (QR ``concat`` refused), and its own check of a config.
Its class is ``recsys.models.build.BUILDERS[name]``; how a sweep searches it as a reference is
the sweep's policy (``recsys.tune.references``).

Adding a model is one module in ``recsys/models/`` (``Class(model, embeddings, num_tasks,
embedding_device=..., init_seed=...)``, ``forward(dense [B, I], kjt) -> logits [B, T]``), one
``register`` call here and its class in ``BUILDERS``; docs/extending.md walks through it with
the tests to copy.

Pure: this module imports no torch and no other ``recsys`` module than ``configlib``, so that
``recsys.config`` can check ``model.arch`` against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recsys.configlib import ConfigError, check, nearest

LINEAR_WIDTH = 4  # a reference model's weight of an id for a task: the sum of a row's 4 columns


@dataclass(frozen=True)
class Arch:
    """One architecture.

    Attributes:
        name: the ``model.arch`` value.
        summary: one line for errors and the docs.
        reads: the ``model.*`` keys (besides ``model.arch`` and ``model.num_dense``) it reads.
        table_width: ``(embeddings.dim, tasks) -> width`` of every table it builds; ``None``:
            the tables as ``embeddings`` configures them (mixed dims allowed).
        whole_rows: it reads whole rows of a table (QR ``concat``, which splits a row's columns
            between two tables, is refused).
        check: its own check of an ``ExperimentConfig`` (a ``ConfigError`` naming the key).
    """

    name: str
    summary: str
    reads: tuple[str, ...] = ()
    table_width: Callable[[int, int], int] | None = None
    whole_rows: bool = False
    check: Callable[[Any], None] | None = None


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
    summary="FinalMLP: two gated MLP streams over the embeddings, fused by bilinear heads",
    reads=("model.finalmlp", "model.finalmlp.stream1", "model.finalmlp.stream2",
           "model.finalmlp.heads", "model.finalmlp.gate", "model.dropout", "model.norm",
           *SEQUENCE_KEYS),
))  # fmt: skip
register(Arch(
    name="lr",
    summary="logistic regression: a weight per id and a bias",
    table_width=lambda dim, tasks: LINEAR_WIDTH * tasks,
    whole_rows=True,
))  # fmt: skip
register(Arch(
    name="fm",
    summary="factorization machine: LR's terms plus the pairwise dot products of id factors",
    table_width=lambda dim, tasks: dim + LINEAR_WIDTH * tasks,
    whole_rows=True,
))  # fmt: skip
