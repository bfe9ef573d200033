"""A prepared folder in an object store (a real S3-compatible server on loopback, the ``s3``
fixture): ``recsys-preprocess --out s3://...`` uploads it with ``meta.json`` last; each worker
caches only the shards its rows fall in and reads them as it reads a local folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

from recsys.config import ExperimentConfig
from recsys.data.errors import DataError
from recsys.data.prepared.folder import load_splits
from recsys.data.prepared.meta import read_meta
from recsys.data.prepared.remote import cache_prepared, localised, needed_shards, rank_ranges
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import prepare
from recsys.runtime import storage
from tests.conftest import SCHEMA, write_demo


@pytest.fixture
def raw(tmp_path):
    """Three demo logs (three pieces: three shards of each split)."""
    return [write_demo(str(tmp_path / f"raw{k}"), rows=3000, files=1, seed=k)[0] for k in range(3)]


def prepared_both(raw, tmp_path, s3):
    schema = DatasetSchema.load(SCHEMA)
    local = str(tmp_path / "local")
    prepare(schema, raw, local, workers=0, log=lambda s: None)
    uri = storage.join(s3, "prepared")
    prepare(schema, raw, uri, workers=0, log=lambda s: None)
    return local, uri


def test_a_folder_prepared_into_the_store_reads_as_the_local_one_per_rank(raw, tmp_path, s3):
    local, uri = prepared_both(raw, tmp_path, s3)
    meta = read_meta(uri)
    assert meta == read_meta(local)
    assert all(len(meta["shards"][s]) == 3 for s in ("train", "val", "test"))
    whole = load_splits([local], len(meta["schema"]["dense"]), meta["table_sizes"])
    cached, checked = [], 0
    for rank in range(2):
        ranges = rank_ranges(meta, rank, 2)
        folder = cache_prepared(uri, ranges, str(tmp_path / f"cache{rank}"), log=lambda s: None)
        cfg = ExperimentConfig.from_dict(
            {
                "data": {
                    "source": "prepared",
                    "paths": [uri],
                    "cache_dir": str(tmp_path / f"cache{rank}"),
                }
            }
        )  # what a worker does: the same cache folder, its meta.json read once
        assert localised(cfg, rank, 2, log=lambda s: None).data.paths == [folder]
        cached.append(sorted(os.listdir(os.path.join(folder, "train"))))
        mine = load_splits([folder], len(meta["schema"]["dense"]), meta["table_sizes"])
        for split in ("train", "val", "test"):
            a, b = getattr(mine, split), getattr(whole, split)
            assert len(a) == len(b)
            start, stop = ranges[split]
            got, want = a.read(start, stop), b.read(start, stop)
            np.testing.assert_array_equal(got.dense, want.dense)
            np.testing.assert_array_equal(got.labels, want.labels)
            for x, y in zip(got.values, want.values, strict=True):
                np.testing.assert_array_equal(x, y)
        start, stop = ranges["train"]
        outside = (stop, stop + 1) if rank == 0 else (0, 1)
        have = set(needed_shards(meta, {"train": (start, stop)}))
        if not set(needed_shards(meta, {"train": outside})) <= have:
            checked += 1
            with pytest.raises(DataError, match="not in this worker's cache of s3://"):
                mine.train.read(*outside)
    assert checked, "a read outside a rank's cached shards was tried"
    for names in cached:  # each rank holds some of the training shards, not all
        shards = {n.split(".")[0] for n in names}
        assert 0 < len(shards) < 3, names


def test_a_refits_workers_cache_their_rows_of_training_and_validation_rows(raw, tmp_path, s3):
    """With ``data.refit`` a worker trains on its part of the training rows followed by the
    validation rows: its cache holds those rows (and the validation rows it evaluates)."""
    from recsys.data.columns import shard_range
    from recsys.data.input.loader import load_splits as load_data

    _, uri = prepared_both(raw, tmp_path, s3)
    meta = read_meta(uri)
    for rank in range(2):
        cfg = ExperimentConfig.from_dict({"data": {
            "source": "prepared", "paths": [uri], "cache_dir": str(tmp_path / f"c{rank}"),
            "refit": True}})  # fmt: skip
        mine = localised(cfg, rank, 2, log=lambda s: None)
        splits = load_data(mine.data, len(meta["schema"]["dense"]), meta["table_sizes"])
        start, stop = shard_range(len(splits.train), rank, 2)  # what its TrainStream reads
        assert len(splits.train.read(start, stop).labels) == stop - start
        start, stop = shard_range(len(splits.val), rank, 2)  # what it evaluates
        assert len(splits.val.read(start, stop).labels) == stop - start


def test_a_prepared_folder_in_the_store_is_refused_whole_or_replaced(raw, tmp_path, s3):
    _, uri = prepared_both(raw, tmp_path, s3)
    schema = DatasetSchema.load(SCHEMA)
    with pytest.raises(DataError, match="exists; choose another --out or pass --overwrite"):
        prepare(schema, raw[:1], uri, workers=0, log=lambda s: None)
    prepare(schema, raw[:1], uri, workers=0, overwrite=True, log=lambda s: None)
    assert len(read_meta(uri)["shards"]["train"]) == 1
    with pytest.raises(DataError, match="not a prepared folder"):
        read_meta(storage.join(s3, "nothing"))
    with pytest.raises(Exception, match="NO_SUCH_BUCKET"):
        prepare(schema, raw[:1], "s3://nobucket/prepared", workers=0, log=lambda s: None)


def test_a_cache_without_room_is_refused_naming_it(raw, tmp_path, s3, monkeypatch):
    import shutil

    from recsys.data.prepared import remote

    _, uri = prepared_both(raw, tmp_path, s3)
    meta = read_meta(uri)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(remote.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    cache = str(tmp_path / "small")
    with pytest.raises(DataError, match=f"data.cache_dir={cache}: 0.00 GiB free"):
        cache_prepared(uri, rank_ranges(meta, 0, 1), cache, log=lambda s: None)
    assert not any(f.endswith(".npy") for _, _, fs in os.walk(cache) for f in fs)
