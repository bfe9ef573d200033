"""The reference models a sweep trains as bars (``baselines``), and how each is searched: the
sweep's policy for them (the model registry, ``recsys.archs``, only says which archs may be one).

A reference is a fair bar only when it is trained as well as a plain recipe of its kind, so each
is searched by rules: a small grid on the base config, every point trained to convergence, the
best by the space's metric among the points trained to their end (``chosen``). Which rule, by
the size of its tables (``rule: auto``, the default):

- ``dense`` (every table at most ``DENSE_TABLE_MAX_VALUES`` values at every grid point): the
  tables held dense as fp32 replicas. Logistic regression is then solved to its optimum for each
  L2 strength (``train.solver: lbfgs``: full-batch L-BFGS, its grid the strength over decades);
  the FM trains with Adam on every weight, every row decayed at every step (``optim.lr`` x
  ``optim.weight_decay``).
- ``fused``: FBGEMM's fused optimizer on the tables (``optim.embedding_lr`` x
  ``optim.embedding_weight_decay``), by epochs with patience.

**Edges.** A grid whose best point sits on the edge of one of its numeric keys did not find that
key's optimum: the grid is extended on that side by one step (the ratio of the two values at that
edge, a decade where the neighbour is 0) at the best point's other values, until the best is
inside, at most ``MAX_EDGE_STEPS`` steps a side (``Walk``; a 0 at the low edge is closed: no
decay is the end of decays). The baselines header names how far each went.

A mapping in a space sets an arch's grid, fixed keys and ``rule``; keys the rule sets or does not
read are refused (``optim.embedding_*``, ``embeddings.dtype``, ``sharding.*`` under the dense
rule; a grid of ``optim.lr`` / ``optim.weight_decay`` alone under the fused one)::

    baselines:
      lr:                            # its grid replaced (here 3 x 2 = 6 trials; at most 8)
        rule: fused
        grid: {optim.embedding_lr: [0.01, 0.03, 0.1], optim.embedding_weight_decay: [0, 1.0e-3]}
      fm: {overrides: {train.epochs: 20}}   # over the rules' fixed keys

Under ``--smoke-test`` each reference is one trial (the first value of each grid key) with the
smoke variant's budget (``BUDGET_KEYS`` left out), and no edge is walked.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from recsys import archs
from recsys.config import ExperimentConfig, is_map_key
from recsys.configlib import ConfigError, nearest
from recsys.distributed.preflight import DENSE_TABLE_MAX_VALUES

MAX_REFERENCE_TRIALS = 8  # a reference's grid: a handful of trials, not a second search
MAX_EDGE_STEPS = 3  # steps an edge's walk may take on one side of one key
EDGE_STEP_AT_ZERO = 10.0  # the step where the neighbour of an edge is 0: a decade
# What every reference trial gets (the rules; a space's ``baselines.<arch>.overrides`` go over
# them): the optimizers and batch the fused grids' values are for (row-wise Adagrad on the tables
# with L2 weight decay, Adagrad on the bias and dense terms, a constant learning rate, 512 rows a
# worker); fp16 tables, because FBGEMM's CPU kernel applies weight decay to fp16 tables only; and
# a budget in epochs that patience ends once validation stops improving (a reference is trained to
# convergence, not to the search's step budget); and a table of its own for every feature, as a
# one-hot LR or FM of its kind has (a user's ``history`` that reads the item table, as a DLRM may
# share it, would tie each item's weight in the history to its weight as the item shown: on the
# drift log that cost the LR 0.046 validation AUC against scikit-learn's at the same L2).
REFERENCE_RULES: dict[str, Any] = {
    "embeddings.shared": {},
    "embeddings.sequence_targets": {},
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
# The dense rule's own keys over those: every table an fp32 replica trained by the dense optimizer
# (every row decayed at every step by ``optim.weight_decay``, as a plain PyTorch optimizer does,
# where FBGEMM's fused one decays a row only at the steps that read it: on a long tail of rare ids
# that is what keeps LR and FM level with scikit-learn's LR and a plain FM); the fused decay 0 (no
# table uses it; the base's value would be refused on CPU workers with fp32 tables).
DENSE_REFERENCE_RULES: dict[str, Any] = {
    "embeddings.dtype": "fp32",
    "optim.embedding_weight_decay": 0.0,
    "sharding.default.sharding_types": ["data_parallel"],
    "sharding.default.compute_kernels": ["dense"],
    "sharding.tables": {},
}
# The full-batch solver's budget (logistic regression under the dense rule): iterations, a report
# every 10, patience 3 reports, the split read 8192 rows at a time (``recsys.train.solver``).
SOLVED: dict[str, Any] = {
    "train.solver": "lbfgs",
    "train.epochs": 0.0,
    "train.steps": 300,
    "train.checkpoint_every": 10,
    "train.eval_every": 10,
    "train.patience": 3,
    "train.batch_size": 8192,
}


@dataclass(frozen=True)
class Recipe:
    """One reference model's default grid (dotted key -> values) and fixed keys under a rule."""

    grid: dict[str, list[Any]]
    overrides: dict[str, Any] = field(default_factory=dict)


