"""Declarative search spaces (``search_spaces/*.yaml``), checked before anything launches.

A space file::

    base: debug                      # a named experiment (config_registry) or a config file
    overrides:                       # fixed for every trial (dotted keys)
      train.steps: 150
    space:                           # sampled per trial (dotted keys -> one primitive each)
      model.interaction: {choice: [dot, cat, sum, dcn]}
      optim.lr: {loguniform: [0.01, 0.1]}
      embeddings.dim: {grid: [8, 16]}
      embeddings.qr.collisions: {randint: [2, 9]}     # upper bound exclusive, as Ray Tune
      loss.weights: {choice: [[1.0, 1.0], [1.0, 2.0]]}
    metric: val_auc                  # the trial's score: its best validation report
    mode: max
    num_samples: 8                   # trials (``--num-samples`` overrides)
    smoke: {num_samples: 2, overrides: {train.steps: 20}}   # the --smoke-test variant
    baselines: [lr, fm]              # reference models, each the best of a small search
    confirm: {top: 2, seeds: 3}      # after the search: the 2 best re-trained with 3 new seeds
                                     # (references: true: each reference's best too)

``baselines`` and ``confirm`` are the sweep's later phases (``recsys.tune.phases``); ``smoke`` may
set its own. ``--confirm K --seeds N`` on the command line replace ``confirm``.

A reference model is a fair bar only when it is trained as well as a plain recipe of its kind,
so each one listed is searched by rules: a grid of a few learning rates and weight decays on the
base config, each point trained with a budget in epochs and patience; the best by the space's
metric is the reference. A reference whose tables hold at most ``DENSE_REFERENCE_MAX_VALUES``
values in all, at every point of its grid, trains them dense (``DENSE_REFERENCE_RULES`` and the
arch's ``dense_reference`` recipe: fp32 replicas, every row decayed at every step); larger ones
train with FBGEMM's fused optimizer (``REFERENCE_RULES``, the arch's ``reference_grid``). A
mapping sets an arch's grid, fixed keys and ``rule``; keys the rule sets or does not read are
refused (``optim.embedding_*``, ``embeddings.dtype``, ``sharding.*`` under the dense rule; a grid
of ``optim.lr`` / ``optim.weight_decay`` alone under the fused one)::

    baselines:
      lr:                            # its grid replaced (here 3 x 2 = 6 trials; at most 8)
        grid: {optim.lr: [0.01, 0.03, 0.1], optim.weight_decay: [1.0e-3, 1.0e-2]}
        overrides: {train.epochs: 20} # over the rules' fixed keys
      fm: {rule: fused}              # auto (by size, the default), dense or fused

Under ``--smoke-test`` each reference is one trial (the first value of each grid key) trained with
the smoke variant's budget (the rules' and the arch's budget keys, ``BUDGET_KEYS``, left out).

Several objectives search for a trade-off rather than a maximum (``--search optuna`` runs Optuna's
multi-objective TPE; the results mark the non-dominated trials)::

    metric: [val_auc, emb_bytes]     # the first is the validation score; then static metrics
    mode: [max, min]
    constraints: {emb_bytes_max: 2.0e6}   # configurations over it are refused before launch

Every key must be a config key (a typo names the nearest valid one); every value of a ``choice``
or ``grid`` and both ends of a range must build a valid config, and so must every combination of
the discrete options (up to ``MAX_COMBINATIONS``), so a bad space fails here, not in a trial.
So must the metric: its task one of the data's (a suffix only with several tasks), and on a
prepared folder the validation split must have rows, and for an AUC both classes of the task
(of every task for ``/mean``: ``meta.json``'s ``label_counts``).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from recsys import archs
from recsys.config import MEAN_TASK, MONITORED, ExperimentConfig, is_map_key, monitor_parts
from recsys.config_registry import EXPERIMENTS, from_file, named
from recsys.configlib import ConfigError, nearest
from recsys.data.dataset import check_weighted, source_for, with_data
from recsys.runtime.storage import resolved

PRIMITIVES = ("choice", "grid", "uniform", "loguniform", "randint")
MAX_COMBINATIONS = 4096
SECTIONS = (
    "description", "base", "num_samples", "overrides", "space", "metric", "mode", "smoke",
    "constraints", "baselines", "confirm",
)  # fmt: skip
SMOKE_SECTIONS = ("num_samples", "overrides", "baselines", "confirm")
MAX_REFERENCE_TRIALS = 8  # a reference's grid: a handful of trials, not a second search
# What every reference trial gets (the rules; a space's ``baselines.<arch>.overrides`` go over
# them): the optimizers and batch the grids' values are for (row-wise Adagrad on the tables with
# L2 weight decay, Adagrad on the bias and dense terms, a constant learning rate, 512 rows a
# worker); fp16 tables, because
# FBGEMM's CPU kernel applies weight decay to fp16 tables only (LR and FM train as they do in
# fp32: BENCHMARKS.md, quality); and a budget in epochs that patience ends once validation
# stops improving (a reference is trained to convergence, not to the search's step budget).
REFERENCE_RULES: dict[str, Any] = {
    "embeddings.dtype": "fp16",
    "optim.embedding_optimizer": "exact_rowwise_adagrad",
    "optim.dense_optimizer": "adagrad",
    "optim.embedding_weight_decay_mode": "l2",
    "optim.warmup_steps": 0,
    "optim.decay_steps": 0,
    "train.batch_size": 512,
    "train.epochs": 20.0,
    "train.reports_per_epoch": 2,
    "train.patience": 3,
}
# A reference whose tables hold at most this many values trains them dense instead (every
# worker keeps a replica and all-reduces its whole gradient each step): the dense optimizer
# decays every row at every step (``optim.weight_decay``, as a plain PyTorch optimizer's does),
# where FBGEMM's fused optimizer decays a row only at the steps that read it (a rare id almost
# never). On a long tail of rare ids that is what keeps LR and FM level with scikit-learn's LR and
# a plain FM. The fused optimizer's decay is set to 0 (no table uses it; the base's value would
# be refused on CPU workers with fp32 tables, ``check_fused_decay``).
DENSE_REFERENCE_MAX_VALUES = 2**24
DENSE_REFERENCE_RULES: dict[str, Any] = {
    "embeddings.dtype": "fp32",
    "optim.embedding_weight_decay": 0.0,
    "sharding.default.sharding_types": ["data_parallel"],
    "sharding.default.compute_kernels": ["dense"],
    "sharding.tables": {},
}
BUDGET_KEYS = ("train.epochs", "train.steps", "train.batch_size", "train.reports_per_epoch",
               "train.patience", "train.eval_every", "train.checkpoint_every")  # fmt: skip
REFERENCE_SECTIONS = ("grid", "overrides", "rule")
REFERENCE_RULE_NAMES = ("auto", "dense", "fused")  # auto: dense where the tables are small
# keys that reach only the dense optimizer: a fused-rule reference's tables do not read them
DENSE_ONLY_KEYS = frozenset({"optim.lr", "optim.weight_decay", "optim.dense_optimizer"})
VALIDATION: tuple[str, ...] = tuple(f"val_{m}" for m in MONITORED)  # (/<task>, /mean too)


def is_validation(metric: str) -> bool:
    """A validation metric, scored by its best report (``val_auc``, ``val_auc/like``...)."""
    try:
        monitor_parts(metric)
    except ConfigError:
        return False
    return True


STATIC = ("emb_bytes", "emb_params")  # known before training
COST = ("worker_s", "wall_s")  # what a trial cost (its last report)
FURTHER = STATIC + COST  # the objectives after the first
CONSTRAINTS = {"emb_bytes_max": "emb_bytes", "emb_params_max": "emb_params"}  # -> what it bounds


@dataclass(frozen=True)
class Dimension:
    """One searched key: ``kind`` is a primitive name, ``values`` its options or bounds."""

    key: str
    kind: str
    values: list[Any]

    def tune(self) -> Any:
        """The Ray Tune primitive."""
        from ray import tune

        if self.kind == "choice":
            return tune.choice(self.values)
        if self.kind == "grid":
            return tune.grid_search(self.values)
        low, high = self.values
        return {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}[
            self.kind
        ](low, high)

    def probes(self) -> list[Any]:
        """Values to validate: every option, or both ends of a range."""
        if self.kind in ("choice", "grid"):
            return list(self.values)
        low, high = self.values
        return [low, high - 1] if self.kind == "randint" else [low, high]


@dataclass(frozen=True)
class Objective:
    """A metric and its direction. A validation metric scores a trial by its best report
    (reported as ``best_<metric>``); a static one (``emb_bytes``) is the same in every report."""

    metric: str
    mode: str

    @property
    def key(self) -> str:
        """The key of the trial's score in its reports."""
        return f"best_{self.metric}" if is_validation(self.metric) else self.metric


