"""What a configuration becomes on the device it trains on, and every refusal a worker could
make, made on the driver before Ray or any worker starts.

    cfg = for_device(cfg, "cpu")             # what the workers of that device train
    cfg = check(cfg, "cpu", world_size=2)    # that, and every worker-side refusal, in seconds

``for_device``: FBGEMM's CPU kernels have no fused Adam, so on CPU workers tables trained with
``optim.embedding_optimizer: adam`` are held dense (data-parallel, TorchRec's ``dense`` kernel) and
trained by torch's Adam at ``optim.embedding_lr`` (``optim.dense_tables: embedding``), as fp32
replicas, where they are small enough for every worker to keep one (``DENSE_TABLE_MAX_VALUES``, the
same bound as the references' dense rule); larger tables are refused, naming the key. ``check``:
that, then what FBGEMM's kernels on the device lack (bf16 tables on CPU, an embedding weight decay
its CPU fp32 kernel drops), the sharding constraints (unknown tables, CUDA-only types on CPU,
half-precision replicas, a ``dense`` kernel without ``data_parallel``) and TorchRec's planner
enumeration of every table under its constraints (``EmbeddingEnumerator``, on a model whose tables
are on ``meta``: nothing allocated). A worker builds through the same functions
(``recsys.train.build``), so a ``ConfigError`` raised there was raised here first;
``tests/unit/test_preflight.py`` holds that as a test.
"""

from __future__ import annotations

import logging
from typing import Any

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.models.accounting import table_stats

DENSE_TABLE_MAX_VALUES = 2**24  # every worker keeps a replica of a dense table, and all-reduces
# its whole gradient each step: 16M values (64 MiB in fp32, times three with Adam's moments)
DEVICES = ("cpu", "cuda")


def table_values(cfg: ExperimentConfig) -> int:
    """The values of every table the config's model builds (rows x width, QR applied)."""
    return sum(t.params for t in table_stats(cfg.tables))