# Each reference's default recipes (a space's ``baselines.<arch>.grid`` replaces the grid). LR's
# tables are 4 columns whose sum is the weight (``recsys.archs.LINEAR_WIDTH``): under the fused
# rule it learns at four times its table learning rate, hence its smaller rates; under the dense
# rule it is solved, and its L2 strength spans the decades scikit-learn's C does at a log's size.
# The dense FM's L2 spans three decades around 1e-4 and its Adam rate 1e-3 and 3e-3, where its
# best lay on the generated logs (BENCHMARKS.md, refcost); an optimum beyond is reached by the
# walk, each edge a step at a time.
RECIPES: dict[str, dict[str, Recipe]] = {
    "lr": {
        "fused": Recipe({"optim.embedding_lr": [0.01, 0.03],
                         "optim.embedding_weight_decay": [0.0, 1.0e-3]}),
        "dense": Recipe({"optim.weight_decay": [1.0e-5, 1.0e-4, 1.0e-3, 1.0e-2]}, SOLVED),
    },
    "fm": {
        "fused": Recipe({"optim.embedding_lr": [0.03, 0.1],
                         "optim.embedding_weight_decay": [0.0, 1.0e-3]}),
        "dense": Recipe({"optim.lr": [1.0e-3, 3.0e-3],
                         "optim.weight_decay": [1.0e-5, 1.0e-4, 1.0e-3]},
                        {"optim.dense_optimizer": "adam"}),
    },
}  # fmt: skip
BUDGET_KEYS = ("train.epochs", "train.steps", "train.batch_size", "train.reports_per_epoch",
               "train.patience", "train.eval_every", "train.checkpoint_every")  # fmt: skip
REFERENCE_SECTIONS = ("grid", "overrides", "rule")
REFERENCE_RULE_NAMES = ("auto", "dense", "fused")  # auto: dense where the tables are small
# keys that reach only the dense optimizer: a fused-rule reference's tables do not read them
DENSE_ONLY_KEYS = frozenset({"optim.lr", "optim.weight_decay", "optim.dense_optimizer"})


def references() -> tuple[str, ...]:
    """The reference models a sweep can train as bars, in the registry's order."""
    return tuple(a for a in archs.ARCHS if a in RECIPES)


