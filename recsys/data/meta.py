"""A prepared folder's ``meta.json``: the data set's schema and what preparation fitted. Every
later stage reads the data set from it (the config its features and tasks, the loader its
files, serving its transforms); this module imports nothing else of ``recsys`` so all can."""

from __future__ import annotations

import json
import os
from typing import Any

from recsys.data.errors import DataError

FORMAT = "recsys-prepared-v1"
META = "meta.json"
SPLITS = ("train", "val", "test")


def is_prepared(folder: str) -> bool:
    """Whether ``folder`` is a finished prepared folder (its ``meta.json`` names the format)."""
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return bool(json.load(f).get("format") == FORMAT)


def read_meta(folder: str) -> dict[str, Any]:
    """The folder's ``meta.json``; a folder that is not a finished preparation is refused."""
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        partial = os.path.isdir(folder.rstrip("/") + ".partial")
        why = " (a preparation of it did not finish)" if partial else ""
        raise DataError(f"{folder}: not a prepared folder, {path} is missing{why}")
    with open(path) as f:
        meta: dict[str, Any] = json.load(f)
    if meta.get("format") != FORMAT:
        raise DataError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta
