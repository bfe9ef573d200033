"""Sweep-level publishing: choose a sweep's best trial, export it, and record the export in MLflow
(metrics on the trial's run, an MLflow pyfunc model scoring Criteo rows, optionally registered).

    run_id, report, uri = export_best(tracking_uri, "default", "runs/default/export")
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml

from recsys.config import ExperimentConfig
from recsys.data import load_splits
from recsys.export import ExportReport, export
from recsys.serving import META_FILE, MODEL_FILE, CriteoScorer, example_rows, pip_requirements
from recsys.tune.tracking import Tag, Tracker


def best_trial(tracker: Tracker, sweep: str, metric: str = "val_auc") -> tuple[str, str, Any]:
    """The sweep's best finished trial by ``metric``: its run id, best checkpoint and config."""
    runs = tracker.runs(
        sweep,
        f"tags.`{Tag.KIND}` = 'trial' and tags.`{Tag.STATUS}` = 'finished'",
        order_by=[f"metrics.{metric} DESC"],
    )
    if not runs:
        if tracker.client.get_experiment_by_name(sweep) is None:
            raise ValueError(f"no sweep named {sweep!r} in {tracker.uri}")
        raise ValueError(f"sweep {sweep!r} has no finished trial")
    run = runs[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = tracker.download(run.info.run_id, "config.yaml", tmp)
        with open(path) as f:
            cfg = ExperimentConfig.from_dict(yaml.safe_load(f))
    return run.info.run_id, run.data.tags[Tag.BEST_CHECKPOINT], cfg


def log_served_model(
    tracker: Tracker,
    run_id: str,
    export_dir: str,
    example: Any,
    registered_name: str | None = None,
) -> str:
    """Log an export as an MLflow pyfunc model in run ``run_id`` (and register it); its URI."""
    from mlflow.models import infer_signature

    artifacts = {
        "model": os.path.join(export_dir, MODEL_FILE),
        "meta": os.path.join(export_dir, META_FILE),
    }
    vocab_dir = os.path.join(export_dir, "vocab")
    if os.path.isdir(vocab_dir):  # the scorer finds the vocabularies beside meta.json
        artifacts["vocab"] = vocab_dir
    scorer = CriteoScorer()
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    recsys_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tracker.log_model(
        run_id,
        registered_name,
        python_model=CriteoScorer(),
        artifacts=artifacts,
        code_paths=[recsys_dir],
        input_example=example,
        signature=infer_signature(example, scorer.predict(None, example)),
        pip_requirements=pip_requirements(),
    )


def export_vocabs(export_dir: str) -> list[Any] | None:
    import json

    from recsys.data import vocab

    with open(os.path.join(export_dir, META_FILE)) as f:
        names = json.load(f).get("vocab")
    return vocab.load(export_dir, names) if names else None


def export_best(
    tracking_uri: str, sweep: str, out_dir: str, dtype: str = "int8", register: str | None = None
) -> tuple[str, ExportReport, str]:
    """Export the best trial of ``sweep``; its metrics, files and MLflow model go to its run."""
    tracker = Tracker(tracking_uri)
    run_id, ckpt, cfg = best_trial(tracker, sweep)
    report = export(cfg, ckpt, out_dir, dtype)
    tracker.log_values(run_id, report.as_metrics())
    tracker.log_file(run_id, os.path.join(out_dir, META_FILE), "export")
    val = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).val
    example = example_rows(val.read(0, 8), cfg.model.num_dense, vocabs=export_vocabs(out_dir))
    return run_id, report, log_served_model(tracker, run_id, out_dir, example, register)