@dataclass(frozen=True)
class Confirm:
    """The seed check: the ``top`` best configurations re-trained with ``seeds`` new seeds each
    (``top == 0``: none); ``references``: each reference (an arch's best baseline trial) too, so
    that the verdict against it compares interval with interval."""

    top: int
    seeds: int
    references: bool = False

    @property
    def trials(self) -> int:
        return self.top * self.seeds


@dataclass(frozen=True)
class Reference:
    """One reference model's search: ``arch`` (``model.arch``), its ``grid`` (dotted key ->
    values: every combination is a trial) and the keys fixed for each trial (``overrides``: the
    rules', then the space's)."""

    arch: str
    grid: dict[str, list[Any]]
    overrides: dict[str, Any]
    rule: str = "fused"  # how its tables train: "dense" or "fused" (DENSE_REFERENCE_RULES)

    @property
    def trials(self) -> int:
        return math.prod(len(v) for v in self.grid.values())

    def points(self, base: ExperimentConfig) -> list[dict[str, Any]]:
        """Each trial's params over ``base``: the arch (its mixed dims dropped: a reference has
        one table width), the fixed keys, then the grid's combination."""
        arch = reference_params(base, self.arch)
        keys = list(self.grid)
        return [
            {**arch, **self.overrides, **dict(zip(keys, combo, strict=True))}
            for combo in itertools.product(*(self.grid[k] for k in keys))
        ]

    def describe(self, params: dict[str, Any]) -> str:
        """The grid's values of a trial: ``lr=0.03, weight_decay=0.01``."""
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={params.get(k)!r}" for k in self.grid)


