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
    run: {num_workers: 1, max_concurrent: 2}   # sweep options the command line did not type
                                     # (recsys.cli.sweep.RUN, by their flags' names)

``baselines`` and ``confirm`` are the sweep's later phases (``recsys.tune.phases``); ``smoke`` may
set its own. ``--confirm K --seeds N`` on the command line replace ``confirm``.

``baselines`` lists the reference models trained as bars, each by its rules
(``recsys.tune.references``: a small grid trained to convergence, its edges walked).

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

from recsys.config import MEAN_TASK, MONITORED, ExperimentConfig, is_map_key, monitor_parts
from recsys.config_registry import EXPERIMENTS, from_file, named
from recsys.configlib import ConfigError, nearest
from recsys.data.dataset import check_carried, source_for, with_data
from recsys.runtime.storage import resolved
from recsys.tune.references import Reference, baselines_of, reference_params, unread

PRIMITIVES = ("choice", "grid", "uniform", "loguniform", "randint")
MAX_COMBINATIONS = 4096
SECTIONS = (
    "description", "base", "num_samples", "overrides", "space", "metric", "mode", "smoke",
    "constraints", "baselines", "confirm", "run",
)  # fmt: skip
SMOKE_SECTIONS = ("num_samples", "overrides", "baselines", "confirm")
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
    run: dict[str, Any] = field(default_factory=dict)  # the ``run`` section, as written

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


def check_builds(source: str, base: ExperimentConfig, dims: list[Dimension]) -> None:
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
    raw = _read(path)
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
        check_carried(base)
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
    check_builds(path, base, dims)
    _check_read(path, base, dims, overrides)
    objectives = _objectives(path, raw)
    _check_metric(path, base, objectives[0].metric)
    own: dict[str, Any] = {
        k: smoke_raw[k] for k in ("baselines", "confirm") if k in smoke_raw and smoke
    }
    phases: dict[str, Any] = {**raw, **own}  # the smoke variant's own phases, if it has them
    references = baselines_of(path, phases.get("baselines") or [], base, smoke)
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
        run=_run(path, raw.get("run") or {}),
    )


def _run(path: str, run: Any) -> dict[str, Any]:
    """The ``run`` section: a mapping (its keys and values are checked by the command that runs
    the sweep, as its flags: ``recsys.cli.sweep.run_defaults``)."""
    if not isinstance(run, dict):
        raise ConfigError(f"{path}: run: expected a mapping of options, got {run!r}")
    return dict(run)


def _read(path: str) -> dict[str, Any]:
    """A space file's sections, each a known one (an unknown one named, with the nearest)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{path}: unknown section {key!r}{nearest(key, SECTIONS)}")
    return raw


def _smoke(path: str, smoke: Any) -> dict[str, Any]:
    if not isinstance(smoke, dict):
        raise ConfigError(f"{path}: smoke: expected a mapping, got {smoke!r}")
    for key in smoke:
        if key not in SMOKE_SECTIONS:
            raise ConfigError(
                f"{path}: smoke: unknown section {key!r}{nearest(str(key), SMOKE_SECTIONS)}"
            )
    return smoke


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
    if name == "gauc" and not base.data.group_by:
        raise ConfigError(
            f"{path}: {metric} cannot be computed: GAUC needs groups, a prepared folder whose "
            "schema names the column that groups rows (group_by: user); the data here has none"
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
