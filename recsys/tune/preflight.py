"""A sweep's every configuration checked for the device its trials train on, on the driver,
before Ray starts (``recsys.distributed.preflight.check`` for each): every combination of the
space's discrete options and range ends (as ``recsys.tune.space`` builds them, up to its
``MAX_COMBINATIONS``), and every reference trial. Configurations that share their tables,
sharding and embedding optimizer are enumerated once.

    check_space(space, "cpu", workers=2)   # a ConfigError naming the point, the key, the table
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.tune.space import MAX_COMBINATIONS, SearchSpace


def points(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """The search's probe combinations (every discrete option and both ends of each range; the
    first of each alone past ``MAX_COMBINATIONS``), then every reference trial's params."""
    options = [[(d.key, v) for v in d.probes()] for d in space.dimensions]
    count = 1
    for o in options:
        count *= len(o)
    if count <= MAX_COMBINATIONS:
        yield from (dict(c) for c in itertools.product(*options))
    else:
        yield from ({k: v} for o in options for k, v in o)
    yield from space.reference_points()


def signature(cfg: ExperimentConfig) -> str:
    """What the device check reads of a config: its tables, sharding and embedding optimizer."""
    o = cfg.optim
    decay = (o.embedding_weight_decay, o.embedding_weight_decay_mode)
    return repr((cfg.tables, cfg.sharding, cfg.model.arch, o.embedding_optimizer, decay))


def check_space(space: SearchSpace, device: str, workers: int) -> None:
    """Refuse the first point of ``space`` that workers of ``device`` could not train, naming it
    (``ConfigError``)."""
    from recsys.distributed import preflight

    seen: set[str] = set()
    for params in points(space):
        cfg = space.config_for(params)
        key = signature(cfg)
        if key in seen:
            continue
        seen.add(key)
        try:
            preflight.check(cfg, device, workers)
        except ConfigError as e:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items()) or "the base"
            raise ConfigError(f"{space.source}: the trial with {shown} cannot train on "
                              f"{workers} {device} worker(s): {e}") from None  # fmt: skip