def reference_params(base: ExperimentConfig, arch: str) -> dict[str, Any]:
    """``model.arch: arch`` over ``base``, and its mixed dims dropped (a reference has one table
    width)."""
    params: dict[str, Any] = {"model.arch": arch}
    if base.embeddings.dims is not None:
        params["embeddings.dims"] = None
    if base.embeddings.md_alpha is not None:
        params["embeddings.md_alpha"] = None
    return params


@dataclass(frozen=True)
class SearchSpace:
    name: str
    source: str
    base: ExperimentConfig
    dimensions: list[Dimension]
    objectives: list[Objective] = field(default_factory=lambda: [Objective("val_auc", "max")])
    constraints: dict[str, float] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    baselines: list[str] = field(default_factory=list)
    confirm: Confirm = field(default_factory=lambda: Confirm(0, 0))
    references: dict[str, Reference] = field(default_factory=dict)  # by arch, as ``baselines``

    @property
    def metric(self) -> str:
        """The validation metric that scores a trial (the first objective)."""
        return self.objectives[0].metric

    @property
    def mode(self) -> str:
        return self.objectives[0].mode

    def param_space(self) -> dict[str, Any]:
        return {d.key: d.tune() for d in self.dimensions}

    def num_trials(self, num_samples: int) -> int:
        """Trials a sweep of ``num_samples`` runs: each sample covers every grid combination."""
        return num_samples * math.prod(len(d.values) for d in self.dimensions if d.kind == "grid")

    def config_for(self, params: dict[str, Any]) -> ExperimentConfig:
        return self.base.with_overrides(params)

    def baseline_params(self, arch: str) -> dict[str, Any]:
        """The base config as ``arch`` (its mixed dims dropped: a reference has one table
        width); a reference's trials add its rules and grid (``reference_points``)."""
        return reference_params(self.base, arch)

    def reference_points(self) -> list[dict[str, Any]]:
        """Every reference trial's params, arch after arch in ``baselines`` order."""
        return [p for arch in self.baselines for p in self.references[arch].points(self.base)]


