"""Criteo readers on files: generator-written, hand-written with missing fields, gzip, malformed."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from recsys.config import DataConfig, SyntheticConfig
from recsys.data import DataError, load_splits
from recsys.data.binary import load_folder
from recsys.data.criteo import read_tsv, transform_dense
from recsys.data.preprocess import preprocess
from recsys.data.synthetic import generate

ROWS = [1000] * 26


def row(label="0", dense=None, cats=None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats]) + "\n"


@pytest.fixture(scope="module")
def synthetic():
    return generate(SyntheticConfig(num_samples=300, seed=3), 13, ROWS)


@pytest.mark.parametrize("compress", [False, True])
def test_generator_tsv_reads_back(tmp_path, synthetic, compress):
    path = str(tmp_path / ("s.txt.gz" if compress else "s.txt"))
    synthetic.write_tsv(path, compress=compress)
    cols = read_tsv(path)
    expected = synthetic.columns()
    np.testing.assert_array_equal(cols.labels, expected.labels)
    np.testing.assert_allclose(cols.dense, expected.dense, rtol=1e-6)
    np.testing.assert_array_equal(cols.sparse.astype(np.int64), expected.sparse)
    assert np.isnan(synthetic.dense_raw).any()  # missing fields were exercised


def test_hand_written_missing_fields(tmp_path):
    dense = ["", "5", "-3", *["0"] * 10]
    cats = ["", "ffffffff", *[f"{i:08x}" for i in range(24)]]
    path = tmp_path / "h.txt"
    path.write_text(row("1", dense, cats) + row())
    cols = read_tsv(str(path))
    assert cols.labels[:, 0].tolist() == [1.0, 0.0]
    np.testing.assert_allclose(cols.dense[0, :3], [0.0, np.log(6.0), 0.0], rtol=1e-6)
    assert cols.sparse[0, 0, 0] == 0 and cols.sparse[0, 1, 0] == 0xFFFFFFFF
    np.testing.assert_allclose(cols.dense[1], transform_dense(np.arange(13)), rtol=1e-6)


def test_gzip_detected_by_content(tmp_path):
    path = tmp_path / "day_0"  # no .gz suffix, as Terabyte files after gunzip -c | gzip
    with gzip.open(path, "wt") as f:
        f.write(row("1") * 3)
    assert len(read_tsv(str(path))) == 3


BAD = [
    (row().replace("\t", "\t\t", 1), "expected 40 tab-separated fields, got 41"),
    (row(dense=["x1", *["0"] * 12]), "I1 is not an integer: 'x1'"),
    (row(cats=["zzzzzzzz", *["0"] * 25]), "C1 is not a hex hash: 'zzzzzzzz'"),
    (row(cats=["123456789", *["0"] * 25]), "C1 is not a 32-bit hex hash"),
    (row(label="2"), "label must be 0 or 1, got '2'"),
]


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_malformed_row_error_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "bad.txt"
    path.write_text(row() + row() + bad + row())
    with pytest.raises(DataError, match=rf"bad.txt:3: .*{message}"):
        read_tsv(str(path))


def test_malformed_rows_skipped_and_counted(tmp_path, caplog):
    path = tmp_path / "bad.txt"
    path.write_text(row("1") + BAD[0][0] + BAD[1][0] + row("0"))
    cols = read_tsv(str(path), on_bad_row="skip")
    assert cols.labels[:, 0].tolist() == [1.0, 0.0]
    assert "skipped 2 malformed rows" in caplog.text and "bad.txt:2" in caplog.text


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        read_tsv(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty.txt: no valid rows"):
        read_tsv(str(tmp_path / "empty.txt"))


def test_preprocess_binary_equals_text(tmp_path, synthetic):
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")
    synthetic.write_tsv(a)
    synthetic.write_tsv(b, compress=True)
    out = str(tmp_path / "npy")
    preprocess([a, b], out, "error", progress=False)
    days = [d.read(0, len(d)) for d in load_folder(out)]
    text = read_tsv(a)
    assert len(days) == 2
    for day in days:
        np.testing.assert_array_equal(day.dense, text.dense)
        np.testing.assert_array_equal(day.sparse, text.sparse)
        np.testing.assert_array_equal(day.labels, text.labels)
    meta = json.loads((tmp_path / "npy" / "meta.json").read_text())
    assert [f["rows"] for f in meta["files"]] == [300, 300]


def test_preprocess_skips_bad_rows_and_truncates(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text(row("1") + BAD[2][0] + row("0"))
    preprocess([str(path)], str(tmp_path / "out"), "skip", progress=False)
    (day,) = load_folder(str(tmp_path / "out"))
    assert day.read(0, len(day)).labels[:, 0].tolist() == [1, 0]


def test_torchrec_layout_and_bad_folders(tmp_path):
    folder = tmp_path / "tr"
    folder.mkdir()
    np.save(folder / "day_0_dense.npy", np.full((4, 13), np.log(2.0), np.float32))
    np.save(folder / "day_0_sparse.npy", np.arange(4 * 26, dtype=np.int64).reshape(4, 26))
    np.save(folder / "day_0_labels.npy", np.array([[0], [1], [1], [0]], np.int32))
    (day,) = load_folder(str(folder))
    rows = day.read(0, 4)
    assert rows.sparse.shape == (4, 26, 1) and rows.sparse[1, 0, 0] == 26
    np.save(folder / "day_1_dense.npy", np.full((4, 13), np.log(2.0), np.float32))
    with pytest.raises(DataError, match="day_1_labels.npy is missing"):
        load_folder(str(folder))
    np.save(folder / "day_1_sparse.npy", np.zeros((4, 26), np.int64))
    np.save(folder / "day_1_labels.npy", np.array([[0], [1], [2], [0]], np.int32))
    day1 = load_folder(str(folder))[1]
    day1.read(0, 2)  # labels are checked on the rows read, not by scanning whole days up front
    with pytest.raises(DataError, match=r"day_1_labels.npy: row 2: label must be 0 or 1"):
        day1.read(1, 4)
    with pytest.raises(DataError, match="no such folder"):
        load_folder(str(tmp_path / "absent"))


def test_splits_in_file_order_and_empty_split(tmp_path, synthetic):
    path = str(tmp_path / "s.txt")
    synthetic.write_tsv(path)
    cfg = DataConfig(source="criteo_tsv", paths=[path], val_fraction=0.1, test_fraction=0.2)
    s = load_splits(cfg, 13, ROWS)
    assert (len(s.train), len(s.val), len(s.test)) == (210, 30, 60)
    np.testing.assert_array_equal(s.val.read(0, 30).labels[:, 0], synthetic.labels[210:240])
    tiny = tmp_path / "tiny.txt"
    tiny.write_text(row() * 3)
    cfg = DataConfig(source="criteo_tsv", paths=[str(tiny)], val_fraction=0.1)
    with pytest.raises(DataError, match="the val split of .*tiny.txt is empty"):
        load_splits(cfg, 13, ROWS)


def test_schema_mismatch_is_clear(tmp_path, synthetic):
    path = str(tmp_path / "s.txt")
    synthetic.write_tsv(path)
    with pytest.raises(DataError, match=r"has 13 dense and 26 sparse.*expects 13 .* and 8"):
        load_splits(DataConfig(source="criteo_tsv", paths=[path]), 13, [100] * 8)


def _split_of(args):
    """In a fresh process (a rank): the criteo_tsv split's type and its first rows' labels."""
    path, cache = args
    cfg = DataConfig(source="criteo_tsv", paths=[path], cache_dir=cache, val_fraction=0.1)
    train = load_splits(cfg, 13, ROWS).train
    day = train.base
    return type(day).__name__, isinstance(day.labels, np.memmap), train.read(0, 5).labels[:, 0]


def test_criteo_tsv_is_converted_once_and_every_rank_maps_it(tmp_path, synthetic):
    """Several ranks opening one Criteo text file at once: one converts it to the binary form
    in the cache (under a lock), all read that memory-mapped, none loads the text."""
    import multiprocessing as mp
    import os

    from recsys.data import preprocess as preprocess_mod

    path, cache = str(tmp_path / "s.txt"), str(tmp_path / "cache")
    synthetic.write_tsv(path)
    with mp.get_context("spawn").Pool(3) as pool:
        out = pool.map(_split_of, [(path, cache)] * 3)
    assert [o[:2] for o in out] == [("NpyDay", True)] * 3
    for o in out:
        np.testing.assert_array_equal(o[2], synthetic.labels[:5])
    assert len([d for d in os.listdir(cache) if not d.endswith(".lock")]) == 1
    calls = []
    real = preprocess_mod.preprocess
    try:  # a second use of the same file converts nothing
        preprocess_mod.preprocess = lambda *a, **k: calls.append(a) or real(*a, **k)
        _split_of((path, cache))
    finally:
        preprocess_mod.preprocess = real
    assert calls == []
