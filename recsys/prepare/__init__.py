"""Preparation: reading raw sources (Parquet, CSV, gzip), checking and encoding their columns,
fitting vocabularies and dense statistics on the training rows, splitting, and writing shards
(``pipeline.prepare``, one Ray task per piece of input). It writes a prepared folder through
``recsys.data.prepared.meta``; nothing here is read by training."""