def _fail(source: str, where: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {where}: {msg}")


def _dimension(source: str, key: str, spec: Any, valid: list[str]) -> Dimension:
    if key not in valid and not is_map_key(key):
        raise _fail(source, "space", f"unknown config key {key!r}{nearest(key, valid)}")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise _fail(source, f"space.{key}", f"expected one of {{{', '.join(PRIMITIVES)}}}: ...")
    ((kind, values),) = spec.items()
    if kind not in PRIMITIVES:
        raise _fail(
            source, f"space.{key}", f"unknown primitive {kind!r}{nearest(kind, PRIMITIVES)}"
        )
    if not isinstance(values, list) or not values:
        raise _fail(source, f"space.{key}.{kind}", f"needs a non-empty list, got {values!r}")
    if kind in ("uniform", "loguniform", "randint"):
        if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values):
            raise _fail(source, f"space.{key}.{kind}", f"needs [low, high], got {values!r}")
        if values[0] >= values[1]:
            raise _fail(source, f"space.{key}.{kind}", f"low >= high in {values!r}")
        if kind == "loguniform" and values[0] <= 0:
            raise _fail(source, f"space.{key}.{kind}", f"needs low > 0, got {values!r}")
    return Dimension(key, kind, values)


MODEL_KEYS_OF_EVERY_ARCH = ("model.arch", "model.num_dense")


def unread(arch_names: list[str], key: str) -> bool:
    """Whether ``key`` is a model key that none of ``arch_names`` reads (``recsys.archs``)."""
    if not key.startswith("model.") or key in MODEL_KEYS_OF_EVERY_ARCH:
        return False
    return not any(key in archs.get(n).reads for n in arch_names)


def _check_read(
    source: str, base: ExperimentConfig, dims: list[Dimension], overrides: dict[str, Any]
) -> None:
    """A swept or overridden ``model.*`` key that no architecture of the sweep reads is
    refused: its trials would differ in name only, or the setting would do nothing."""
    arch_dim = next((d for d in dims if d.key == "model.arch"), None)
    names = [str(v) for v in arch_dim.values] if arch_dim else [base.model.arch]
    why = f"model.arch {' / '.join(names)} does not read it (recsys.archs)"
    for d in dims:
        if unread(names, d.key):
            raise _fail(source, f"space.{d.key}", why)
    for key in overrides:
        if unread(names, key):
            raise _fail(source, f"overrides.{key}", why)


def _check_builds(source: str, base: ExperimentConfig, dims: list[Dimension]) -> None:
    for d in dims:
        for v in d.probes():
            try:
                base.with_overrides({d.key: v})
            except ConfigError as e:
                raise _fail(source, f"space.{d.key}", f"value {v!r} is invalid: {e}") from None
    options = [[(d.key, v) for v in d.probes()] for d in dims]
    count = 1
    for o in options:
        count *= len(o)
    if count > MAX_COMBINATIONS:
        return
    for combo in itertools.product(*options):
        try:
            base.with_overrides(dict(combo))
        except ConfigError as e:
            raise _fail(
                source, "space", f"the combination {dict(combo)} cannot build: {e}"
            ) from None


