"""Click-log data, by role: the schema and the row containers here (``schema``, ``columns``,
``dense``, ``errors``), read by every room; ``prepared/`` (the one reader and writer of a prepared
folder's ``meta.json``, its shards, object-store caches, TorchRec's folders); ``prepare/`` (raw
sources to a prepared folder); ``input/`` (a training worker's batches); ``demo/`` (generated
logs); ``dataset`` (a config resolved against its data). ``tests/unit/test_architecture.py``
holds the rules between them.
"""

from recsys.data.columns import Columns, DataError, RowSource, Splits, shard_range

__all__ = ["Columns", "DataError", "RowSource", "Splits", "shard_range"]
