"""Click-log data: the schema, the one preparation, prepared folders, TorchRec's Criteo folders,
the synthetic generators, per-worker batches.

The batch-building names (``TrainStream``, ``to_batch``, ...) import torch and TorchRec; they are
loaded on first use, so that code needing only ``DataError`` or the readers starts fast.
"""

from typing import Any

from recsys.data.columns import Columns, DataError, RowSource, Splits

_LOADER = ("TrainStream", "eval_batches", "load_splits", "shard_range", "to_batch")


def __getattr__(name: str) -> Any:
    if name in _LOADER:
        from recsys.data import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'recsys.data' has no attribute {name!r}")


__all__ = ["Columns", "DataError", "RowSource", "Splits", *_LOADER]