def load(path_or_name: str, smoke: bool = False, data: str | None = None) -> SearchSpace:
    """Load and validate a space: a path, or a name under ``search_spaces/``.

    ``smoke``: apply the space's ``smoke`` variant. ``data``: a prepared folder (or TorchRec's
    preprocessed Criteo) that replaces ``data.paths`` (and sets ``data.source``) for every
    trial, applied with the space's own overrides. Relative ``data.paths`` in the overrides are
    taken from the current directory. The data's overrides come first, then the config is
    resolved against the data (``recsys.data.dataset.resolve``: features, tables, tasks), then
    the rest of the overrides apply."""
    path = resolve(path_or_name)
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{path}: unknown section {key!r}{nearest(key, SECTIONS)}")
    base_ref = raw.get("base", "debug")
    base = named(base_ref) if base_ref in EXPERIMENTS else from_file(_relative(path, base_ref))
    overrides = dict(raw.get("overrides") or {})
    smoke_raw = _smoke(path, raw.get("smoke") or {})
    if smoke:
        overrides.update(smoke_raw.get("overrides") or {})
    if data:
        overrides.update({"data.source": source_for(data), "data.paths": [resolved(data)]})
    elif isinstance(overrides.get("data.paths"), list):  # relative to where the sweep starts
        overrides["data.paths"] = [resolved(p) for p in overrides["data.paths"]]
    try:
        base = with_data(base, overrides)
        check_weighted(base)
    except ConfigError as e:
        raise ConfigError(f"{path}: overrides: {e}") from None
    valid = ExperimentConfig.all_keys()
    space = raw.get("space") or {}
    if not space:
        raise ConfigError(f"{path}: space is empty")
    dims = [_dimension(path, k, v, valid) for k, v in space.items()]
    if base.data.refit or any(d.key == "data.refit" for d in dims):
        where = "space.data.refit" if "data.refit" in space else "data.refit"
        raise _fail(path, where, "a sweep chooses by its validation rows, which a refit trains "
                    "on: refit its winner instead (recsys-export --refit)")  # fmt: skip
    _check_builds(path, base, dims)
    _check_read(path, base, dims, overrides)
    objectives = _objectives(path, raw)
    _check_metric(path, base, objectives[0].metric)
    own = {k: smoke_raw[k] for k in ("baselines", "confirm") if k in smoke_raw and smoke}
    phases = {**raw, **own}  # the smoke variant's own phases, if it has them
    references = _baselines(path, phases.get("baselines") or [], base, smoke)
    confirm = _confirm(path, phases.get("confirm"))
    return SearchSpace(
        name=os.path.splitext(os.path.basename(path))[0],
        source=path,
        base=base,
        dimensions=dims,
        objectives=objectives,
        constraints=_constraints(path, raw.get("constraints") or {}),
        smoke=smoke_raw,
        raw=raw,
        baselines=list(references),
        confirm=confirm,
        references=references,
    )


def _smoke(path: str, smoke: Any) -> dict[str, Any]:
    if not isinstance(smoke, dict):
        raise ConfigError(f"{path}: smoke: expected a mapping, got {smoke!r}")
    for key in smoke:
        if key not in SMOKE_SECTIONS:
            raise ConfigError(
                f"{path}: smoke: unknown section {key!r}{nearest(str(key), SMOKE_SECTIONS)}"
            )
    return smoke


def _baselines(
    path: str, value: Any, base: ExperimentConfig, smoke: bool = False
) -> dict[str, Reference]:
    """``baselines``: a list of reference ``model.arch`` values (each by the default rules), or
    a mapping of each to ``{grid: {key: [values]}, overrides: {key: value}}`` (either optional;
    ``{}`` or null: the default rules). Every trial must build from the base."""
    where = f"{path}: baselines"
    if isinstance(value, list):
        if len(set(map(str, value))) != len(value):
            raise ConfigError(f"{where}: {value} lists a model twice")
        value = {arch: None for arch in value}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: a list of {list(archs.references())}, or a mapping of each to "
            f"{{grid: ..., overrides: ...}}; got {value!r}"
        )
    out = {}
    for arch, spec in value.items():
        if arch not in archs.references():
            raise ConfigError(
                f"{where}: {arch!r} is not a reference model; one of "
                f"{list(archs.references())}{nearest(str(arch), archs.references())}"
            )
        ref = _reference(f"{where}.{arch}", arch, spec, smoke, base)
        _check_reference(where, ref, base)
        out[arch] = ref
    return out


