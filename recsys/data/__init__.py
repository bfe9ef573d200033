"""Click-log data: Criteo readers, the binary form, the synthetic generator, per-worker batches."""

from recsys.data.columns import Columns, DataError, RowSource, Splits
from recsys.data.loader import TrainStream, eval_batches, load_splits, shard_range, to_batch

__all__ = [
    "Columns",
    "DataError",
    "RowSource",
    "Splits",
    "TrainStream",
    "eval_batches",
    "load_splits",
    "shard_range",
    "to_batch",
]
