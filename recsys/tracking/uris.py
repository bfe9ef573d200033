"""The registered-model URIs the commands take (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``),
read without MLflow: a malformed one is refused in the time it takes to parse the command line."""

from __future__ import annotations

import re

MODEL_URI = re.compile(r"models:/([^/@]+)(?:@([^/@]+)|/(\d+))")


def parse_model_uri(uri: str) -> tuple[str, str, str]:
    """``(name, alias, version)`` of ``uri``, one of alias and version empty; a ``ValueError``
    names a malformed one."""
    match = MODEL_URI.fullmatch(uri)
    if not match:
        raise ValueError(f"--model {uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    name, alias, version = match.groups()
    return name, alias or "", version or ""
