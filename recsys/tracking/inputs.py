"""What data a trial saw, as MLflow records it: one dataset input per trial run
(``MlflowClient.log_inputs``), so that the UI's Datasets column names it.

A prepared folder is named by its folder's name; its digest is the SHA-256 of its ``meta.json``
(which lists every shard, vocabulary and split: another preparation of other rows gives another
digest); its schema is the prepared features and tasks; its profile the rows of each split.
Generated data is named by its generator's settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from recsys.config import DataConfig


def describe(data: DataConfig) -> dict[str, str]:
    """``mlflow.entities.Dataset``'s fields for ``data``: name, digest, source_type, source,
    schema and profile (JSON texts)."""
    if data.source == "synthetic":
        settings = json.dumps(dataclasses.asdict(data.synthetic), sort_keys=True, default=str)
        return {
            "name": "synthetic", "digest": _sha(settings)[:16], "source_type": "generated",
            "source": settings, "schema": "", "profile": "",
        }  # fmt: skip
    path = data.paths[0]
    if data.source != "prepared":
        return {
            "name": os.path.basename(path.rstrip("/")), "digest": _sha(path)[:16],
            "source_type": data.source, "source": path, "schema": "", "profile": "",
        }  # fmt: skip
    from recsys.data.prepared.meta import read_meta

    meta = read_meta(path)
    return {
        "name": os.path.basename(path.rstrip("/")),
        "digest": _sha(json.dumps(meta, sort_keys=True, default=str))[:16],
        "source_type": "s3" if path.startswith("s3://") else "local",
        "source": path,
        "schema": json.dumps(_schema(meta), default=str),
        "profile": json.dumps({"rows": meta.get("rows", {})}),
    }


def _schema(meta: dict[str, Any]) -> dict[str, Any]:
    """The prepared columns: tasks (labels), dense and sparse features."""
    schema = meta.get("schema", {})
    return {
        "labels": list(meta.get("labels") or schema.get("labels") or []),
        "dense": list(schema.get("dense") or []),
        "sparse": list(meta.get("feature_names") or schema.get("sparse") or []),
    }


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