@dataclass(frozen=True)
class Reference:
    """One reference model's search: ``arch`` (``model.arch``), its ``grid`` (dotted key ->
    values: every combination is a trial) and the keys fixed for each trial (``overrides``: the
    rules', then the space's); ``edges``: whether its grid's edges are walked (not under the
    smoke variant)."""

    arch: str
    grid: dict[str, list[Any]]
    overrides: dict[str, Any]
    rule: str = "fused"  # how its tables train: "dense" or "fused" (DENSE_REFERENCE_RULES)
    edges: bool = True

    @property
    def trials(self) -> int:
        return math.prod(len(v) for v in self.grid.values())

    @property
    def solved(self) -> bool:
        """Trained by the full-batch solver (``train.solver: lbfgs``)."""
        return self.overrides.get("train.solver") == "lbfgs"

    def fixed(self, base: ExperimentConfig) -> dict[str, Any]:
        """What every trial of it sets besides its grid: the arch (its mixed dims dropped: a
        reference has one table width) and the fixed keys."""
        return {**reference_params(base, self.arch), **self.overrides}

    def points(self, base: ExperimentConfig) -> list[dict[str, Any]]:
        """Each trial's params over ``base``: the fixed keys, then the grid's combination."""
        keys, fixed = list(self.grid), self.fixed(base)
        return [
            {**fixed, **dict(zip(keys, combo, strict=True))}
            for combo in itertools.product(*(self.grid[k] for k in keys))
        ]

    def describe(self, params: dict[str, Any]) -> str:
        """The grid's values of a trial: ``lr=0.03, weight_decay=0.01``."""
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={params.get(k)!r}" for k in self.grid)

    def label(self) -> str:
        """How it trains, for the console: ``dense: L-BFGS to its optimum``, ``dense``,
        ``fused``."""
        return "dense: L-BFGS to its optimum" if self.solved else self.rule


def reference_params(base: ExperimentConfig, arch: str) -> dict[str, Any]:
    """``model.arch: arch`` over ``base``, and its mixed dims dropped (a reference has one table
    width)."""
    params: dict[str, Any] = {"model.arch": arch}
    if base.embeddings.dims is not None:
        params["embeddings.dims"] = None
    if base.embeddings.md_alpha is not None:
        params["embeddings.md_alpha"] = None
    return params


# --- edges ---------------------------------------------------------------------------------------


def walkable(values: list[Any]) -> bool:
    """Whether a grid key's values form a numeric line whose edges a walk can extend: two or more
    distinct numbers >= 0, not booleans."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return len(nums) == len(values) and len(set(nums)) >= 2 and min(nums) >= 0


def next_value(values: list[float], side: str) -> float | None:
    """The value one step beyond ``side`` (``low`` or ``high``) of a key's values: the ratio of
    the two values at that edge (``EDGE_STEP_AT_ZERO`` where the neighbour is 0); None where the
    edge is closed (a low edge at 0)."""
    v = sorted(set(values))
    if side == "low":
        if v[0] <= 0:
            return None
        return v[0] * v[0] / v[1]
    ratio = v[-1] / v[-2] if v[-2] > 0 else EDGE_STEP_AT_ZERO
    return v[-1] * ratio


def tidy(x: float) -> float:
    """``x`` at 12 significant digits (0.1 * 0.1 is 0.010000000000000002)."""
    return float(f"{x:.12g}")


@dataclass
class Walk:
    """An arch's grid as its edges were walked: each key's values so far, and the steps taken
    per ``(key, side)``."""

    grid: dict[str, list[Any]]
    steps: dict[tuple[str, str], int] = field(default_factory=dict)

    def edges(self, best: dict[str, Any]) -> list[tuple[str, str]]:
        """The ``(key, side)`` pairs where the best point's value is an edge of a walkable key."""
        out = []
        for key, values in self.grid.items():
            if not walkable(values) or key not in best:
                continue
            if best[key] == min(values):
                out.append((key, "low"))
            if best[key] == max(values):
                out.append((key, "high"))
        return out

    def next_points(self, best: dict[str, Any]) -> list[dict[str, Any]]:
        """The points one step beyond each edge the best sits on (the best's other values), where
        the side has steps left and is not closed; records them in the grid and the steps."""
        points = []
        for key, side in self.edges(best):
            if self.steps.get((key, side), 0) >= MAX_EDGE_STEPS:
                continue
            value = next_value(self.grid[key], side)
            if value is None:
                continue
            value = tidy(value)
            self.grid[key] = sorted({*self.grid[key], value})
            self.steps[(key, side)] = self.steps.get((key, side), 0) + 1
            points.append({**{k: best[k] for k in self.grid if k in best}, key: value})
        return points

    def summary(self, best: dict[str, Any] | None) -> str:
        """Each walked key: how far it went and where the best is (``weight_decay extended down
        2 steps to 1e-07; best 1e-06, inside``); '' where nothing was walked."""
        parts = []
        for (key, side), n in sorted(self.steps.items()):
            name = key.rsplit(".", 1)[-1]
            end = min(self.grid[key]) if side == "low" else max(self.grid[key])
            where = ""
            if best is not None and key in best:
                edge = best[key] == end
                bound = edge and n >= MAX_EDGE_STEPS
                state = ("still on its edge at the bound" if bound else
                         "on its edge" if edge else "inside")  # fmt: skip
                where = f"; best {best[key]:.3g}, {state}"
            way = "down" if side == "low" else "up"
            steps = f"{n} step{'s' if n > 1 else ''}"
            parts.append(f"{name} extended {way} {steps} to {end:.3g}{where}")
        return "; ".join(parts)

    def still_on_edge(self, best: dict[str, Any]) -> list[str]:
        """The keys whose best value is still an open edge (closed ones: a 0 low edge)."""
        out = []
        for key, side in self.edges(best):
            if next_value(self.grid[key], side) is not None:
                out.append(f"{key.rsplit('.', 1)[-1]} ({side})")
        return out


