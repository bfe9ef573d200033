"""A config resolved against its data: what a prepared folder fixes is taken from its
``meta.json`` into the config, once, by the command-line tools before any trial starts (the
config itself reads no file: ``recsys.config`` is pure).

- ``resolve(cfg)``: for ``data.source: prepared``, the feature names, table sizes, per-feature
  pooling (a table's: every feature reading a shared table pools as its multi-hot readers do,
  ``pooling_by_table``), the tables features share (``embeddings.shared``, from the folder's
  ``shared``: absent in older folders, none), the weighted lists (``embeddings.weighted``: the
  sparse columns whose schema names a ``weights`` column; none in older folders), the
  sequences and their targets (``embeddings.sequences``, ``embeddings.sequence_targets``: the
  columns with a ``sequence``),
  ``model.num_dense`` and the tasks (the labels, in order). Table sizes
  the config already gives for this data's features are kept (a sweep may size its own tables);
  a feature that shares a table must then be given its owner's (``EmbeddingConfig`` refuses
  other sizes, naming both).
- ``source_for(path)``: the ``data.source`` of a folder a user names (``--data``).
- ``train_rows(cfg)`` and ``with_budget(cfg, train_rows, world_size)``: a budget in epochs
  (``train.epochs``) made steps, for the workers and the sweep's driver alike.
- ``write_serving(cfg, folder)``: what serving needs beside an export, for every source.
- ``run_paths(storage, data)``: what every node of a run must see, for the storage check
  (``recsys.runtime.shared_storage``): the paths, and a prepared folder's ``meta.json``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from recsys.config import DataConfig, ExperimentConfig, monitor_parts
from recsys.configlib import ConfigError
from recsys.data.errors import DataError
from recsys.data.prepared.meta import (
    CACHE_KEY,
    FORMAT,
    is_prepared,
    meta_path,
    read_meta,
    write_meta,
)
from recsys.data.schema import DatasetSchema, pooling_by_table
from recsys.runtime.storage import is_uri


def source_for(path: str) -> str:
    """``prepared`` for a prepared folder, ``torchrec`` for a folder of TorchRec's
    ``day_N_*.npy`` triples; a raw file (or a folder of them) is refused with the command that
    prepares it."""
    if is_uri(path) or is_prepared(path):
        try:
            read_meta(path)
        except DataError as e:
            raise ConfigError(str(e)) from None
        return "prepared"
    if os.path.isdir(path) and any(n.startswith("day_") and n.endswith("_labels.npy")
                                   for n in os.listdir(path)):  # fmt: skip
        return "torchrec"
    if not os.path.exists(path):
        raise ConfigError(f"--data {path}: no such file or folder")
    raise ConfigError(
        f"--data {path}: not a prepared folder; prepare it first, e.g. recsys-preprocess "
        f"--schema criteo_kaggle {path} --out data/prepared (Criteo text), or --schema "
        "YOUR_SCHEMA.yaml for your own logs"
    )


def prepared_meta(cfg: ExperimentConfig) -> dict[str, Any]:
    """The ``meta.json`` of ``cfg``'s one prepared folder; a ``ConfigError`` naming the problem."""
    if len(cfg.data.paths) != 1:
        raise ConfigError(
            f"data.source=prepared: data.paths must name one folder, got {cfg.data.paths}"
        )
    try:
        return dict(read_meta(cfg.data.paths[0]))
    except DataError as e:
        raise ConfigError(str(e)) from None


