"""The config registry: named experiments, each a function returning an ``ExperimentConfig``.

Variants copy a small base and change a few fields, so the command line stays small::

    python experiments/train.py --experiment debug --set train.steps=50
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import yaml

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError, flatten, nearest

# Criteo Kaggle: rows per categorical feature (as TorchRec's DLRM example); the data's own sizes
# replace them once the config is resolved against a prepared folder (recsys.data.dataset).
KAGGLE_ROWS = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
# Criteo Terabyte, hashed to at most 40M rows per table (as MLPerf DLRM-DCNv2).
TERABYTE_ROWS = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]  # fmt: skip


def debug() -> ExperimentConfig:
    """Tiny: 8 small tables, synthetic data, seconds on a laptop."""
    return ExperimentConfig.from_dict(
        {
            "name": "debug",
            "embeddings": {"num_embeddings": [100, 500, 1000, 5000, 20000, 50, 2000, 10000]},
            "data": {"synthetic": {"num_samples": 20000}},
            "train": {"steps": 200, "batch_size": 256, "eval_every": 100, "checkpoint_every": 50},
        }
    )


def criteo_kaggle() -> ExperimentConfig:
    """DLRM on Criteo Kaggle (``data.paths``: the folder ``recsys-preprocess --schema
    criteo_kaggle`` made)."""
    return ExperimentConfig.from_dict(
        {
            "name": "criteo_kaggle",
            "data": {"source": "prepared", "paths": ["data/criteo_kaggle"]},
            "embeddings": {"num_embeddings": KAGGLE_ROWS, "dim": 64},
            "model": {"bottom_mlp": [512, 256], "top_mlp": [512, 256], "interaction": "dot"},
            "optim": {"lr": 0.01, "embedding_lr": 0.01},
            "train": {
                "batch_size": 2048,
                "steps": 20000,
                "eval_every": 2000,
                "checkpoint_every": 1000,
                "eval_batches": 200,
            },
        }
    )


def criteo_terabyte() -> ExperimentConfig:
    """DLRM-DCNv2 on Criteo Terabyte, as MLPerf (``schemas/criteo_terabyte.yaml``: day 22
    validation, day 23 test)."""
    return criteo_kaggle().with_overrides(
        {
            "name": "criteo_terabyte",
            "data.paths": ["data/criteo_terabyte"],
            "data.shuffle": False,
            "embeddings.num_embeddings": TERABYTE_ROWS,
            "embeddings.dim": 128,
            "model.bottom_mlp": [512, 256],
            "model.top_mlp": [1024, 1024, 512, 256],
            "model.interaction": "dcn",
            "model.dcn_layers": 3,
            "model.dcn_low_rank": 512,
            "optim.lr": 0.004,
            "optim.embedding_lr": 0.004,
            "optim.dense_optimizer": "adam",
        }
    )


EXPERIMENTS: dict[str, Callable[[], ExperimentConfig]] = {
    "debug": debug,
    "criteo_kaggle": criteo_kaggle,
    "criteo_terabyte": criteo_terabyte,
}


def named(name: str) -> ExperimentConfig:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}{nearest(name, EXPERIMENTS)}")
    return EXPERIMENTS[name]()


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1, 2]"]`` -> ``{"a.b": 1, "c": [1, 2]}`` (values parsed as YAML)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r} is not key=value")
        out[key.strip()] = yaml.safe_load(value)
    return out


def from_file(path: str) -> ExperimentConfig:
    """A YAML file of overrides on the defaults, nested sections or dotted keys."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top")
    try:
        return ExperimentConfig().with_overrides(flatten(data, ExperimentConfig.sections()))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
