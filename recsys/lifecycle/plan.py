"""What a retrain trains, and every refusal before it does (``plan_retrain``).

The registered version's run gives the configuration it was trained with (``config.yaml``) and
its checkpoint. The new period must be a local prepared folder whose ids mean what the
champion's tables learnt: its vocabularies start with the champion's, row for row
(``recsys-preprocess --like``, grown or not: ``check_vocabularies``), its other features laid
out alike; it must hold test rows (they decide), validation rows for ``--refit``, and groups
for ``--metric gauc``; and it must not be the data the version was trained on (after a
promotion, ``@champion`` names the retrained version: its data is done). The configuration on
the new period: the champion's own (its tables grown where the vocabularies grew, its shared
tables, dims and QR split as they were), trained for the epochs its trial peaked at (a refit's
or a retrain's own epochs; ``--epochs`` to choose) to the end, every split evaluated whole
(``train.eval_batches: 0``: the frozen champion is scored on the same rows), the from-scratch
model never warm-started. The learning-rate schedule starts again, its warmup and decay steps
as the champion's (a refit's as its trial's: ``unstretched``). A refit (``Plan.refit_of``)
trains the same epochs of the training and validation rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from recsys.config import ExperimentConfig
from recsys.tracking.tags import Tag

if TYPE_CHECKING:
    from recsys.tracking.tracker import Tracker

ROLES = ("retrained", "scratch")  # the trainings of a retrain, per seed
METRICS = ("auc", "gauc", "log_loss")


@dataclass(frozen=True)
class Plan:
    """What a retrain trains: the registered version, its run and checkpoint, the configuration
    on the new period, the seeds and the metric that decides."""

    name: str
    version: str
    run_id: str
    checkpoint: str
    frozen: ExperimentConfig  # the champion's configuration, as it was trained
    cfg: ExperimentConfig  # on the new period, its budget set, warm start and seed not yet
    data: str
    seeds: int
    metric: str  # test_<metric> decides: "auc", "gauc" or "log_loss"
    mode: str
    refit: bool = False  # the pick's registered seed trained again on training + validation

    @property
    def key(self) -> str:
        """The retrain's name: model, version, and a digest of the new data and the whole
        configuration (a re-run with the same finds its trainings again; another ``--epochs``
        is another retrain)."""
        text = json.dumps([os.path.abspath(self.data), self.cfg.to_dict()], sort_keys=True,
                          default=str)  # fmt: skip
        return f"{self.name}-v{self.version}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"

    def config_of(self, role: str, seed: int) -> ExperimentConfig:
        """The configuration of one training: ``seed`` added to the champion's; a retrained one
        starts from the champion's checkpoint, one from scratch from nothing."""
        start = self.checkpoint if role == "retrained" else ""
        return self.cfg.with_overrides({"train.seed": self.cfg.train.seed + seed,
                                        "train.init_from": start})  # fmt: skip

    def refit_of(self, role: str, seed: int) -> ExperimentConfig:
        """One training's configuration (``config_of``) trained again on the new period's
        training and validation rows (``recsys.tune.refit.refit_config``): for the same epochs
        (of those rows), its schedule's steps stretched by the rows' growth, from the same
        start."""
        from recsys.data.dataset import split_rows
        from recsys.tune.refit import refit_config

        cfg = self.config_of(role, seed)
        train, val = split_rows(cfg)
        return refit_config(cfg, cfg.train.epochs, (train + val) / train)


def plan_retrain(
    tracker: Tracker, model_uri: str, data: str, epochs: float | None = None, seeds: int = 3,
    metric: str = "auc", refit: bool = False,
) -> Plan:  # fmt: skip
    """The retrain of ``model_uri`` on the prepared folder ``data`` (the module's rules;
    ``refit``: the folder holds validation rows to refit on); a ``ValueError`` names what is
    refused."""
    from recsys.serving.mlflow_model import registered_trial, registered_version
    from recsys.tune.refit import peak_epochs

    check_request(model_uri, data, seeds, metric, refit)
    source = registered_version(tracker, model_uri)
    name, version = str(source.name), str(source.version)
    run_id, ckpt, frozen = registered_trial(tracker, model_uri)
    cfg = on_period(frozen, data)
    check_period(frozen, cfg, data, metric, f"version {version}")
    if cfg.train.solver != "lbfgs":
        budget = epochs if epochs is not None else trained_epochs(tracker, run_id, peak_epochs)
        cfg = unstretched(frozen, cfg).with_overrides({"train.epochs": budget,
                                                       "train.patience": 0})  # fmt: skip
    mode = "min" if metric == "log_loss" else "max"
    return Plan(name, version, run_id, ckpt, frozen, cfg, data, seeds, metric, mode, refit)