# --- a space's ``baselines`` ----------------------------------------------------------------------


def baselines_of(
    path: str, value: Any, base: ExperimentConfig, smoke: bool = False
) -> dict[str, Reference]:
    """``baselines``: a list of reference ``model.arch`` values (each by the default rules), or
    a mapping of each to ``{grid: {key: [values]}, overrides: {key: value}, rule: ...}`` (each
    optional; ``{}`` or null: the default rules). Every trial must build from the base."""
    where = f"{path}: baselines"
    if isinstance(value, list):
        if len(set(map(str, value))) != len(value):
            raise ConfigError(f"{where}: {value} lists a model twice")
        value = {arch: None for arch in value}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: a list of {list(references())}, or a mapping of each to "
            f"{{grid: ..., overrides: ...}}; got {value!r}"
        )
    out = {}
    for arch, spec in value.items():
        if arch not in references():
            raise ConfigError(
                f"{where}: {arch!r} is not a reference model; one of "
                f"{list(references())}{nearest(str(arch), references())}"
            )
        ref = _reference(f"{where}.{arch}", arch, spec, smoke, base)
        _check_reference(where, ref, base)
        out[arch] = ref
    return out


def _trains_dense(base: ExperimentConfig, arch: str, spec: dict[str, Any]) -> bool:
    """Whether reference ``arch``'s tables over ``base`` with its entry's ``overrides`` hold at
    most ``DENSE_TABLE_MAX_VALUES`` values (every worker can keep a replica) at every point of
    the entry's ``grid`` (a grid may size the tables: ``embeddings.dim``, ``qr.*``)."""
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
        if sum(t.params for t in table_stats(cfg.tables)) > DENSE_TABLE_MAX_VALUES:
            return False
    return True


def _rule(where: str, arch: str, spec: dict[str, Any], base: ExperimentConfig) -> str:
    """``dense`` or ``fused``: the entry's ``rule``, or by the tables' size (``auto``)."""
    rule = spec.get("rule", "auto")
    if rule not in REFERENCE_RULE_NAMES:
        raise ConfigError(f"{where}.rule: {rule!r}, one of {list(REFERENCE_RULE_NAMES)}"
                          f"{nearest(str(rule), REFERENCE_RULE_NAMES)}")  # fmt: skip
    if rule == "auto":
        return "dense" if _trains_dense(base, arch, spec) else "fused"
    return str(rule)


