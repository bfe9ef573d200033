"""A whole experiment: every section, round-tripped through the plain dict Ray Tune hands a
trial, and addressed by dotted keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recsys import archs
from recsys.config.choices import MEAN_TASK, monitor_parts
from recsys.config.data import DataConfig
from recsys.config.embeddings import EmbeddingConfig
from recsys.config.model import LossConfig, ModelConfig, model_tables
from recsys.config.train import OptimConfig, ShardingConfig, TrainConfig
from recsys.configlib import (
    check,
    dotted_keys,
    from_dict,
    nearest,
    set_dotted,
    to_dict,
)


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