def _trains_dense(base: ExperimentConfig, arch: str, spec: dict[str, Any]) -> bool:
    """Whether reference ``arch``'s tables over ``base`` with its entry's ``overrides`` hold at
    most ``DENSE_REFERENCE_MAX_VALUES`` values (every worker can keep a replica) at every point
    of the entry's ``grid`` (a grid may size the tables: ``embeddings.dim``, ``qr.*``)."""
    from recsys.models.accounting import table_stats

    overrides, grid = spec.get("overrides") or {}, spec.get("grid") or {}
    if not isinstance(overrides, dict) or not isinstance(grid, dict):
        return False  # (_reference names why)
    sized = {k: v for k, v in grid.items() if isinstance(v, list) and v}  # (the rest: named later)
    for point in Reference(arch, sized, overrides).points(base):
        try:
            cfg = base.with_overrides(point)
        except ConfigError:
            return False  # (_check_reference names why)
        if sum(t.params for t in table_stats(cfg.tables)) > DENSE_REFERENCE_MAX_VALUES:
            return False
    return True


def _rule(where: str, arch: str, spec: dict[str, Any], base: ExperimentConfig) -> str:
    """``dense`` or ``fused``: the entry's ``rule``, or by the tables' size (``auto``)."""
    rule = spec.get("rule", "auto")
    if rule not in REFERENCE_RULE_NAMES:
        raise ConfigError(f"{where}.rule: {rule!r}, one of {list(REFERENCE_RULE_NAMES)}"
                          f"{nearest(str(rule), REFERENCE_RULE_NAMES)}")  # fmt: skip
    recipe = archs.get(arch).dense_reference
    if rule == "dense" and recipe is None:
        raise ConfigError(f"{where}.rule: dense: {arch} has no dense recipe (recsys.archs)")
    if rule == "auto":
        dense = recipe is not None and _trains_dense(base, arch, spec)
        return "dense" if dense else "fused"
    return str(rule)


def _reference(where: str, arch: str, spec: Any, smoke: bool, base: ExperimentConfig) -> Reference:
    """One arch's grid and fixed keys from its entry (``None``: the default rules): its
    ``rule``'s (``dense``: the arch's dense recipe over ``DENSE_REFERENCE_RULES``; ``fused``:
    ``REFERENCE_RULES``), then the entry's; under ``smoke``, one trial (each grid key's first
    value) without the budget keys."""
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected {{grid: ..., overrides: ...}} or {{}}, got {spec!r}")
    for key in spec:
        if key not in REFERENCE_SECTIONS:
            why = f"unknown {key!r}{nearest(str(key), REFERENCE_SECTIONS)}"
            raise ConfigError(f"{where}: {why} (one of {list(REFERENCE_SECTIONS)})")
    rule = _rule(where, arch, spec, base)
    valid = ExperimentConfig.all_keys()
    recipe = archs.get(arch).dense_reference if rule == "dense" else None
    default = recipe["grid"] if recipe else archs.get(arch).reference_grid
    grid: dict[str, Any] = spec.get("grid", default or {})
    overrides = spec.get("overrides") or {}
    for section, keys in (("grid", grid), ("overrides", overrides)):
        if not isinstance(keys, dict) or (section == "grid" and not keys):
            what = "a non-empty mapping of config keys to lists" if section == "grid" else (
                "a mapping of config keys to values")  # fmt: skip
            raise ConfigError(f"{where}.{section}: {what}, got {keys!r}")
        for key in keys:
            if key not in valid and not is_map_key(key):
                raise ConfigError(
                    f"{where}.{section}: unknown config key {key!r}{nearest(str(key), valid)}"
                )
            if key == "model.arch":
                raise ConfigError(f"{where}.{section}: model.arch is the reference's own ({arch})")
            if unread([arch], key):
                raise ConfigError(f"{where}.{section}: {arch} does not read {key} (recsys.archs)")
            _check_rule_key(f"{where}.{section}", key, rule)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.grid.{key}: a non-empty list of values, got {values!r}")
    if rule == "fused" and grid and set(grid) <= DENSE_ONLY_KEYS:
        raise ConfigError(
            f"{where}.grid: {sorted(grid)} under the fused rule (rule: fused, or auto where the "
            f"tables hold more than {DENSE_REFERENCE_MAX_VALUES} values) tunes only the weights "
            f"outside the tables: the tables train with optim.embedding_lr and "
            f"optim.embedding_weight_decay; search those, or set rule: dense"
        )
    rules = {**REFERENCE_RULES, **DENSE_REFERENCE_RULES, **recipe["overrides"]} if recipe else {}
    fixed = {**(rules or REFERENCE_RULES), **overrides}
    if smoke:
        grid = {k: v[:1] for k, v in grid.items()}
        fixed = {k: v for k, v in fixed.items() if k not in BUDGET_KEYS}
    ref = Reference(arch, {k: list(v) for k, v in grid.items()}, fixed, rule)
    if ref.trials > MAX_REFERENCE_TRIALS:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise ConfigError(
            f"{where}.grid: {sizes} = {ref.trials} trials; a reference's grid has at most "
            f"{MAX_REFERENCE_TRIALS} (a few values of its learning rate and weight decay)"
        )
    return ref


