"""Which model a sweep publishes: its best whatever its kind (a reference no search trial beats,
else its best search trial, by confirmed mean where a seed check ran), exported into that trial's
run and, with a name, registered with the sweep's verdict (``recsys.serving.mlflow_model`` records
and registers an export).

    run_id, report, uri = export_best(tracking_uri, "default", "runs/default/export")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from recsys.serving.export import ExportReport
from recsys.serving.mlflow_model import crown, export_to_run
from recsys.tracking.tags import Tag
from recsys.tracking.tracker import Tracker, run_config
from recsys.tune.results import SCORED


def parent_tags(tracker: Tracker, sweep: str) -> dict[str, str]:
    """The tags of the sweep's parent run ({} before its summary; an unknown sweep is named)."""
    parents = tracker.runs(sweep, f"tags.`{Tag.KIND}` = 'sweep:{sweep}'")
    if not parents:
        if not tracker.has_experiment(sweep):
            raise ValueError(f"no sweep named {sweep!r} in {tracker.uri}")
        return {}
    return dict(parents[0].data.tags)


def scored_by(tracker: Tracker, sweep: str) -> tuple[str, str, list[str]]:
    """The metric and mode that score the sweep's trials, and its trials by confirmed mean
    (empty without a seed check): tags of its parent run."""
    tags = parent_tags(tracker, sweep)
    order = json.loads(tags.get(Tag.CONFIRMED_ORDER, "[]"))
    return tags.get(Tag.METRIC, "val_auc"), tags.get(Tag.MODE, "max"), order


def winning_reference(tracker: Tracker, sweep: str, max_emb_bytes: float | None) -> Any:
    """The run of the reference that is the sweep's best model (``recsys.winner_trial`` naming
    a baseline's trial: no search trial beats it), where its tables fit ``max_emb_bytes``; None
    where the best is a search trial."""
    tags = parent_tags(tracker, sweep)
    trial = tags.get(Tag.WINNER_TRIAL)
    if not trial or tags.get(Tag.WINNER_KIND) != "reference":
        return None
    where = f"tags.`{Tag.KIND}` = 'baseline' and tags.`{Tag.TRIAL}` = '{trial}'"
    runs = tracker.runs(sweep, where)
    if not runs:
        return None
    emb = runs[0].data.metrics.get("emb_bytes")
    if max_emb_bytes is not None and (emb is None or emb > max_emb_bytes):
        return None
    return runs[0]


def best_trial(
    tracker: Tracker, sweep: str, max_emb_bytes: float | None = None
) -> tuple[str, str, Any]:
    """The sweep's best model among those whose tables fit ``max_emb_bytes``: the reference that
    no search trial beats where there is one (``winning_reference``: a user asked for the best
    model, not the best DLRM), else its best search trial (finished, or stopped early by
    patience or ASHA): by confirmed mean when the sweep ran a seed check (the confirmed trials
    first, ``recsys.tune.confirm`` says why the mean), else by its best report of the sweep's
    metric. Seed-check runs are never picked. Its run id, best checkpoint, config."""
    if (ref := winning_reference(tracker, sweep, max_emb_bytes)) is not None:
        run_id = ref.info.run_id
        return run_id, ref.data.tags[Tag.BEST_CHECKPOINT], run_config(tracker, run_id)
    metric, mode, confirmed = scored_by(tracker, sweep)
    where = f"tags.`{Tag.KIND}` = 'trial'"
    if max_emb_bytes is not None:
        where += f" and metrics.emb_bytes <= {max_emb_bytes}"
    order = "DESC" if mode == "max" else "ASC"
    runs = tracker.runs(sweep, where, order_by=[f"metrics.`best_{metric}` {order}"])  # `a/b`
    runs = [  # (MLflow's search has no IN for tags)
        r
        for r in runs
        if r.data.tags.get(Tag.STATUS) in SCORED and f"best_{metric}" in r.data.metrics
    ]
    if not runs:
        budget = f" with tables under {max_emb_bytes / 2**20:.4g} MB" if max_emb_bytes else ""
        raise ValueError(f"sweep {sweep!r} has no finished trial{budget}")
    rank = {trial: i for i, trial in enumerate(confirmed)}
    run = min(runs, key=lambda r: rank.get(r.data.tags.get(Tag.TRIAL, ""), len(rank)))
    return run.info.run_id, run.data.tags[Tag.BEST_CHECKPOINT], run_config(tracker, run.info.run_id)


def export_best(
    tracking_uri: str,
    sweep: str,
    out_dir: str,
    dtype: str = "int8",
    register: str | None = None,
    max_emb_mb: float | None = None,
    log: Callable[[str], None] = print,
) -> tuple[str, ExportReport, str]:
    """Export the best trial of ``sweep`` (under ``max_emb_mb`` of tables, if given), from its
    best checkpoint; its metrics, files and MLflow model go to its run. With ``register``, the
    model version carries the sweep's verdict and, when it is the confirmed winner, the alias
    ``@champion`` (``crown``), whose URI is returned."""
    tracker = Tracker(tracking_uri)
    budget = max_emb_mb * 2**20 if max_emb_mb is not None else None
    run_id, ckpt, cfg = best_trial(tracker, sweep, budget)
    report, uri = export_to_run(tracker, run_id, ckpt, cfg, out_dir, dtype, register)
    if register:
        uri, line = crown(tracker, register, sweep, run_id)
        log(f"registered {register}: {line}")
    return run_id, report, uri
