"""Preparing a user's own click logs on Ray Data: rows and lists come back exactly, statistics
are fitted on the training rows only, CSV equals Parquet, and every bad input is named (file,
column, row) before anything is written, or skipped and counted; nothing half-written is left."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from recsys.data.columns import DataError
from recsys.data.encode import hash_ids
from recsys.data.prepare import prepare
from recsys.data.prepared import load_splits
from recsys.data.schema import DatasetSchema

pytestmark = pytest.mark.ray

SCHEMA = {
    "labels": ["y"],
    "dense": {"x": {"transform": "none"}},
    "sparse": {"u": {}, "h": {"multi_hot": True, "max_len": 3}},
    "split": {"val_fraction": 0.0, "test_fraction": 0.0},
}


@pytest.fixture(scope="module", autouse=True)
def ray_up():
    import ray

    from recsys.cluster import connect

    connect(None, num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()


def rows(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(12)]
    lists = [[words[j] for j in rng.integers(0, 12, rng.integers(0, 6))] for _ in range(n)]
    lists[1], lists[2] = [], None
    return {
        "y": rng.integers(0, 2, n).astype(np.int8),
        "x": rng.normal(size=n),
        "u": [f"user{v}" for v in rng.integers(0, 5, n)],
        "h": lists,
    }


def write_parquet(path, data: dict) -> str:
    pq.write_table(pa.table(data), str(path))
    return str(path)


def run(tmp_path, files, schema=SCHEMA, name="out"):
    out = str(tmp_path / name)
    meta = prepare(DatasetSchema.from_dict(schema), files, out, log=lambda s: None)
    return out, meta


def test_rows_and_lists_come_back_exactly_in_input_order(tmp_path):
    a, b = rows(40, 1), rows(30, 2)
    files = [write_parquet(tmp_path / "a.parquet", a), write_parquet(tmp_path / "b.parquet", b)]
    out, meta = run(tmp_path, files)
    train = load_splits([out], 1, [6, 13]).train
    assert len(train) == 70 and meta["rows"] == {"train": 70, "val": 0, "test": 0}
    got = train.read(0, 70)
    vocab_u = np.load(os.path.join(out, meta["vocab"]["u"]))
    vocab_h = np.load(os.path.join(out, meta["vocab"]["h"]))
    lists = a["h"] + b["h"]
    kept = [(v or [])[:3] for v in lists]
    assert got.lengths[:, 1].tolist() == [len(v) for v in kept]  # real lengths, never padded
    flat = [w for v in kept for w in v]
    assert np.array_equal(vocab_h[got.values[1].astype(np.int64) - 1], hash_ids(pa.array(flat))[0])
    users = a["u"] + b["u"]
    assert np.array_equal(vocab_u[got.values[0].astype(np.int64) - 1], hash_ids(pa.array(users))[0])
    assert np.allclose(got.dense[:, 0], np.concatenate([a["x"], b["x"]]), atol=1e-6)
    assert got.labels[:, 0].tolist() == np.concatenate([a["y"], b["y"]]).tolist()
    long = [len(v or []) for v in lists]
    assert meta["truncated"]["h"] == {
        "rows": sum(n > 3 for n in long),
        "ids": sum(max(n - 3, 0) for n in long),
    }
    # a shuffled gather (a training batch) equals the same rows read in order
    idx = np.array([5, 0, 69, 33, 1, 2])
    taken = train.take(idx)
    assert taken.lengths.tolist() == got.lengths[idx].tolist()
    offsets = np.concatenate([[0], np.cumsum(got.lengths[:, 1])])
    expect = np.concatenate([got.values[1][offsets[i] : offsets[i + 1]] for i in idx])
    assert np.array_equal(taken.values[1], expect)


def test_vocabularies_and_transforms_are_fitted_on_training_rows_only(tmp_path):
    n = 100
    t = np.arange(n)
    x = np.where(t < 80, t, 1000.0 + t)  # later rows are far larger: they must not count
    u = ["late" if i >= 80 else f"u{i % 4}" for i in range(n)]
    data = {"y": (t % 2).astype(np.int8), "x": x, "u": u, "ts": t, "h": [["a"]] * n}
    schema = {**SCHEMA, "time": "ts", "dense": {"x": {"transform": "standardize"}},
              "split": {"val_fraction": 0.1, "test_fraction": 0.1}}  # fmt: skip
    out, meta = run(tmp_path, [write_parquet(tmp_path / "t.parquet", data)], schema)
    assert meta["rows"] == {"train": 80, "val": 10, "test": 10}
    assert meta["dense_stats"]["x"]["mean"] == pytest.approx(np.mean(x[:80]))
    assert meta["dense_stats"]["x"]["std"] == pytest.approx(np.std(x[:80]))
    assert meta["table_sizes"][0] == 5  # u0..u3 + the shared row 0; "late" never in training
    splits = load_splits([out], 1, meta["table_sizes"])
    test = splits.test.read(0, 10)
    assert (test.values[0] == 0).all()  # unseen in training: the shared row
    train = splits.train.read(0, 80)
    assert np.allclose(train.dense[:, 0], (x[:80] - x[:80].mean()) / x[:80].std(), atol=1e-5)


def test_csv_equals_parquet(tmp_path):
    data = rows(25, 3)
    pq_file = write_parquet(tmp_path / "d.parquet", data)
    text = {**data, "h": ["|".join(v or []) for v in data["h"]]}
    csv_file = str(tmp_path / "d.csv")
    pacsv.write_csv(pa.table(text), csv_file)
    a, _ = run(tmp_path, [pq_file], name="p")
    b, _ = run(tmp_path, [csv_file], {**SCHEMA, "format": "csv"}, name="c")
    ra, rb = (load_splits([f], 1, [6, 13]).train.read(0, 25) for f in (a, b))
    assert ra.lengths.tolist() == rb.lengths.tolist()
    for va, vb in zip(ra.values, rb.values, strict=True):
        assert va.tolist() == vb.tolist()
    assert np.array_equal(ra.dense, rb.dense) and np.array_equal(ra.labels, rb.labels)


def _bad(tmp_path, column, values, fmt="parquet"):
    data = rows(20, 4)
    data[column] = values
    if fmt == "csv":
        path = str(tmp_path / "bad.csv")
        text = {**data, "h": ["|".join(v or []) for v in data["h"]]}
        pacsv.write_csv(pa.table(text), path)
        return path
    return write_parquet(tmp_path / "bad.parquet", data)


BAD = [
    ("y", lambda n: [0] * 3 + [None] + [1] * (n - 4), "parquet",
     "column 'y', row 3: a label is null"),
    ("y", lambda n: [0] * 5 + [2] + [1] * (n - 6), "parquet",
     r"column 'y', row 5: a label must be 0 or 1 \(true/false\) \(got 2\)"),
    ("x", lambda n: ["1.5"] * 7 + ["abc"] + ["2"] * (n - 8), "csv",
     r"column 'x', row 7 \(line 9\): a dense column needs a number \(or null\) \(got 'abc'\)"),
    ("x", lambda n: [[1.0]] * n, "parquet", "column 'x' has type list<.*double>: a dense column "
     "holds lists"),
    ("h", lambda n: ["one"] * n, "parquet", "column 'h' has type string: declared multi_hot: true,"
     " but holds one value per row"),
    ("u", lambda n: [["a"]] * n, "parquet", "holds lists; declare it with multi_hot: true"),
]  # fmt: skip


@pytest.mark.parametrize("column, make, fmt, message", BAD, ids=[m[:28] for *_, m in BAD])
def test_each_bad_input_is_named_and_nothing_is_written(tmp_path, column, make, fmt, message):
    path = _bad(tmp_path, column, make(20), fmt)
    schema = {**SCHEMA, "format": fmt}
    with pytest.raises(DataError, match=message) as e:
        run(tmp_path, [path], schema)
    assert os.path.basename(path) in str(e.value)
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no out, no .partial


def test_a_missing_column_and_disagreeing_files_are_refused_before_anything_runs(tmp_path):
    good = write_parquet(tmp_path / "a.parquet", rows(10))
    data = rows(10)
    del data["x"]
    missing = write_parquet(tmp_path / "b.parquet", data)
    with pytest.raises(
        DataError, match=r"b.parquet: column 'x' \(dense in the schema\) is missing"
    ):
        run(tmp_path, [good, missing])
    other = {**rows(10), "u": list(range(10))}  # integer ids where a.parquet has strings
    ints = write_parquet(tmp_path / "c.parquet", other)
    with pytest.raises(DataError, match="files disagree on column 'u': .*a.parquet has string, "
                       ".*c.parquet has int64"):  # fmt: skip
        run(tmp_path, [good, ints])
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "out.partial")


def test_bad_rows_are_skipped_and_counted_when_asked(tmp_path):
    data = rows(30, 5)
    data["y"] = [None, 2] + [1] * 28
    path = write_parquet(tmp_path / "s.parquet", data)
    _, meta = run(tmp_path, [path], {**SCHEMA, "on_bad_row": "skip"})
    assert meta["skipped"] == {"y": 2} and meta["rows"]["train"] == 28


def test_an_unfinished_folder_is_never_read_as_prepared_and_is_replaced(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", rows(10))
    partial = tmp_path / "out.partial"
    (partial / "train").mkdir(parents=True)  # what a killed run leaves
    with pytest.raises(DataError, match="not a prepared folder.*did not finish"):
        load_splits([str(tmp_path / "out")], 1, [6, 13])
    out, _ = run(tmp_path, [path])
    assert not partial.exists()
    with open(os.path.join(out, "meta.json")) as f:
        assert json.load(f)["rows"]["train"] == 10
    with pytest.raises(DataError, match="exists; choose another --out or pass --overwrite"):
        run(tmp_path, [path])
