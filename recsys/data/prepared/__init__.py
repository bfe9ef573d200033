"""Prepared folders: the one reader and writer of ``meta.json`` (``meta``), a folder's splits as
memory-mapped shards (``folder``), a worker's local cache of a folder in an object store
(``remote``), and TorchRec's own Criteo day files (``torchrec_npy``)."""