def unstretched(frozen: ExperimentConfig, cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with its schedule's steps as the trial's where ``frozen`` is a refit (a sweep's or a
    retrain's): its refit stretched them by its rows' growth (``refit_config``), which each later
    period's refit would otherwise stretch again."""
    from recsys.data.dataset import split_rows
    from recsys.tune.refit import stretched

    if not frozen.data.refit:
        return cfg
    train, val = split_rows(frozen)
    return cfg.with_overrides(stretched(cfg, train / (train + val)))


def check_request(model_uri: str, data: str, seeds: int, metric: str, refit: bool) -> None:
    """What the request alone refuses, before the tracking store is read (``recsys-retrain``
    says it in the time it takes to parse its command line): a malformed model URI, too few
    seeds, an unknown metric, a folder that is not a local finished preparation, ``refit``
    where the folder has no validation rows; a ``ValueError`` (a ``DataError`` for the folder)
    names it."""
    from recsys.data.prepared.meta import read_meta
    from recsys.tracking.uris import parse_model_uri

    parse_model_uri(model_uri)
    if seeds < 2:
        raise ValueError(f"--seeds {seeds}: at least 2 (the noise needs two values)")
    if metric not in METRICS:
        raise ValueError(f"--metric {metric!r}: one of {', '.join(METRICS)}")
    check_local(data)
    meta = read_meta(data)  # a finished preparation
    if refit and not meta["rows"].get("val"):
        raise ValueError(f"--refit: {data} has no validation rows to refit on (meta.json rows); "
                         "prepare it with split.val_fraction > 0")  # fmt: skip


def check_local(data: str) -> None:
    """A retrain reads a local prepared folder (the frozen champion is scored in this process)."""
    from recsys.runtime.storage import is_uri

    if is_uri(data):
        raise ValueError(f"--data {data}: a retrain reads a local prepared folder (one every "
                         "node sees); copy the folder from the store first")  # fmt: skip


def on_period(frozen: ExperimentConfig, data: str) -> ExperimentConfig:
    """The champion's configuration on ``data``, whose features must be the model's
    (``same_features``, before the period's other checks): its tasks from the folder, its
    own shared tables kept (a reference's were cleared: a table per feature), each table's rows
    the champion's or, where the vocabulary grew past it, the folder's, its dims and QR split the
    champion's (``same_tables``); every split evaluated whole, no warm start yet."""
    from recsys.data.dataset import with_data
    from recsys.data.prepared.meta import read_meta

    emb = frozen.embeddings
    if frozen.data.source == "prepared":  # (another source: refused by check_period)
        same_features(emb.names(), list(read_meta(data)["feature_names"]), data, like_hint(frozen))
    cfg = with_data(frozen, {"data.source": "prepared", "data.paths": [data], "data.refit": False})
    rows = grown_rows(frozen, data)
    return cfg.with_overrides({
        "embeddings.shared": dict(emb.shared), "embeddings.sequence_targets":
        dict(emb.sequence_targets), "embeddings.num_embeddings": rows,
        "train.eval_batches": 0, "train.init_from": "", **same_tables(frozen, rows),
    })  # fmt: skip


def like_hint(frozen: ExperimentConfig) -> str:
    """How to prepare a new period for the champion ``frozen`` (the refusals' advice)."""
    own = frozen.data.paths[0] if frozen.data.paths else ""
    return f"prepare the new period with recsys-preprocess --like {own}"


def same_features(names: list[str], theirs: list[str], data: str, how: str) -> None:
    """``data``'s features are the model's, in its order; else a ``ValueError`` names both and
    ``how`` to prepare the period."""
    if names != theirs:
        raise ValueError(f"--data {data}: its features {theirs} are not the model's {names}: "
                         f"{how}")  # fmt: skip


def same_tables(frozen: ExperimentConfig, rows: list[int]) -> dict[str, Any]:
    """Overrides that keep each of the champion's tables as it was built, with ``rows`` (its
    grown rows): a warm start then finds every saved table, only longer. Its mixed dims
    (``md_alpha``, which the tables' rows decide) pinned as ``embeddings.dims``; a table it
    kept whole that grew past ``qr.threshold`` named in ``qr.whole``."""
    emb, out = frozen.embeddings, dict[str, Any]()
    if emb.md_alpha is not None:
        out["embeddings.md_alpha"], out["embeddings.dims"] = None, emb.table_dims()
    if emb.qr.enabled:
        owners = [(f, r) for f, r in zip(emb.names(), rows, strict=True) if f not in emb.shared]
        past = [f for f, r in owners if not emb.qr_split(f) and emb.qr.applies_to(r, f)]
        if past:
            out["embeddings.qr.whole"] = [*emb.qr.whole, *past]
    return out


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


def check_period(frozen: ExperimentConfig, cfg: ExperimentConfig, data: str, metric: str,
                 version: str) -> None:  # fmt: skip
    """``data`` is a later period for the champion (the module's rules), or a ``ValueError``
    says what is wrong and how to prepare it."""
    from recsys.data.prepared.meta import read_meta

    own = frozen.data.paths[0] if frozen.data.paths else ""
    how = like_hint(frozen)
    if frozen.data.source != "prepared":
        raise ValueError(f"{version} was trained on data.source={frozen.data.source}: a retrain "
                         "continues a model of a prepared folder")  # fmt: skip
    if os.path.abspath(data) == os.path.abspath(own):
        raise ValueError(f"--data {data}: {version} was trained on this folder already; a "
                         "retrain trains on a later period")  # fmt: skip
    same_features(frozen.embeddings.names(), cfg.embeddings.names(), data, how)
    check_vocabularies(own, data, how)  # (both folders read: the champion's data named)
    meta = read_meta(data)
    seen = sorted(set(meta.get("sources") or []) & set(read_meta(own).get("sources") or []))
    if seen:
        more = f" and {len(seen) - 1} more" if len(seen) > 1 else ""
        raise ValueError(f"--data {data}: prepared from files {version} was trained on ({seen[0]}"
                         f"{more}, sources of {own} too); its validation and test rows would "
                         "score rows the model learned from: a retrain trains on a later "
                         "period's files")  # fmt: skip
    if not meta["rows"].get("test"):
        raise ValueError(f"--data {data}: no test rows (meta.json rows); the test rows decide: "
                         "prepare it with split.test_fraction > 0")  # fmt: skip
    if metric == "gauc" and not cfg.data.group_by:
        raise ValueError(f"--metric gauc: {data} has no groups (its schema names no group_by)")


def check_vocabularies(own: str, data: str, how: str) -> None:
    """Each of ``data``'s features reads the rows the champion's data (``own``) gave its ids:
    a vocabulary starts with the champion's, row for row (grown or not), and every other
    feature's table is laid out alike; else a ``ValueError`` names the feature."""
    from recsys.data.errors import DataError
    from recsys.prepare.like import load_fitted

    try:
        earlier, now = load_fitted(own), load_fitted(data)
        layouts = (_layouts(own), _layouts(data))
    except (DataError, OSError, ValueError) as e:
        raise ValueError(f"--data {data}: the champion's data {own} cannot be read to check "
                         f"that the ids mean the same ({e})") from None  # fmt: skip
    for name, old in earlier.vocabs.items():
        new = now.vocabs.get(name)
        same = new is not None and len(new.hashes) >= len(old.hashes) and np.array_equal(
            new.hashes[: len(old.hashes)], old.hashes)  # fmt: skip
        if not same or new.oov_buckets != old.oov_buckets:  # type: ignore[union-attr]
            raise ValueError(
                f"--data {data}: feature {name!r}'s vocabulary is not the "
                f"champion's (from {own}): its ids would read other rows; {how}"
            )
    for name, layout in layouts[0].items():
        if layout.get("kind") != "vocabulary" and layouts[1].get(name) != layout:
            raise ValueError(
                f"--data {data}: feature {name!r} is laid out as "
                f"{layouts[1].get(name)}, the champion's as {layout}; {how}"
            )


def _layouts(folder: str) -> dict[str, Any]:
    from recsys.data.prepared.meta import read_meta

    return dict(read_meta(folder)["features"])