def _check_rule_key(where: str, key: str, rule: str) -> None:
    """Refuse an entry key that the dense rule sets or that does nothing under it (``where``:
    the entry's section), naming the rule."""
    if rule != "dense":
        return
    dense = (f"this reference trains its tables dense (rule: dense; by default where they hold "
             f"at most {DENSE_REFERENCE_MAX_VALUES} values)")  # fmt: skip
    if key.startswith("optim.embedding_"):
        raise ConfigError(
            f"{where}: {key} does nothing here: {dense} with optim.lr, optim.weight_decay and "
            f"optim.dense_optimizer; search those, or set rule: fused"
        )
    if key == "embeddings.dtype" or key.startswith("sharding."):
        raise ConfigError(
            f"{where}: {key} is the dense rule's own: {dense} as fp32 replicas on every worker "
            f"(data_parallel); set rule: fused to choose the tables' precision or placement"
        )


def _check_reference(where: str, ref: Reference, base: ExperimentConfig) -> None:
    """``ref``'s arch builds from ``base``, and so does each of its trials, its budget in epochs
    made steps (``where``: ``<space>: baselines``)."""
    from recsys.data.dataset import train_rows, with_budget

    try:
        base.with_overrides(reference_params(base, ref.arch))
    except ConfigError as e:
        raise ConfigError(f"{where}: {ref.arch} cannot build from the base: {e}") from None
    for point in ref.points(base):
        try:
            cfg = base.with_overrides(point)
            if cfg.train.epochs > 0:
                with_budget(cfg, train_rows(cfg), 1)
        except ConfigError as e:
            shown = {k: v for k, v in point.items() if k in ref.grid}
            raise ConfigError(
                f"{where}.{ref.arch}: the trial with {shown} cannot build: {e}"
            ) from None


def _confirm(path: str, value: Any) -> Confirm:
    """``confirm: {top: K, seeds: N, references: false}``: K >= 1 configurations, N >= 2 seeds
    (a spread needs two); ``references: true`` seed-checks the references too."""
    if value is None:
        return Confirm(0, 0)
    keys = set(value) if isinstance(value, dict) else set()
    if not {"top", "seeds"} <= keys <= {"top", "seeds", "references"}:
        raise ConfigError(
            f"{path}: confirm: expected {{top: K, seeds: N, references: false}}, got {value!r}"
        )
    refs = value.get("references", False)
    if not isinstance(refs, bool):
        raise ConfigError(f"{path}: confirm: references={refs!r}: true or false")
    return confirm_of(value["top"], value["seeds"], f"{path}: confirm", refs)


