"""Retrain the champion on a later period, and promote it only on a real win (``recsys-retrain``).

A recommender's log never ends: each period brings new rows, new users and new items, prepared
with the earlier period's vocabularies (``recsys-preprocess --like``). The registered model's
configuration is trained further on the new period, warm-started from its checkpoint
(``train.init_from``: tables, dense weights, optimizer state; rows a grown vocabulary added
initialised), for the epochs its trial peaked at (or ``--epochs``). Beside it, on the new
period's held-out test rows (the split its folder defines), two bars: the frozen champion (its
checkpoint as it is, scored once) and a model of the same configuration trained from scratch on
the new period. Retrained and from-scratch models are trained with ``--seeds`` seeds each, every
training a Ray Train run (the address rules, workers and resume of ``recsys-train``: re-running
the command resumes the unfinished ones and trains nothing for the finished).

The retrained model is registered as a new version of the model (its first seed's), with its
lineage (``recsys.parent_version``, the data of each period) and moves ``@champion`` only where
its lead over the frozen champion is outside the seed noise: the frozen score is outside the 95%
interval of the retrained seeds' mean (``recsys.tune.confirm``). Otherwise the alias stays:
``kept @champion (version K): lead +x inside the noise``. Everything lands in MLflow under one
parent run per retrain (experiment ``retrain-<NAME>``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys.config import ExperimentConfig
from recsys.data.columns import Columns, RowSource
from recsys.tracking.tags import Tag
from recsys.tracking.tracker import Tracker, flat_params
from recsys.train.ray_trainer import Resources

ROLES = ("retrained", "scratch")  # the trainings of a retrain, per seed
CHAMPION = "champion"


@dataclass(frozen=True)
class Plan:
    """What a retrain trains: the registered version, its run and checkpoint, the configuration
    on the new period, the seeds and the metric that decides."""

    name: str
    version: str
    run_id: str
    checkpoint: str
    frozen: ExperimentConfig  # the champion's configuration, as it was trained
    cfg: ExperimentConfig  # on the new period, its budget set
    data: str
    seeds: int
    metric: str  # test_<metric> decides: "auc", "gauc" or "log_loss"
    mode: str

    @property
    def key(self) -> str:
        """The retrain's name: model, version and new data (what a re-run finds again)."""
        digest = hashlib.sha256(os.path.abspath(self.data).encode()).hexdigest()[:8]
        return f"{self.name}-v{self.version}-{digest}"

    def config_of(self, role: str, seed: int) -> ExperimentConfig:
        """The configuration of one training: ``seed`` added to the champion's; a retrained
        one starts from the champion's checkpoint."""
        warm = {"train.init_from": self.checkpoint} if role == "retrained" else {}
        return self.cfg.with_overrides({"train.seed": self.cfg.train.seed + seed, **warm})


def plan_retrain(
    tracker: Tracker, model_uri: str, data: str, epochs: float | None = None, seeds: int = 3,
    metric: str = "auc",
) -> Plan:  # fmt: skip
    """The retrain of ``model_uri`` on the prepared folder ``data``: its configuration with
    ``data``'s rows (its tables as ``data``'s ``meta.json`` sizes them: the same, or grown),
    trained for the epochs its trial peaked at (``epochs`` to choose), no patience (the new
    period's validation rows are held out for nothing else)."""
    from recsys.data.dataset import with_data
    from recsys.serving.mlflow_model import registered_trial, registered_version
    from recsys.tune.refit import peak_epochs

    if seeds < 2:
        raise ValueError(f"--seeds {seeds}: at least 2 (the noise needs two values)")
    if metric not in ("auc", "gauc", "log_loss"):
        raise ValueError(f"--metric {metric!r}: one of auc, gauc, log_loss")
    source = registered_version(tracker, model_uri)
    name, version = str(source.name), str(source.version)
    run_id, ckpt, frozen = registered_trial(tracker, model_uri)
    cfg = with_data(frozen, {"data.source": "prepared", "data.paths": [data], "data.refit": False})
    check_same_features(frozen, cfg, data)
    cfg = cfg.with_overrides({"embeddings.num_embeddings": grown_rows(frozen, data)})
    if metric == "gauc" and not cfg.data.group_by:
        raise ValueError(f"--metric gauc: {data} has no groups (its schema names no group_by)")
    if cfg.train.solver != "lbfgs":
        budget = epochs if epochs is not None else trained_epochs(tracker, run_id, peak_epochs)
        cfg = cfg.with_overrides({"train.epochs": budget, "train.patience": 0})
    mode = "min" if metric == "log_loss" else "max"
    return Plan(name, version, run_id, ckpt, frozen, cfg, data, seeds, metric, mode)


