"""A prepared folder in an object store (``--data s3://bucket/prepared``), read from a local cache.

Each worker downloads only the shards its rows fall in (its ``shard_range`` of each split, as
the loader reads them) into ``data.cache_dir`` (default: ``recsys-data-cache`` in the system's
temp folder), never the whole data set. Workers of one node share the cache: a shard is
downloaded once, under a lock, file by file through a temporary name, and marked cached
(``<split>/<shard>.cached``) only when all its files are there. The free space is checked
before anything is downloaded; too little is an error naming the folder and the bytes needed.

The cache folder is a prepared folder of its own (``meta.json`` with a ``cache`` entry naming
its source): ``recsys.data.prepared.folder`` reads its cached shards as usual and stands an
``AbsentShard`` in for each other one (rows this worker never reads). Its name is a hash of the
URI and its ``meta.json``, so a data set prepared again under the same URI is a new cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from recsys.data.errors import DataError
from recsys.data.prepared.meta import CACHE_KEY, META, SPLITS, read_meta_text, write_meta
from recsys.runtime import storage

SERVING = ("examples.parquet",)  # what serving needs beside meta.json and vocab/


def default_cache_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "recsys-data-cache")


def rank_ranges(
    meta: dict[str, Any], rank: int, world_size: int, refit: bool = False
) -> dict[str, tuple[int, int]]:
    """The rows ``[start, stop)`` of each split that worker ``rank`` reads: its ``shard_range``
    (training and evaluation alike); a worker with no rows of a split reads its row 0. With
    ``refit`` (``data.refit``) it trains on its ``shard_range`` of the training rows followed
    by the validation rows: its part of each split, the validation rows it evaluates included."""
    from recsys.data.columns import shard_range

    rows = {split: sum(s["rows"] for s in meta["shards"][split]) for split in SPLITS}
    out = {}
    for split, n in rows.items():
        start, stop = shard_range(n, rank, world_size)
        out[split] = (start, stop) if stop > start else (0, min(n, 1))
    if refit:
        start, stop = shard_range(rows["train"] + rows["val"], rank, world_size)
        train = (min(start, rows["train"]), min(stop, rows["train"]))
        val = (max(start - rows["train"], 0), max(stop - rows["train"], 0))
        out["train"] = train if train[1] > train[0] else (0, min(rows["train"], 1))
        if val[1] > val[0]:
            out["val"] = (min(val[0], out["val"][0]), max(val[1], out["val"][1]))
    return out


def needed_shards(meta: dict[str, Any], ranges: dict[str, tuple[int, int]]) -> list[str]:
    """``<split>/<shard name>`` of every shard that rows ``ranges`` span."""
    out = []
    for split, (start, stop) in ranges.items():
        shards = meta["shards"][split]
        ends = np.cumsum([s["rows"] for s in shards])
        for shard, end in zip(shards, ends, strict=True):
            if end - shard["rows"] < stop and end > start:
                out.append(f"{split}/{shard['name']}")
    return out


def cache_prepared(
    uri: str,
    ranges: dict[str, tuple[int, int]],
    cache_dir: str = "",
    serving: bool = False,
    log: Callable[[str], None] = print,
    read: tuple[str, dict[str, Any]] | None = None,
) -> str:
    """The local cache folder of prepared folder ``uri`` holding the shards that ``ranges``
    span (and, with ``serving``, the vocabularies and examples an export needs); ``read``:
    ``read_meta_text(uri)`` where the caller has it already."""
    from filelock import FileLock

    meta_text, meta = read or read_meta_text(uri)
    root = cache_dir or default_cache_dir()
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, hashlib.sha256(f"{uri}\n{meta_text}".encode()).hexdigest()[:16])
    with FileLock(folder + ".lock"):
        wanted = [s for s in needed_shards(meta, ranges) if not _cached(folder, s)]
        listings = {split: _listing(uri, split) for split in {s.split("/")[0] for s in wanted}}
        files = [f for s in wanted for f in _shard_files(uri, s, listings[s.split("/")[0]])]
        if serving:
            files += _serving_files(uri)
        files = [(p, size) for p, size in files if not _have(folder, p, size)]
        _check_room(root, sum(size for _, size in files), uri)
        if files:
            log(f"caching {len(wanted)} shards of {uri} in {folder} "
                f"({sum(s for _, s in files) / 2**20:.1f} MiB)")  # fmt: skip
        for path, _ in files:
            _download(uri, path, folder)
        for shard in wanted:
            open(os.path.join(folder, f"{shard}.cached"), "w").close()
        local = {**meta, CACHE_KEY: {"source": uri}}
        write_meta(folder, local)
    return folder


def _cached(folder: str, shard: str) -> bool:
    return os.path.exists(os.path.join(folder, f"{shard}.cached"))


def _have(folder: str, path: str, size: int) -> bool:
    local = os.path.join(folder, path)
    return os.path.exists(local) and os.path.getsize(local) == size


def _listing(uri: str, sub: str) -> list[tuple[str, int]]:
    """``(path relative to uri, bytes)`` of every file under ``uri/sub``."""
    import pyarrow.fs

    fs, base = storage.filesystem(uri)
    selector = pyarrow.fs.FileSelector(f"{base}/{sub}", recursive=True, allow_not_found=True)
    return [
        (info.path[len(base) + 1 :], int(info.size or 0))
        for info in fs.get_file_info(selector)
        if info.type == pyarrow.fs.FileType.File
    ]


def _shard_files(uri: str, shard: str, listing: list[tuple[str, int]]) -> list[tuple[str, int]]:
    found = [(p, s) for p, s in listing if p.startswith(f"{shard}.")]
    if not found:
        raise DataError(f"{uri}: shard {shard} of meta.json has no files in the store")
    return found


def _serving_files(uri: str) -> list[tuple[str, int]]:
    import pyarrow.fs

    fs, base = storage.filesystem(uri)
    top = [(n, fs.get_file_info(f"{base}/{n}")) for n in SERVING]
    files = [(n, int(i.size or 0)) for n, i in top if i.type == pyarrow.fs.FileType.File]
    return files + _listing(uri, "vocab")


def _check_room(root: str, need: int, uri: str) -> None:
    free = shutil.disk_usage(root).free
    if need > free:
        raise DataError(
            f"data.cache_dir={root}: {free / 2**30:.2f} GiB free, this worker's shards of {uri} "
            f"need {need / 2**30:.2f} GiB; point data.cache_dir at a larger local disk"
        )


def _download(uri: str, path: str, folder: str) -> None:
    """One file of ``uri`` to ``folder/path``, through a temporary name."""
    fs, base = storage.filesystem(uri)
    dst = os.path.join(folder, path)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.download"
    try:
        with (
            fs.open_input_stream(f"{base}/{path}", compression=None) as src,
            open(tmp, "wb") as out,
        ):
            shutil.copyfileobj(src, out, 16 << 20)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def localised(cfg: Any, rank: int, world_size: int, log: Callable[[str], None] = print) -> Any:
    """``cfg`` reading worker ``rank``'s cache of its prepared folder, where that folder is an
    object store URI (else ``cfg`` itself)."""
    if cfg.data.source != "prepared" or not storage.is_uri(cfg.data.paths[0]):
        return cfg
    uri = cfg.data.paths[0]
    read = read_meta_text(uri)
    ranges = rank_ranges(read[1], rank, world_size, cfg.data.refit)
    folder = cache_prepared(uri, ranges, cfg.data.cache_dir, log=log, read=read)
    return cfg.with_overrides({"data.paths": [folder]})


def localised_for_export(cfg: Any, sample_rows: int, log: Callable[[str], None] = print) -> Any:
    """``cfg`` reading a local cache of what an export of it reads from its prepared folder in
    an object store: the first ``sample_rows`` rows of the test split (of the validation split
    when there is no test split), the vocabularies and examples serving needs."""
    if cfg.data.source != "prepared" or not storage.is_uri(cfg.data.paths[0]):
        return cfg
    uri = cfg.data.paths[0]
    read = read_meta_text(uri)
    rows = {s: sum(x["rows"] for x in read[1]["shards"][s]) for s in SPLITS}
    split = "test" if rows["test"] else "val"
    ranges = {split: (0, min(sample_rows, rows[split]))}
    folder = cache_prepared(uri, ranges, cfg.data.cache_dir, serving=True, log=log, read=read)
    return cfg.with_overrides({"data.paths": [folder]})


def upload_folder(folder: str, out: str, log: Callable[[str], Any] = print) -> None:
    """Upload local prepared ``folder`` to object store URI ``out``, replacing what is there:
    every file but ``meta.json``, then ``meta.json``, whose presence is what marks a prepared
    folder (``is_prepared``), so a failed or killed upload never reads as prepared."""
    import pyarrow.fs

    fs, base = storage.filesystem(out)
    fs.delete_dir_contents(base, missing_dir_ok=True)  # the old folder, or a killed upload's
    names = [os.path.relpath(os.path.join(d, f), folder)
             for d, _, files in os.walk(folder) for f in files]  # fmt: skip
    log(f"prepare: uploading {len(names)} files to {out}")
    for name in sorted(names, key=lambda n: n == META):  # meta.json last
        pyarrow.fs.copy_files(
            os.path.join(folder, name), f"{base}/{name}", destination_filesystem=fs
        )
