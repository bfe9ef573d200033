"""A prepared folder's ``meta.json``: the data set's schema, what preparation fitted and the
index of its shards. Every later stage reads the data set from it (the loader its shards, the
resolution of a config its features and tasks, serving its transforms); this module imports
nothing else of ``recsys`` so all can."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from recsys.data.errors import DataError
from recsys.storage import is_uri, resolved

FORMAT = "recsys-prepared-v3"
META = "meta.json"
SPLITS = ("train", "val", "test")
OLD = {  # formats of earlier versions: prepared again with the one path
    "recsys-criteo-npy-v2": "criteo_kaggle",
    "recsys-prepared-v1": None,
    "recsys-prepared-v2": None,  # one row 0 for missing, rare and unseen ids; no shared tables
}


def read_meta(folder: str) -> dict[str, Any]:
    """The folder's ``meta.json``; a folder that is not a finished preparation is refused, and
    one prepared by an earlier version is named with the command that prepares it again."""
    if is_uri(folder):  # a prepared folder in an object store (``recsys.data.remote``)
        meta = _read_uri(folder)
        path = f"{folder.rstrip('/')}/{META}"
    else:
        folder = resolved(folder)
        path = os.path.join(folder, META)
        if not os.path.isfile(path):
            partial = os.path.isdir(folder.rstrip("/") + ".partial")
            why = " (a preparation of it did not finish)" if partial else ""
            raise DataError(f"{folder}: not a prepared folder, {path} is missing{why}")
        with open(path) as f:
            meta = json.load(f)
    fmt = meta.get("format")
    if fmt in OLD:
        raise DataError(f"{path}: prepared by an earlier version (format {fmt!r}); prepare it "
                        f"again: {again(meta, folder, OLD[fmt])}")  # fmt: skip
    if fmt != FORMAT:
        raise DataError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
    return meta


def _read_uri(folder: str) -> dict[str, Any]:
    from recsys import storage

    path = storage.join(folder, META)
    try:
        text = storage.read_text(path)
    except FileNotFoundError:
        raise DataError(f"{folder}: not a prepared folder, {path} is missing") from None
    except OSError as e:
        raise DataError(f"{path}: not readable: {str(e).splitlines()[0][:300]}") from None
    meta: dict[str, Any] = json.loads(text)
    return meta


def again(meta: dict[str, Any], folder: str, schema: str | None) -> str:
    """The command that prepares an old folder's sources again into a new folder."""
    sources = meta.get("sources") or [f.get("source", "?") for f in meta.get("files", [])]
    name = schema or "SCHEMA.yaml"
    out = folder.rstrip("/") + "_" + FORMAT.rsplit("-", 1)[-1]
    args = " ".join(shlex.quote(s) for s in sources) or "FILES"
    bad_rows = " --on-bad-row skip" if any(f.get("skipped") for f in meta.get("files", [])) else ""
    return f"recsys-preprocess --schema {name} {args} --out {shlex.quote(out)}{bad_rows}"