def overrides_for(cfg: ExperimentConfig) -> dict[str, Any]:
    """The dotted-key overrides that make ``cfg`` match its prepared folder (none for other
    sources)."""
    if cfg.data.source != "prepared":
        return {}
    meta = prepared_meta(cfg)
    names, schema = list(meta["feature_names"]), meta["schema"]
    emb = cfg.embeddings
    same = emb.feature_names == names and len(emb.num_embeddings) == len(names)
    shared = dict(meta.get("shared") or {})
    sequences = {n: s for n, s in schema["sparse"].items() if s.get("sequence")}
    return {
        "embeddings.num_embeddings": list(emb.num_embeddings) if same else meta["table_sizes"],
        "embeddings.feature_names": names,
        "embeddings.feature_pooling": pooling_by_table(schema["sparse"], shared),
        "embeddings.shared": shared,
        "embeddings.weighted": [n for n, s in schema["sparse"].items() if s.get("weights")],
        "embeddings.sequences": {n: s["sequence"]["max_len"] for n, s in sequences.items()},
        "embeddings.sequence_targets": {
            n: s["sequence"]["target"] for n, s in sequences.items() if s["sequence"]["target"]
        },
        "loss.tasks": [{"name": lab, "label_column": k} for k, lab in enumerate(meta["labels"])],
        "model.num_dense": len(schema["dense"]),
        "data.group_by": schema.get("group_by"),
    }