def grown_rows(frozen: ExperimentConfig, data: str) -> list[int]:
    """Each table's rows on the new period: the champion's, or the new folder's where its
    vocabulary grew past them (``--grow-vocab``)."""
    from recsys.data.prepared.meta import read_meta

    sizes = read_meta(data)["table_sizes"]
    return [max(a, int(b)) for a, b in zip(frozen.embeddings.num_embeddings, sizes, strict=True)]


def trained_epochs(tracker: Tracker, run_id: str, peak: Callable[[Tracker, str], float]) -> float:
    """The epochs a model was trained for: a refit's or a retrain's own budget, a trial's
    peak."""
    run = tracker.client.get_run(run_id)
    if run.data.tags.get(Tag.KIND) in ("refit", *ROLES):  # trained for a budget of its own
        return float(run.data.params.get("train.epochs", 1.0))
    return peak(tracker, run_id)


def check_same_features(frozen: ExperimentConfig, cfg: ExperimentConfig, data: str) -> None:
    """``data`` was prepared like the champion's data (``recsys-preprocess --like``: its
    ``meta.json`` names that folder, or a folder prepared like it, and so on), so its ids mean
    what the champion's tables learnt, with the same features; else a ``ValueError`` says which
    and how to prepare it."""
    from recsys.runtime.storage import is_uri

    def where(path: str) -> str:
        return path if is_uri(path) else os.path.abspath(path)

    old, new = frozen.embeddings, cfg.embeddings
    how = f"prepare the new period with recsys-preprocess --like {frozen.data.paths[0]}"
    if old.names() != new.names():
        raise ValueError(f"--data {data}: its features {new.names()} are not the model's "
                         f"{old.names()}: {how}")  # fmt: skip
    chain = like_chain(data)
    if where(frozen.data.paths[0]) not in [where(data), *chain]:
        said = f"prepared like {' like '.join(chain)}" if chain else \
            "prepared with vocabularies of its own"  # fmt: skip
        raise ValueError(
            f"--data {data}: {said}, not like the model's data {frozen.data.paths[0]} (its ids "
            f"would mean other values): {how}"
        )


def like_chain(folder: str, limit: int = 1000) -> list[str]:
    """The folders ``folder`` was prepared like, nearest first (``meta.json``'s ``like``: week 3
    like week 2 like week 1), as far as they are readable."""
    from recsys.data.errors import DataError
    from recsys.data.prepared.meta import read_meta

    out: list[str] = []
    while len(out) < limit:
        try:
            like = (read_meta(folder).get("like") or {}).get("folder")
        except DataError:
            break
        if not like or like in out:
            break
        out.append(like)
        folder = like
    return out


def score_frozen(plan: Plan) -> dict[str, float]:
    """The champion as it is on the new period's test rows, in this process on the CPU: its own
    tables, so an id a grown vocabulary gave a new row (``--grow-vocab``) is read as the champion
    would have read it, from its unseen rows (``frozen_ids``)."""
    import torch

    from recsys.data.input.loader import load_splits
    from recsys.distributed.checkpoint import load_model_unsharded
    from recsys.distributed.env import WorkerEnv
    from recsys.models import ModelAndLoss, build_model
    from recsys.train.evaluation import evaluate

    frozen = plan.frozen.with_overrides({"data.paths": [plan.data], "embeddings.dtype": "fp32",
                                         "data.group_by": plan.cfg.data.group_by})  # fmt: skip
    wrapper = ModelAndLoss(build_model(frozen.model, frozen.embeddings, len(frozen.loss.tasks)),
                           frozen.loss)  # fmt: skip
    load_model_unsharded(plan.checkpoint, wrapper)
    rows = frozen.embeddings.num_embeddings
    test = load_splits(plan.cfg.data, frozen.model.num_dense, rows).test
    maps = frozen_ids(plan.data, rows)
    env = WorkerEnv(0, 1, 0, 1, torch.device("cpu"))
    return evaluate(wrapper.eval(), MappedIds(test, maps) if maps else test, frozen, env, "test")


def frozen_ids(folder: str, rows: list[int]) -> dict[int, np.ndarray]:
    """Per feature whose table in ``folder`` grew past the champion's ``rows``: each row id of
    the grown table mapped to the champion's (an earlier row to itself, a new row to the unseen
    row its value's hash picks: ``Vocabulary.ids``)."""
    from recsys.prepare.like import load_fitted

    fitted = load_fitted(folder)
    maps = {}
    for f, name in enumerate(fitted.schema.sparse):
        v = fitted.vocabs.get(name)
        if v is None or v.rows <= rows[f]:
            continue
        m = np.arange(v.rows, dtype=np.int64)
        new = np.arange(rows[f], v.rows)
        m[new] = (1 + v.hashes[new - 1 - v.oov_buckets] % np.uint64(v.oov_buckets)).astype(np.int64)
        maps[f] = m
    return maps