def for_device(cfg: ExperimentConfig, device: str) -> ExperimentConfig:
    """``cfg`` as workers of ``device`` (``cpu`` or ``cuda``) train it: on CPU, tables of
    ``optim.embedding_optimizer: adam`` held dense and trained by torch's Adam
    (``dense_adam``); otherwise unchanged. Idempotent."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: one of {DEVICES}")
    if device == "cpu" and cfg.optim.embedding_optimizer == "adam":
        return dense_adam(cfg)
    return cfg


def dense_adam(cfg: ExperimentConfig) -> ExperimentConfig:
    """Every table data-parallel with the ``dense`` kernel, trained by the embedding optimizer's
    torch counterpart (``optim.dense_tables: embedding``), in fp32 whatever ``embeddings.dtype``
    (the storage of FBGEMM's fused tables: TorchRec's dense kernel holds fp32 replicas only, and
    the run's params show fp32); refused, naming the key, where the tables hold more than
    ``DENSE_TABLE_MAX_VALUES`` values or a table is pinned to another sharding type."""
    why = (
        "optim.embedding_optimizer='adam' on CPU workers: FBGEMM's CPU kernels have no fused "
        "Adam, so the tables train dense (a replica on every worker, data_parallel) with "
        "torch's Adam at optim.embedding_lr"
    )
    values = table_values(cfg)
    if values > DENSE_TABLE_MAX_VALUES:
        raise ConfigError(
            f"optim.embedding_optimizer='adam': {why.split(': ', 1)[1]}; these tables hold "
            f"{values:,} values, more than the {DENSE_TABLE_MAX_VALUES:,} a worker keeps as a "
            "replica: use exact_rowwise_adagrad on CPU, smaller tables (embeddings.dim, "
            "embeddings.qr), or GPU workers"
        )
    for name, pinned in cfg.sharding.tables.items():
        if pinned.sharding_types and "data_parallel" not in pinned.sharding_types:
            raise ConfigError(f"sharding.tables.{name}.sharding_types={pinned.sharding_types}: "
                              f"{why}; allow data_parallel, or use GPU workers")  # fmt: skip
    dense = {"sharding_types": ["data_parallel"], "compute_kernels": ["dense"]}
    overrides: dict[str, Any] = {"sharding.default": dense, "optim.dense_tables": "embedding",
                                 "embeddings.dtype": "fp32"}  # fmt: skip
    overrides.update({f"sharding.tables.{n}": dense for n in cfg.sharding.tables})
    return cfg.with_overrides(overrides)


def check(cfg: ExperimentConfig, device: str, world_size: int = 1) -> ExperimentConfig:
    """``for_device(cfg, device)``, then every refusal a worker of ``device`` would make
    (``ConfigError`` naming the key and table): the data it reads (``check_data``), FBGEMM's
    kernels (``check_kernels``), the sharding constraints and TorchRec's enumeration of every
    table (``check_enumeration``) for ``world_size`` workers. Returns the config the workers
    train."""
    cfg = for_device(cfg, device)
    check_data(cfg, world_size)
    check_kernels(cfg, device)
    check_enumeration(cfg, device, world_size)
    return cfg


def check_data(cfg: ExperimentConfig, world_size: int) -> None:
    """What a worker checks of the config against its data before it builds: weighted lists,
    sequences and a GAUC monitor need data that carries them (``check_carried``), and a budget
    in epochs a training split with rows (``with_budget``, for ``world_size`` workers)."""
    from recsys.data.dataset import check_carried, train_rows, with_budget

    check_carried(cfg)
    if cfg.train.epochs > 0:
        with_budget(cfg, train_rows(cfg), world_size)


def check_kernels(cfg: ExperimentConfig, device: str) -> None:
    """What FBGEMM's CPU kernels lack, refused clearly for CPU workers (after ``for_device``,
    which moves Adam tables off the fused kernels or refuses them): bf16 tables, and an
    embedding weight decay its fp32 kernel drops (``check_fused_decay``) where a fused kernel
    trains a table."""
    from recsys.distributed.sharding import check_fused_decay, held_dense
    from recsys.models.embeddings import table_specs

    if cfg.embeddings.dtype == "bf16" and device == "cpu":
        raise ConfigError(
            "embeddings.dtype='bf16': FBGEMM's CPU kernels have no bf16 tables; "
            "use fp16 on CPU (bf16 needs GPU workers)"
        )
    if not held_dense(cfg.sharding, [s.name for s in table_specs(cfg.tables)]):
        check_fused_decay(cfg.optim, device, cfg.embeddings.dtype != "fp32")


def check_enumeration(cfg: ExperimentConfig, device: str, world_size: int) -> None:
    """The sharding constraints (``recsys.distributed.sharding.constraints``), then TorchRec's
    planner enumeration (``EmbeddingEnumerator``) of every table of the model (built on
    ``meta``) for ``world_size`` workers: a table with no sharding type and compute kernel left
    is refused, naming it, its constraints and what TorchRec offers on the device."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from recsys.distributed.sharding import Machine, constraints, sharders, topology
    from recsys.models import ModelAndLoss, build_model
    from recsys.models.embeddings import table_specs

    names = [s.name for s in table_specs(cfg.tables)]
    half = cfg.embeddings.dtype != "fp32"
    given = constraints(cfg.sharding, names, device, half)
    net = build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks), "meta")
    model = ModelAndLoss(net, cfg.loss)
    machine = Machine(device, 2**40 if device == "cuda" else None, 2**40)  # (memory: not here)
    enumerator = EmbeddingEnumerator(
        topology=topology(world_size, world_size, machine),
        batch_size=cfg.train.batch_size,
        constraints=given,
    )
    torchrec_log = logging.getLogger("torchrec")
    level = torchrec_log.level
    torchrec_log.setLevel(logging.ERROR)  # its warnings say what the error below says
    try:
        enumerator.enumerate(model, sharders(cfg.optim))
    except RuntimeError as e:
        table = next((n for n in names if f"for {n}." in str(e)), None)
        if table is None:
            raise
        raise ConfigError(unplannable(cfg, table, device)) from None
    finally:
        torchrec_log.setLevel(level)


def unplannable(cfg: ExperimentConfig, table: str, device: str) -> str:
    """Why TorchRec's planner has nothing for ``table`` on ``device``: its constraints (the key
    that set them) against the sharding types and compute kernels TorchRec offers there."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder()
    offers = {t: sharder.compute_kernels(t, device) for t in sharder.sharding_types(device)}
    own = table in cfg.sharding.tables
    key = f"sharding.tables.{table}" if own else "sharding.default"
    t = cfg.sharding.tables.get(table, cfg.sharding.default)
    offered = "; ".join(f"{k}: {', '.join(v)}" for k, v in offers.items())
    return (
        f"{key} (table {table}): sharding_types={t.sharding_types or 'any'}, "
        f"compute_kernels={t.compute_kernels or 'any'}: TorchRec's planner has no sharding type "
        f"and compute kernel for it on {device} (it offers {offered})"
    )