def _check_keys(where: str, arch: str, rule: str, grid: Any, overrides: Any) -> None:
    """The entry's grid and overrides: mappings of config keys that ``arch`` reads and ``rule``
    leaves to them."""
    valid = ExperimentConfig.all_keys()
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
    if rule == "fused" and set(grid) <= DENSE_ONLY_KEYS:
        raise ConfigError(
            f"{where}.grid: {sorted(grid)} under the fused rule (rule: fused, or auto where the "
            f"tables hold more than {DENSE_TABLE_MAX_VALUES} values) tunes only the weights "
            f"outside the tables: the tables train with optim.embedding_lr and "
            f"optim.embedding_weight_decay; search those, or set rule: dense"
        )


MODEL_KEYS_OF_EVERY_ARCH = ("model.arch", "model.num_dense")


def unread(arch_names: list[str], key: str) -> bool:
    """Whether ``key`` is a model key that none of ``arch_names`` reads (``recsys.archs``)."""
    if not key.startswith("model.") or key in MODEL_KEYS_OF_EVERY_ARCH:
        return False
    return not any(key in archs.get(n).reads for n in arch_names)


def _reference(where: str, arch: str, spec: Any, smoke: bool, base: ExperimentConfig) -> Reference:
    """One arch's grid and fixed keys from its entry (``None``: the default rules): its
    ``rule``'s recipe (``RECIPES``) over ``REFERENCE_RULES`` (and ``DENSE_REFERENCE_RULES``),
    then the entry's; under ``smoke``, one trial (each grid key's first value) without the
    budget keys, and no edge walked."""
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected {{grid: ..., overrides: ...}} or {{}}, got {spec!r}")
    for key in spec:
        if key not in REFERENCE_SECTIONS:
            why = f"unknown {key!r}{nearest(str(key), REFERENCE_SECTIONS)}"
            raise ConfigError(f"{where}: {why} (one of {list(REFERENCE_SECTIONS)})")
    rule = _rule(where, arch, spec, base)
    recipe = RECIPES[arch][rule]
    grid: dict[str, Any] = spec.get("grid", recipe.grid)
    overrides = spec.get("overrides") or {}
    _check_keys(where, arch, rule, grid, overrides)
    dense = DENSE_REFERENCE_RULES if rule == "dense" else {}
    fixed = {**REFERENCE_RULES, **dense, **recipe.overrides, **overrides}
    if smoke:
        grid = {k: v[:1] for k, v in grid.items()}
        fixed = {k: v for k, v in fixed.items() if k not in BUDGET_KEYS}
    ref = Reference(arch, {k: list(v) for k, v in grid.items()}, fixed, rule, edges=not smoke)
    if ref.trials > MAX_REFERENCE_TRIALS:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise ConfigError(
            f"{where}.grid: {sizes} = {ref.trials} trials; a reference's grid has at most "
            f"{MAX_REFERENCE_TRIALS} (a few values of its learning rate and weight decay; an edge "
            "the best sits on is extended by itself)"
        )
    return ref


def _check_rule_key(where: str, key: str, rule: str) -> None:
    """Refuse an entry key that the dense rule sets or that does nothing under it (``where``:
    the entry's section), naming the rule."""
    if rule != "dense":
        return
    dense = (f"this reference trains its tables dense (rule: dense; by default where they hold "
             f"at most {DENSE_TABLE_MAX_VALUES} values)")  # fmt: skip
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


def with_grid(ref: Reference, grid: dict[str, list[Any]]) -> Reference:
    """``ref`` with another grid (a walk's)."""
    return replace(ref, grid={k: list(v) for k, v in grid.items()})