class MappedIds(RowSource):
    """``base``'s rows with feature ``f``'s ids replaced by ``maps[f][id]``."""

    def __init__(self, base: RowSource, maps: dict[int, np.ndarray]) -> None:
        self.base, self.maps, self.source = base, maps, base.source

    def __len__(self) -> int:
        return len(self.base)

    def read(self, start: int, stop: int) -> Any:
        return self._mapped(self.base.read(start, stop))

    def take(self, idx: np.ndarray) -> Any:
        return self._mapped(self.base.take(idx))

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        return self.base.groups(start, stop)

    def _mapped(self, cols: Any) -> Any:
        if isinstance(cols, Columns):
            sparse = np.array(cols.sparse)
            for f, m in self.maps.items():
                sparse[:, f, :] = m[sparse[:, f, :]]
            return dataclasses.replace(cols, sparse=sparse)
        values = tuple(self.maps[f][v].astype(v.dtype) if f in self.maps else v
                       for f, v in enumerate(cols.values))  # fmt: skip
        return dataclasses.replace(cols, values=values)


@dataclass(frozen=True)
class Decision:
    """The retrained seeds' spread against the frozen score: promote where outside the noise."""

    promote: bool
    line: str


def decide(plan: Plan, retrained: list[float], frozen: float, kept_version: str) -> Decision:
    """Whether the retrained model's lead over the frozen champion is outside the seed noise:
    the frozen score outside the 95% interval of the retrained seeds' mean (in the metric's
    direction)."""
    from recsys.tune.confirm import LEVEL, spread

    s = spread("retrained", retrained)
    sign = 1.0 if plan.mode == "max" else -1.0
    lead = sign * (s.mean - frozen)
    outside = (s.low > frozen) if plan.mode == "max" else (s.high < frozen)
    interval = f"{LEVEL:.0%} CI [{s.low:.4f}, {s.high:.4f}] of {len(retrained)} seeds"
    metric = f"test_{plan.metric}"
    if outside:
        return Decision(
            True,
            f"retrained {metric} {s.mean:.4f} ({interval}) against the frozen "
            f"champion's {frozen:.4f}: lead {lead:+.4f}, outside the noise",
        )
    return Decision(
        False,
        f"kept @{CHAMPION} (version {kept_version}): lead {lead:+.4f} inside "
        f"the noise ({metric} {s.mean:.4f}, {interval}; frozen {frozen:.4f})",
    )


@dataclass
class Outcome:
    """A retrain's result: each training's test metric by role, the frozen champion's, the
    decision, and the registered version (if any)."""

    scores: dict[str, list[float]]
    frozen: float
    decision: Decision
    version: str = ""


def run_retrain(
    plan: Plan, tracker: Tracker, resources: Resources, storage: str, out_dir: str,
    log: Callable[[str], None] = print,
) -> Outcome:  # fmt: skip
    """Train every seed of both roles (Ray connected; each resumes where a run of this retrain
    left it), score the frozen champion, register the retrained model and move ``@champion``
    where ``decide`` says so; all under one MLflow parent run."""
    from recsys.runtime.storage import join as storage_join

    exp = tracker.experiment(f"retrain-{plan.name}")
    parent = tracker.parent_run(exp, plan.key)
    tracker.set_tags(parent, {Tag.PARENT_VERSION: plan.version,
                              Tag.DATA: os.path.abspath(plan.data)})  # fmt: skip
    folder = storage_join(storage, f"retrain-{plan.key}")
    scores: dict[str, list[float]] = {r: [] for r in ROLES}
    checkpoints: dict[str, str] = {}
    for seed in range(1, plan.seeds + 1):
        for role in ROLES:
            metrics, ckpt, run_id = train_one(plan, role, seed, tracker, exp, parent, resources,
                                              folder)  # fmt: skip
            scores[role].append(float(metrics.get(f"test_{plan.metric}", math.nan)))
            checkpoints[f"{role}-{seed}"] = ckpt
            log(f"{role} seed {seed}: test_{plan.metric} {scores[role][-1]:.4f} (run {run_id})")
    frozen_scores = score_frozen(plan)
    frozen = frozen_scores.get(f"test_{plan.metric}", math.nan)
    decision = decide(plan, scores["retrained"], frozen, plan.version)
    log(f"frozen champion (version {plan.version}): test_{plan.metric} {frozen:.4f}")
    log(decision.line)
    outcome = Outcome(scores, frozen, decision)
    outcome.version = register(plan, tracker, exp, checkpoints["retrained-1"], out_dir, decision)
    summary = {f"{r}_{plan.metric}_mean": float(sum(v) / len(v)) for r, v in scores.items()}
    tracker.log_values(parent, {**summary, **{f"frozen_{k.removeprefix('test_')}": v
                                              for k, v in frozen_scores.items()}})  # fmt: skip
    tracker.set_tags(parent, {Tag.DECISION: decision.line,
                              Tag.REGISTERED_VERSION: outcome.version})  # fmt: skip
    tracker.finish(parent)
    return outcome