def check_carried(cfg: ExperimentConfig) -> None:
    """What the config reads of its rows, the data must carry: weighted features
    (``embeddings.weighted``) and sequences (``embeddings.sequences``) a prepared folder whose
    schema names them (``sparse.<col>.weights``, ``sparse.<col>.sequence``; other sources carry
    neither weights nor ordered lists, and the first batch would fail), and a GAUC monitor
    (``val_gauc``) groups (the schema's ``group_by``)."""
    emb, source = cfg.embeddings, cfg.data.source
    metric, _ = monitor_parts(cfg.train.monitor)
    if metric == "gauc" and not cfg.data.group_by:
        raise ConfigError(
            f"train.monitor={cfg.train.monitor!r}: GAUC needs groups: a prepared folder whose "
            "schema names the column that groups rows (group_by: user)"
        )
    if source == "prepared":
        return
    if emb.weighted:
        raise ConfigError(
            f"embeddings.weighted={emb.weighted}: data.source={source} carries no weights; "
            "weighted lists come from a prepared folder whose schema names them "
            "(sparse.<column>.weights)"
        )
    if emb.sequences:
        raise ConfigError(
            f"embeddings.sequences={emb.sequences}: data.source={source} carries no ordered "
            "lists; sequences come from a prepared folder whose schema names them "
            "(sparse.<column>.sequence)"
        )


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with what its prepared folder fixes (``overrides_for``); others unchanged."""
    overrides = overrides_for(cfg)
    return cfg.with_overrides(overrides) if overrides else cfg


def with_data(base: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """``base`` with ``overrides``: the ``data.*`` ones first, then resolved against the data,
    then the rest (which may name the data's tasks: ``loss.task_weights.like``)."""
    data = {k: v for k, v in overrides.items() if k == "data" or k.startswith("data.")}
    rest = {k: v for k, v in overrides.items() if k not in data}
    return resolve(base.with_overrides(data)).with_overrides(rest)


# ---------------------------------------------------------------------------------------------
# A budget in epochs (``train.epochs``): steps, evaluation and checkpoints derived from the
# training split's rows and the workers


def train_rows(cfg: ExperimentConfig) -> int:
    """The rows ``cfg`` trains on, without reading the data: its training split's, and with
    ``data.refit`` its validation split's too (``split_rows``)."""
    train, val = split_rows(cfg)
    return train + val if cfg.data.refit else train


def split_rows(cfg: ExperimentConfig) -> tuple[int, int]:
    """The rows of ``cfg``'s training and validation splits, without reading the data: a prepared
    folder's from its ``meta.json`` (its shards' row counts), synthetic data's from
    ``num_samples`` and the split fractions, a TorchRec folder's from its label files' headers;
    split as ``recsys.data.columns.split`` splits them."""
    data = cfg.data
    if data.source == "prepared":
        shards = prepared_meta(cfg)["shards"]
        train, val = (sum(int(s["rows"]) for s in shards.get(k, [])) for k in ("train", "val"))
        return train, val
    if data.source == "synthetic":
        parts = [data.synthetic.num_samples]
    else:
        parts = _torchrec_day_rows(data.paths)
    if data.split == "files":
        if len(parts) < 3:
            raise ConfigError(f"data.split=files needs >= 3 files, got {len(parts)}")
        return sum(parts[:-2]), parts[-2]
    n = sum(parts)
    val = round(n * data.val_fraction)
    return n - round(n * data.test_fraction) - val, val


def _torchrec_day_rows(folders: list[str]) -> list[int]:
    """Each day's rows of TorchRec folders, in order (a label file's ``.npy`` header)."""
    import numpy as np

    from recsys.data.prepared import torchrec_npy

    rows = []
    try:
        for folder in folders:
            for k in torchrec_npy.days(folder):
                path = torchrec_npy.day_paths(folder, k)["labels"]
                rows.append(int(np.load(path, mmap_mode="r").shape[0]))
    except (DataError, ValueError, OSError) as e:
        raise ConfigError(f"train.epochs needs the training rows: {e}") from None
    return rows


def steps_per_epoch(train_rows: int, batch_size: int, world_size: int) -> int:
    """Steps that read the training split once over all workers: ``ceil(train_rows /
    (batch_size * world_size))``."""
    return -(-train_rows // (batch_size * world_size))


def with_budget(
    cfg: ExperimentConfig,
    train_rows: int,
    world_size: int,
    done_steps: int = 0,
    done_samples: int = 0,
) -> ExperimentConfig:
    """``cfg`` with its budget in epochs (``train.epochs > 0``) made steps for ``world_size``
    workers on a training split of ``train_rows`` rows; ``cfg`` itself when ``train.epochs`` is
    0. Pure, and idempotent: a derived config derives to itself.

    - ``steps_per_epoch = ceil(train_rows / (batch_size * world_size))``;
    - ``train.steps = ceil(epochs * steps_per_epoch)``;
    - ``train.eval_every = train.checkpoint_every = max(1, steps_per_epoch //
      reports_per_epoch)`` (every report is evaluated; the last step reports too).

    ``done_steps`` / ``done_samples``: a resumed run's step and training samples (all workers'),
    from its checkpoint. The budget is in samples: a run resumed on another number of workers
    (another global batch) trains the samples still left of what a run on these workers trains,
    ``ceil((steps * global_batch - done_samples) / global_batch)`` more steps (``steps`` as
    above); on the same workers it ends at ``steps`` exactly."""
    tc = cfg.train
    if tc.epochs <= 0:
        return cfg
    if train_rows < 1 or world_size < 1:
        raise ConfigError(
            f"train.epochs={tc.epochs}: needs a training split with rows and at least one worker "
            f"(got {train_rows} rows, {world_size} workers)"
        )
    global_batch = tc.batch_size * world_size
    per_epoch = steps_per_epoch(train_rows, tc.batch_size, world_size)
    steps = max(1, math.ceil(round(tc.epochs * per_epoch, 6)))  # (0.1 * 30 is 3.0000000000000004)
    if done_steps > 0:
        done = done_samples or done_steps * global_batch  # (a checkpoint that counted no samples)
        left = -(-(steps * global_batch - done) // global_batch)
        steps = max(1, done_steps + max(0, left))
    every = max(1, per_epoch // tc.reports_per_epoch)
    train = dataclasses.replace(tc, steps=steps, eval_every=every, checkpoint_every=every)
    return dataclasses.replace(cfg, train=train)


# ---------------------------------------------------------------------------------------------
# What serving reads beside an export: a prepared folder's, or one written for the other sources

SERVING_FILES = ("examples.parquet",)  # and meta.json, written without the cache entry


def serving_schema(cfg: ExperimentConfig) -> DatasetSchema:
    """The raw columns a model trained on synthetic data or a TorchRec folder is served with:
    dense ``I1..I<n>`` (raw counts, ``log1p``) and one id column per feature (its name), each id
    its row mod the table (``identity``; a TorchRec folder's as Criteo's hex hashes)."""
    hex_ids = cfg.data.source == "torchrec"
    multi = cfg.data.source == "synthetic" and cfg.data.synthetic.multi_hot > 1
    sparse = {
        name: {"identity": True, "hash_buckets": rows, "hex": hex_ids, "multi_hot": multi}
        for name, rows in zip(cfg.embeddings.names(), cfg.embeddings.num_embeddings, strict=True)
    }
    return DatasetSchema.from_dict({
        "labels": cfg.loss.names(),
        "dense": {f"I{k + 1}": {"transform": "log1p"} for k in range(cfg.model.num_dense)},
        "sparse": sparse,
    })  # fmt: skip


def write_serving(cfg: ExperimentConfig, folder: str) -> None:
    """Write into ``folder`` what serving needs to map raw rows as training did: a prepared
    folder's ``meta.json``, vocabularies and example rows, copied; for the other sources a
    ``meta.json`` of ``serving_schema`` and a few raw rows of the validation split."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if cfg.data.source == "prepared":
        src = cfg.data.paths[0]
        for name in SERVING_FILES:
            shutil.copyfile(os.path.join(src, name), os.path.join(folder, name))
        meta = {k: v for k, v in read_meta(src).items() if k != CACHE_KEY}  # a worker cache's
        write_meta(folder, meta)  # own entry is not the data's
        shutil.copytree(os.path.join(src, "vocab"), os.path.join(folder, "vocab"))
        return
    schema = serving_schema(cfg)
    meta = {
        "format": FORMAT, "schema": schema.to_dict(), "labels": schema.labels,
        "dense_stats": {}, "vocab": {}, "feature_names": list(schema.sparse),
        "table_sizes": list(cfg.embeddings.num_embeddings),
        "id_types": {n: "string" if s.hex else "int" for n, s in schema.sparse.items()},
    }  # fmt: skip
    write_meta(folder, meta)
    raw_examples(cfg, schema).to_parquet(os.path.join(folder, "examples.parquet"))


def raw_examples(cfg: ExperimentConfig, schema: DatasetSchema, n: int = 5) -> Any:
    """A few raw rows in ``serving_schema``'s columns: the first synthetic rows as generated; a
    TorchRec folder's first validation rows with their counts and hex hashes recovered."""
    import numpy as np
    import pandas as pd

    from recsys.data.input.loader import load_splits

    dense_cols, names = list(schema.dense), list(schema.sparse)
    if cfg.data.source == "synthetic":
        from recsys.data.input.synthetic import Generator

        gen = Generator(cfg.data.synthetic, cfg.model.num_dense, cfg.embeddings.num_embeddings)
        raw = gen.raw(0, n)
        dense, ids = raw.dense_raw, raw.sparse
    else:
        rows = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).val
        cols = rows.read(0, n)
        dense, ids = np.rint(np.expm1(cols.dense)), cols.sparse
    frame: dict[str, Any] = {c: dense[:, k].astype(np.float64) for k, c in enumerate(dense_cols)}
    for f, name in enumerate(names):
        if schema.sparse[name].multi_hot:
            frame[name] = [list(map(int, r)) for r in ids[:, f]]
        elif schema.sparse[name].hex:
            frame[name] = [f"{int(v):08x}" for v in ids[:, f, 0]]
        else:
            frame[name] = ids[:, f, 0].astype(np.int64)
    return pd.DataFrame(frame)


def run_paths(
    storage: str, data: DataConfig, data_flag: str = "--data"
) -> tuple[dict[str, str], dict[str, str]]:
    """What a run's nodes must all see, for ``recsys.runtime.shared_storage.check_nodes_see``
    (``check_nodes_see(*run_paths(...))``): its paths by flag, ``--storage`` and its data folder
    where it reads one (``data_flag`` names it in errors; synthetic data has none); and by flag
    the file whose digest stands for its folder: a prepared folder's ``meta.json``."""
    paths, files = {"--storage": storage}, {}
    if data.source != "synthetic" and data.paths:
        folder = paths[data_flag] = data.paths[0]
        if not is_uri(folder) and is_prepared(folder):
            files[data_flag] = meta_path(folder)
    return paths, files