def confirm_of(top: Any, seeds: Any, where: str, references: bool = False) -> Confirm:
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ConfigError(f"{where}: top={top!r}: the configurations to confirm, an integer >= 1")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 2:
        raise ConfigError(
            f"{where}: seeds={seeds!r}: new seeds per configuration, an integer >= 2 "
            "(a confidence interval needs two values)"
        )
    return Confirm(top, seeds, references)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _objectives(path: str, raw: dict[str, Any]) -> list[Objective]:
    """``metric`` / ``mode``: one each, or lists of equal length; the first metric is a
    validation metric (the score), the others static metrics."""
    metrics, modes = _listed(raw.get("metric", "val_auc")), _listed(raw.get("mode", "max"))
    if len(metrics) != len(modes):
        raise ConfigError(f"{path}: metric {metrics} and mode {modes} differ in length")
    for m in modes:
        if m not in ("max", "min"):
            raise ConfigError(f"{path}: mode={m!r}: max or min")
    if not isinstance(metrics[0], str) or not is_validation(metrics[0]):
        raise ConfigError(
            f"{path}: metric={metrics[0]!r}: the first metric scores trials by their best "
            f"validation report; one of {VALIDATION}, optionally /<task> or /mean"
            f"{nearest(str(metrics[0]), VALIDATION)}"
        )
    for m in metrics[1:]:
        if m not in FURTHER:
            raise ConfigError(f"{path}: metric={m!r}: further objectives are one of {FURTHER}")
    return [Objective(m, d) for m, d in zip(metrics, modes, strict=True)]


def _check_metric(path: str, base: ExperimentConfig, metric: str) -> None:
    """The score must be computable: its task one of the base's (``val_auc/<task>``), and for a
    prepared folder (``meta.json``'s ``label_counts``) the validation split must have rows, and
    for an AUC both classes of the task (of every task, for ``/mean``)."""
    try:
        base.with_overrides({"train.monitor": metric})
    except ConfigError as e:
        raise ConfigError(f"{path}: metric={metric!r}: {e}") from None
    name, task = monitor_parts(metric)
    tasks = base.loss.tasks
    if task is not None and len(tasks) == 1:  # one task's figures are reported unsuffixed only
        raise ConfigError(
            f"{path}: {metric} is never reported: the data has one task ({tasks[0].name}), "
            f"whose figures are val_{name}, ... without a /<task> suffix; use val_{name}"
        )
    if base.data.source != "prepared":
        return
    from recsys.data.errors import DataError
    from recsys.data.prepared.meta import read_meta

    folder = base.data.paths[0]
    try:
        meta = read_meta(folder)
    except DataError as e:
        raise ConfigError(str(e)) from None
    counts = (meta.get("label_counts") or {}).get("val") or {}
    rows = int(meta.get("rows", {}).get("val", 0))
    where = f"the validation split of {folder}"
    if rows == 0:
        raise ConfigError(
            f"{path}: {metric} cannot be computed: {where} has no rows (meta.json rows); prepare "
            "it again with a split.val_fraction > 0 (or other split.files)"
        )
    if name != "auc":
        return
    chosen = tasks if task == MEAN_TASK else [t for t in tasks if t.name == (task or tasks[0].name)]
    labels = list(meta.get("labels") or [])
    bad = []
    for t in chosen:
        label = labels[t.label_column] if t.label_column < len(labels) else t.name
        c = counts.get(label)
        if c and c["rows"] and c["positives"] in (0, c["rows"]):
            bad.append(f"{label}={1 if c['positives'] else 0}")
    if bad:
        raise ConfigError(
            f"{path}: {metric} cannot be computed: {where} has {rows:,} rows, all with "
            f"{', all with '.join(bad)} (meta.json label_counts); choose another metric "
            "(val_log_loss) or another split"
        )


def _constraints(path: str, raw: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in raw.items():
        if key not in CONSTRAINTS:
            raise ConfigError(f"{path}: constraints: unknown {key!r}{nearest(key, CONSTRAINTS)}")
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{path}: constraints.{key}={value!r}: a positive number")
        out[key] = float(value)
    return out


SPACES_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "search_spaces"
)


def resolve(path_or_name: str) -> str:
    if os.path.isfile(path_or_name):
        return path_or_name
    candidate = os.path.join(SPACES_DIR, f"{path_or_name}.yaml")
    if os.path.isfile(candidate):
        return candidate
    names = (
        [f[:-5] for f in os.listdir(SPACES_DIR) if f.endswith(".yaml")]
        if os.path.isdir(SPACES_DIR)
        else []
    )
    raise ConfigError(
        f"search space {path_or_name!r} not found (a file, or one of {sorted(names)})"
    )


def _relative(space_path: str, ref: str) -> str:
    return ref if os.path.isabs(ref) else os.path.join(os.path.dirname(space_path), ref)
