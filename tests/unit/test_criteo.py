"""Criteo's text through the one preparation path (``schemas/criteo_kaggle.yaml``,
``criteo_terabyte.yaml``): generator-written and hand-written files, gzip, malformed lines named
by file and line, skipped and counted; the split by input order and by named files; an old
folder refused with the command that prepares it again."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from recsys.data import DataError
from recsys.data.prepared.folder import load_splits
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import prepare
from tests.conftest import write_criteo

KAGGLE = DatasetSchema.load("criteo_kaggle")


def row(label="0", dense=None, cats=None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats]) + "\n"


def run(tmp_path, files, schema=KAGGLE, name="out", **kw):
    out = str(tmp_path / name)
    meta = prepare(schema, [str(f) for f in files], out, workers=0, log=lambda s: None, **kw)
    splits = load_splits([out], len(schema.dense), meta["table_sizes"])
    return splits, meta


def everything(splits):
    """All rows of the three splits, in order (train, val, test)."""
    parts = [s.read(0, len(s)) for s in (splits.train, splits.val, splits.test)]
    dense = np.concatenate([p.dense for p in parts])
    ids = np.concatenate([np.stack(p.values, 1) for p in parts])
    labels = np.concatenate([p.labels for p in parts])
    return dense, ids, labels


def hashes_of(values) -> np.ndarray:
    """What the vocabulary stores for hex ids: the hash of the number each one writes."""
    return pd.util.hash_array(np.asarray(values, np.int64), categorize=False).astype(np.uint64)


@pytest.mark.parametrize("compress", [False, True])
def test_generated_text_prepares_to_the_generated_values(tmp_path, compress):
    path = tmp_path / ("train.txt.gz" if compress else "train.txt")
    data = write_criteo(str(path), rows=600, seed=3, compress=compress)
    splits, meta = run(tmp_path, [path])
    dense, ids, labels = everything(splits)
    assert meta["rows"] == {"train": 514, "val": 43, "test": 43}  # the last rows, in order
    np.testing.assert_array_equal(labels[:, 0], data.labels)
    expected = np.log1p(np.maximum(np.nan_to_num(data.dense_raw, nan=0.0), 0))
    np.testing.assert_allclose(dense, expected, rtol=1e-6)
    assert np.isnan(data.dense_raw).any()  # missing fields were exercised
    for f, name in enumerate(KAGGLE.sparse):
        vocab = np.load(f"{tmp_path / 'out'}/{meta['vocab'][name]}")
        raw = data.sparse[:, f, 0]
        seen = set(raw[:514].tolist())  # the training rows
        known = np.isin(raw, list(seen))
        mapped = vocab[ids[known, f].astype(np.int64) - 2]  # row 0 missing, 1 unseen
        np.testing.assert_array_equal(mapped, hashes_of(raw[known]))
        assert (ids[~known, f] == 1).all()  # unseen in training: the OOV row


def test_hand_written_missing_fields(tmp_path):
    dense = ["", "5", "-3", *["0"] * 10]
    cats = ["", "ffffffff", *[f"{i:08x}" for i in range(24)]]
    path = tmp_path / "h.txt"
    path.write_text(row("1", dense, cats) + row() * 30)
    splits, _meta = run(tmp_path, [path])
    got = splits.train.read(0, 2)
    assert got.labels[:, 0].tolist() == [1, 0]
    np.testing.assert_allclose(got.dense[0, :3], [0.0, np.log(6.0), 0.0], rtol=1e-6)
    assert got.values[0][0] == 0 and got.values[1][0] != 0  # missing; a kept id
    np.testing.assert_allclose(got.dense[1], np.log1p(np.arange(13)), rtol=1e-6)


def test_gzip_detected_by_content(tmp_path):
    path = tmp_path / "day_0"  # no .gz suffix, as Terabyte files after gunzip -c | gzip
    with gzip.open(path, "wt") as f:
        f.write(row("1") * 30)
    _, meta = run(tmp_path, [path])
    assert sum(meta["rows"].values()) == 30


BAD = [
    (row().replace("\t", "\t\t", 1), "bad.txt:3: expected 40 fields, got 41"),
    (row().rsplit("\t", 1)[0] + "\n", "bad.txt:3: expected 40 fields, got 39"),
    (row(dense=["x1", *["0"] * 12]), r"column 'I1', row 2 \(line 3\): a dense column needs"),
    (row(cats=["zzzzzzzz", *["0"] * 25]), r"column 'C1', row 2 \(line 3\): .*hex digits"),
    (row(cats=["1" * 17, *["0"] * 25]), r"column 'C1', row 2 \(line 3\): .*1 to 16 hex"),
    (row(label="2"), r"column 'label', row 2 \(line 3\): a label must be 0 or 1"),
]


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_a_malformed_line_is_named_by_file_and_line_and_nothing_is_written(tmp_path, bad, message):
    path = tmp_path / "bad.txt"
    path.write_text(row() + row() + bad + row() * 20)
    with pytest.raises(DataError, match=message):
        run(tmp_path, [path])
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text(row("1") + BAD[0][0] + BAD[2][0] + BAD[3][0] + row("0") * 20)
    schema = DatasetSchema.from_dict({**KAGGLE.to_dict(), "on_bad_row": "skip"})
    splits, meta = run(tmp_path, [path], schema)
    assert meta["skipped"] == {"lines": 1, "I1": 1, "C1": 1}
    assert sum(meta["rows"].values()) == 21
    assert splits.train.read(0, 2).labels[:, 0].tolist() == [1, 0]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        run(tmp_path, [tmp_path / "nope.txt"])
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="no training rows"):
        run(tmp_path, [tmp_path / "empty.txt"])


def test_terabyte_days_split_by_name_and_hash_their_largest_features(tmp_path):
    days = []
    for k in (0, 1, 22, 23):
        days.append(tmp_path / f"day_{k}.gz")
        write_criteo(str(days[-1]), rows=50, seed=k, compress=True)
    _splits, meta = run(tmp_path, days, DatasetSchema.load("criteo_terabyte"))
    assert meta["rows"] == {"train": 100, "val": 50, "test": 50}
    assert meta["table_sizes"][0] == 40_000_001 and meta["table_sizes"][1] < 200  # + missing
    with pytest.raises(DataError, match="day_23.*matches none of the 2 input files"):
        run(tmp_path, days[:2], DatasetSchema.load("criteo_terabyte"), name="o2")


def test_a_folder_of_the_old_criteo_format_is_refused_with_the_command(tmp_path):
    from recsys.data.dataset import source_for
    from recsys.data.prepared.torchrec_npy import load_folder

    old = tmp_path / "criteo_npy"
    old.mkdir()
    meta = {"format": "recsys-criteo-npy-v2", "files": [{"source": "/d/train.txt", "rows": 5}]}
    (old / "meta.json").write_text(json.dumps(meta))
    command = f"recsys-preprocess --schema criteo_kaggle /d/train.txt --out {old}_v3"
    for read in (lambda: load_splits([str(old)], 13, [10] * 26), lambda: load_folder(str(old))):
        with pytest.raises(DataError, match=command):
            read()
    with pytest.raises(Exception, match=command):
        source_for(str(old))
    raw = tmp_path / "train.txt"
    raw.write_text(row())
    with pytest.raises(Exception, match="not a prepared folder; prepare it first"):
        source_for(str(raw))


def test_hashed_ids_prepare_in_one_pass_with_the_same_checks(tmp_path, monkeypatch):
    """Nothing to fit (every feature hashed, counts as log1p): one pass checks, encodes and
    writes; bad lines and values are still skipped and counted, labels still counted."""
    from recsys.prepare import pipeline as prepare_mod

    schema = KAGGLE.to_dict()
    for spec in schema["sparse"].values():
        spec["hash_buckets"] = 1000
    schema = DatasetSchema.from_dict({**schema, "on_bad_row": "skip"})
    data = write_criteo(str(tmp_path / "a.txt"), rows=300, seed=4)
    with open(tmp_path / "a.txt", "a") as f:
        f.write(BAD[0][0] + BAD[3][0])
    monkeypatch.setattr(prepare_mod, "fit_piece", None)  # never called
    splits, meta = run(tmp_path, [tmp_path / "a.txt"], schema)
    assert meta["skipped"] == {"lines": 1, "C1": 1} and sum(meta["rows"].values()) == 300
    n = meta["rows"]["train"]
    assert meta["label_counts"]["train"]["label"]["positives"] == int(data.labels[:n].sum())
    _, ids, _ = everything(splits)
    hashed = 1 + hashes_of(data.sparse[:, 3, 0]) % 1000  # row 0: missing
    np.testing.assert_array_equal(ids[:, 3], hashed)
