"""A prepared folder's ``meta.json``: the data set's schema, what preparation fitted and the
index of its shards. Every later stage reads the data set from it (the loader its shards, the
resolution of a config its features and tasks, serving its transforms). This module is its one
reader and writer (``read_meta``, ``read_meta_text``, ``write_meta``, ``is_prepared``): the
format check, the refusal of earlier versions and the whole-file write live here only
(``tests/unit/test_architecture.py`` checks that no other module opens the file)."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from recsys.data.errors import DataError
from recsys.runtime.storage import is_uri, resolved

FORMAT = "recsys-prepared-v3"
META = "meta.json"
CACHE_KEY = "cache"  # the entry of a worker's cache of a folder in an object store (``remote``)
SPLITS = ("train", "val", "test")
OLD = {  # formats of earlier versions: prepared again with the one path
    "recsys-criteo-npy-v2": "criteo_kaggle",
    "recsys-prepared-v1": None,
    "recsys-prepared-v2": None,  # one row 0 for missing, rare and unseen ids; no shared tables
}


class OldFormat(DataError):
    """A folder prepared by an earlier version (``format``: its format)."""

    def __init__(self, message: str, format: str) -> None:
        super().__init__(message)
        self.format = format


def is_prepared(folder: str) -> bool:
    """Whether ``folder`` (a path or an object store URI) holds a ``meta.json`` (finished or
    not, of this version or an earlier one: ``read_meta`` says which)."""
    if is_uri(folder):
        from recsys.runtime import storage

        return storage.exists(meta_path(folder))
    return os.path.isfile(meta_path(resolved(folder)))


def meta_path(folder: str) -> str:
    """The path (or URI) of ``folder``'s ``meta.json``."""
    from recsys.runtime import storage

    return storage.join(folder, META)


def read_meta(folder: str) -> dict[str, Any]:
    """The folder's ``meta.json``; a folder that is not a finished preparation is refused, and
    one prepared by an earlier version is named with the command that prepares it again."""
    return read_meta_text(folder)[1]


def read_meta_text(folder: str) -> tuple[str, dict[str, Any]]:
    """``read_meta`` with the file's text (what a cache of the folder is keyed by)."""
    if is_uri(folder):  # a prepared folder in an object store (``recsys.data.prepared.remote``)
        text = _read_uri(folder)
        path = f"{folder.rstrip('/')}/{META}"
    else:
        folder = resolved(folder)
        path = os.path.join(folder, META)
        if not os.path.isfile(path):
            partial = os.path.isdir(folder.rstrip("/") + ".partial")
            why = " (a preparation of it did not finish)" if partial else ""
            raise DataError(f"{folder}: not a prepared folder, {path} is missing{why}")
        with open(path) as f:
            text = f.read()
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not JSON ({e}); prepare the folder again") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt in OLD:
        raise OldFormat(f"{path}: prepared by an earlier version (format {fmt!r}); prepare it "
                        f"again: {again(meta, folder, OLD[fmt])}", fmt)  # fmt: skip
    if fmt != FORMAT:
        raise DataError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
    return text, meta


def write_meta(folder: str, meta: dict[str, Any]) -> None:
    """Write ``folder``'s ``meta.json`` whole (a temporary name and a rename: a reader sees the
    old file or the new one, never a part); ``meta`` must be of this version's format."""
    from recsys.runtime import storage

    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: meta.json of format {meta.get('format')!r}, not {FORMAT!r}")
    storage.write_text(meta_path(folder), json.dumps(meta, indent=2))


def _read_uri(folder: str) -> str:
    from recsys.runtime import storage

    path = meta_path(folder)
    try:
        return storage.read_text(path)
    except FileNotFoundError:
        raise DataError(f"{folder}: not a prepared folder, {path} is missing") from None
    except OSError as e:
        raise DataError(f"{path}: not readable: {str(e).splitlines()[0][:300]}") from None


def again(meta: dict[str, Any], folder: str, schema: str | None) -> str:
    """The command that prepares an old folder's sources again into a new folder."""
    sources = meta.get("sources") or [f.get("source", "?") for f in meta.get("files", [])]
    name = schema or "SCHEMA.yaml"
    out = folder.rstrip("/") + "_" + FORMAT.rsplit("-", 1)[-1]
    args = " ".join(shlex.quote(s) for s in sources) or "FILES"
    bad_rows = " --on-bad-row skip" if any(f.get("skipped") for f in meta.get("files", [])) else ""
    return f"recsys-preprocess --schema {name} {args} --out {shlex.quote(out)}{bad_rows}"