def train_one(
    plan: Plan, role: str, seed: int, tracker: Tracker, exp: str, parent: str,
    resources: Resources, folder: str,
) -> tuple[dict[str, Any], str, str]:  # fmt: skip
    """One training (a Ray Train run named ``<role>-seed<seed>`` in ``folder``, resumed where a
    run left it), its reports logged to its MLflow run; its last report, checkpoint, run id."""
    import yaml

    from recsys.runtime.storage import as_uri
    from recsys.tracking import inputs
    from recsys.tracking.report import MlflowReportCallback
    from recsys.train.ray_trainer import make_trainer

    cfg = plan.config_of(role, seed)
    trial = f"{plan.key}.{role}-{seed}"
    if done := finished(tracker, exp, trial, plan.metric):  # a re-run trains it no more
        return done
    run_id = tracker.trial_run(exp, parent, plan.key, trial, flat_params(cfg.to_dict()),
                               kind=role, name=f"{role} seed {seed}")  # fmt: skip
    tracker.log_text(run_id, yaml.safe_dump(cfg.to_dict()), "config.yaml")
    tracker.log_dataset(run_id, lambda: inputs.describe(cfg.data))
    trainer = make_trainer(
        cfg,
        resources,
        name=f"{role}-seed{seed}",
        storage_path=folder,
        max_failures=2,
        callbacks=[MlflowReportCallback(tracker.uri, run_id)],
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise ValueError(f"the {role} training of seed {seed} left no checkpoint")
    ckpt = as_uri(result.checkpoint.filesystem, result.checkpoint.path)
    tracker.set_tags(run_id, {Tag.BEST_CHECKPOINT: ckpt, Tag.LAST_CHECKPOINT: ckpt})
    tracker.finish(run_id)
    return dict(result.metrics or {}), ckpt, run_id


def finished(tracker: Tracker, exp: str, trial: str, metric: str
             ) -> tuple[dict[str, Any], str, str] | None:  # fmt: skip
    """A training of this retrain that an earlier run finished (its MLflow run ``FINISHED``
    with its checkpoint and its test score): its metrics, checkpoint and run id; else None."""
    run = tracker.find_trial_run(exp, trial)
    if run is None or run.info.status != "FINISHED":
        return None
    ckpt = run.data.tags.get(Tag.BEST_CHECKPOINT)
    if not ckpt or f"test_{metric}" not in run.data.metrics:
        return None
    return dict(run.data.metrics), ckpt, str(run.info.run_id)


def register(
    plan: Plan, tracker: Tracker, exp: str, checkpoint: str, out_dir: str, decision: Decision
) -> str:
    """Export the retrained model (its first seed) as a new version of ``plan.name``, with its
    lineage, and ``@champion`` where ``decision`` promotes it; its version. A retrain run again
    after it registered finds its version and registers none."""
    from recsys.serving.mlflow_model import export_to_run, newest_version

    run = tracker.find_trial_run(exp, f"{plan.key}.retrained-1")
    assert run is not None
    run_id = str(run.info.run_id)
    client = tracker.client
    if not any(v.run_id == run_id for v in client.search_model_versions(f"name = '{plan.name}'")):
        export_to_run(tracker, run_id, checkpoint, plan.config_of("retrained", 1), out_dir,
                      "int8", plan.name)  # fmt: skip
    version = newest_version(tracker, plan.name, run_id)
    tags = {Tag.PARENT_VERSION: plan.version, Tag.DATA: os.path.abspath(plan.data),
            Tag.PARENT_DATA: ",".join(plan.frozen.data.paths),
            Tag.CHAMPION: "yes" if decision.promote else f"no: {decision.line}"}  # fmt: skip
    for k, v in tags.items():
        client.set_model_version_tag(plan.name, version, k, v)
    if decision.promote:
        client.set_registered_model_alias(plan.name, CHAMPION, version)
    return str(version)
