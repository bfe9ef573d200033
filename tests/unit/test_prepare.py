"""Preparing a user's own click logs in this process (``prepare(..., workers=0)``, no Ray): rows
and lists come back exactly and in input order, statistics are fitted on the training rows only,
text equals Parquet, and every bad input is named (file, column, row, line) before anything is
written, or skipped and counted; nothing half-written is ever read as prepared. Then the edge
cases of issue 37: a column of Arrow's ``null`` type, ``inf`` in a numeric column, a label with
one class in a split, and a dictionary-encoded (pandas ``category``) id column."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from recsys.data.columns import DataError
from recsys.data.prepared.folder import load_splits
from recsys.data.schema import DatasetSchema
from recsys.prepare import pipeline as prepare_module
from recsys.prepare.ids import hash_ids
from recsys.prepare.pipeline import prepare

SCHEMA = {
    "labels": ["y"],
    "dense": {"x": {"transform": "none"}},
    "sparse": {"u": {}, "h": {"multi_hot": True, "max_len": 3}},
    "split": {"val_fraction": 0.0, "test_fraction": 0.0},
}
TSV = {"delimiter": "\t", "header": False, "columns": ["y", "x", "u", "h"]}


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


def write_parquet(path, data: dict, **kw) -> str:
    pq.write_table(pa.table(data), str(path), **kw)
    return str(path)


def write_text(path, data: dict, header: bool = True) -> str:
    """``data`` as CSV with a header (pyarrow's writer), or as headerless TSV (``TSV``)."""
    text = {**data, "h": ["|".join(v or []) for v in data["h"]]}
    if header:
        pacsv.write_csv(pa.table(text), str(path))
    else:
        lines = [
            "\t".join(["" if v is None else repr(float(v)) if isinstance(v, float) else str(v)
                       for v in row]) + "\n"
            for row in zip(*(text[c] for c in TSV["columns"]), strict=True)
        ]  # fmt: skip
        with open(path, "w") as f:
            f.writelines(lines)
    return str(path)


def run(tmp_path, files, schema=SCHEMA, name="out", **kw):
    out = str(tmp_path / name)
    kw.setdefault("log", lambda s: None)
    meta = prepare(DatasetSchema.from_dict(schema), files, out, workers=0, **kw)
    return out, meta


def read(out: str, meta: dict, split: str = "train"):
    splits = load_splits([out], len(meta["schema"]["dense"]), meta["table_sizes"])
    source = getattr(splits, split)
    return source.read(0, len(source))


def test_rows_and_lists_come_back_exactly_in_input_order(tmp_path):
    a, b = rows(40, 1), rows(30, 2)
    files = [  # row groups of 8 rows, each its own piece: 9 shards, read back as one split
        write_parquet(tmp_path / "a.parquet", a, row_group_size=8),
        write_parquet(tmp_path / "b.parquet", b, row_group_size=8),
    ]
    out, meta = run(tmp_path, files, chunk_mb=1e-6)
    assert [s["name"] for s in meta["shards"]["train"]] == [f"part-{k:05d}" for k in range(9)]
    assert meta["table_sizes"] == [7, 14]  # missing, unseen, 5 users / 12 words
    train = load_splits([out], 1, meta["table_sizes"]).train
    assert len(train) == 70 and meta["rows"] == {"train": 70, "val": 0, "test": 0}
    got = train.read(0, 70)
    vocab_u = np.load(os.path.join(out, meta["vocab"]["u"]))
    vocab_h = np.load(os.path.join(out, meta["vocab"]["h"]))
    lists = a["h"] + b["h"]
    kept = [(v or [])[:3] for v in lists]
    assert got.lengths[:, 1].tolist() == [len(v) for v in kept]  # real lengths, never padded
    flat = [w for v in kept for w in v]
    # the vocabulary starts at row 2 (0: missing, 1: unseen)
    assert np.array_equal(vocab_h[got.values[1].astype(np.int64) - 2], hash_ids(pa.array(flat))[0])
    users = a["u"] + b["u"]
    assert np.array_equal(vocab_u[got.values[0].astype(np.int64) - 2], hash_ids(pa.array(users))[0])
    assert np.allclose(got.dense[:, 0], np.concatenate([a["x"], b["x"]]), atol=1e-6)
    assert got.labels[:, 0].tolist() == np.concatenate([a["y"], b["y"]]).tolist()
    long = [len(v or []) for v in lists]
    assert meta["truncated"]["h"] == {
        "rows": sum(n > 3 for n in long),
        "ids": sum(max(n - 3, 0) for n in long),
    }
    # a shuffled gather (a training batch, across shards) equals the same rows read in order
    idx = np.array([5, 0, 69, 33, 1, 2, 8, 7])
    taken = train.take(idx)
    assert taken.lengths.tolist() == got.lengths[idx].tolist()
    assert np.array_equal(taken.values[0], got.values[0][idx])
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
    assert meta["split"]["by"] == "time"
    assert meta["dense_stats"]["x"]["mean"] == pytest.approx(np.mean(x[:80]))
    assert meta["dense_stats"]["x"]["std"] == pytest.approx(np.std(x[:80]))
    assert meta["table_sizes"][0] == 6  # missing, unseen, u0..u3; "late" never in training
    test = read(out, meta, "test")
    assert (test.values[0] == 1).all()  # unseen in training: the OOV row
    train = read(out, meta)
    assert np.allclose(train.dense[:, 0], (x[:80] - x[:80].mean()) / x[:80].std(), atol=1e-5)


@pytest.mark.parametrize("header", [True, False], ids=["csv-with-header", "tsv-without-header"])
def test_text_equals_parquet(tmp_path, header):
    data = rows(25, 3)
    pq_file = write_parquet(tmp_path / "d.parquet", data)
    text_file = write_text(tmp_path / "d.txt", data, header)
    csv = {} if header else TSV
    a, meta_a = run(tmp_path, [pq_file], name="p")
    b, meta_b = run(tmp_path, [text_file], {**SCHEMA, "format": "csv", "csv": csv}, name="c")
    ra, rb = read(a, meta_a), read(b, meta_b)
    assert len(ra) == len(rb) == 25
    assert ra.lengths.tolist() == rb.lengths.tolist()
    for va, vb in zip(ra.values, rb.values, strict=True):
        assert va.tolist() == vb.tolist()
    assert np.array_equal(ra.dense, rb.dense) and np.array_equal(ra.labels, rb.labels)
    for name in ("u", "h"):  # the same vocabularies
        assert np.array_equal(np.load(f"{a}/{meta_a['vocab'][name]}"),
                              np.load(f"{b}/{meta_b['vocab'][name]}"))  # fmt: skip


def _bad(tmp_path, column, values, fmt="parquet"):
    data = rows(20, 4)
    data[column] = values
    if fmt == "csv":
        return write_text(tmp_path / "bad.csv", data)
    return write_parquet(tmp_path / "bad.parquet", data)


BAD = [
    ("y", lambda n: [0] * 3 + [None] + [1] * (n - 4), "parquet",
     "column 'y', row 3: a label is null"),
    ("y", lambda n: [0] * 5 + [2] + [1] * (n - 6), "parquet",
     r"column 'y', row 5: a label must be 0 or 1 \(true/false\) \(got 2\)"),
    ("x", lambda n: ["1.5"] * 7 + ["abc"] + ["2"] * (n - 8), "csv",
     r"column 'x', row 7 \(line 9\): a dense column needs a finite number \(or null\) "
     r"\(got 'abc'\)"),
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
    assert str(e.value).startswith(f"{path}: ")
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no out, .partial, .lock


def test_a_missing_column_and_disagreeing_files_are_refused_before_anything_runs(
    tmp_path, monkeypatch
):
    def no_work(*args, **kwargs):
        raise AssertionError("a task runner was started")

    monkeypatch.setattr(prepare_module, "Executor", no_work)
    good = write_parquet(tmp_path / "a.parquet", rows(10))
    data = rows(10)
    del data["x"]
    missing = write_parquet(tmp_path / "b.parquet", data)
    with pytest.raises(
        DataError, match=r"b.parquet: column 'x' \(dense in the schema\) is missing; the file"
    ):
        run(tmp_path, [good, missing])
    data["xx"] = rows(10)["x"]  # a name near the schema's: named
    (tmp_path / "near").mkdir()
    near = write_parquet(tmp_path / "near" / "n.parquet", data)
    with pytest.raises(DataError, match=r"column 'x' .* is missing \(did you mean 'xx'\?\)"):
        run(tmp_path, [good, near])
    data["X"] = data.pop("xx")  # the same name in another case comes first
    near = write_parquet(tmp_path / "near" / "n.parquet", data)
    with pytest.raises(DataError, match=r"column 'x' .* is missing \(did you mean 'X'\?\)"):
        run(tmp_path, [good, near])
    other = {**rows(10), "u": list(range(10))}  # integer ids where a.parquet has strings
    ints = write_parquet(tmp_path / "c.parquet", other)
    with pytest.raises(DataError, match="files disagree on column 'u': .*a.parquet has string, "
                       ".*c.parquet has int64"):  # fmt: skip
        run(tmp_path, [good, ints])
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet", "c.parquet", "near"]


@pytest.mark.parametrize("by", ["order", "hash", "time"])
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_bad_value_in_a_later_file_is_numbered_within_its_file(tmp_path, fmt, by):
    first, second = rows(10, 1), rows(10, 2)
    second["y"] = [0] * 4 + [2] + [1] * 5
    for data in (first, second):
        data["ts"] = list(range(10))
    write = write_parquet if fmt == "parquet" else write_text
    files = [write(tmp_path / f"{k}.{fmt}", d) for k, d in enumerate((first, second))]
    split = {"by": by, "val_fraction": 0.1, "test_fraction": 0.1}
    schema = {**SCHEMA, "format": fmt, "split": split, **({"time": "ts"} if by == "time" else {})}
    where = r"row 4 \(line 6\)" if fmt == "csv" else "row 4"
    with pytest.raises(DataError, match=rf"^{re.escape(files[1])}: column 'y', {where}: a label"):
        run(tmp_path, files, schema)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_an_empty_first_file_is_prepared(tmp_path, fmt):
    data = rows(10)
    if fmt == "parquet":
        empty = str(tmp_path / "0.parquet")
        pq.write_table(pa.table(data).slice(0, 0), empty)  # the columns' types, no row
        full = write_parquet(tmp_path / "1.parquet", data)
    else:
        (tmp_path / "0.tsv").write_text("")
        empty, full = str(tmp_path / "0.tsv"), write_text(tmp_path / "1.tsv", data, header=False)
    schema = {**SCHEMA, "format": fmt, **({"csv": TSV} if fmt == "csv" else {})}
    _, meta = run(tmp_path, [empty, full], schema)
    assert meta["rows"]["train"] == 10


def test_bad_rows_are_skipped_and_counted_when_asked(tmp_path):
    data = rows(30, 5)
    data["y"] = [None, 2] + [1] * 28
    path = write_parquet(tmp_path / "s.parquet", data)
    out, meta = run(tmp_path, [path], {**SCHEMA, "on_bad_row": "skip"})
    assert meta["skipped"] == {"y": 2} and meta["rows"]["train"] == 28
    got = read(out, meta)
    assert np.allclose(got.dense[:, 0], data["x"][2:], atol=1e-6)  # the other rows, in order


def test_bad_text_lines_and_values_are_skipped_and_counted_when_asked(tmp_path):
    data = rows(30, 6)
    path = write_text(tmp_path / "s.tsv", data, header=False)
    with open(path) as f:
        lines = f.readlines()
    lines[4] = lines[4].rstrip("\n") + "\textra\n"  # a line with a field too many
    lines[9] = "1\tabc\t" + lines[9].split("\t", 2)[2]  # a dense value that is no number
    with open(path, "w") as f:
        f.writelines(lines)
    schema = {**SCHEMA, "format": "csv", "csv": TSV, "on_bad_row": "skip"}
    out, meta = run(tmp_path, [path], schema)
    assert meta["skipped"] == {"lines": 1, "x": 1} and meta["rows"]["train"] == 28
    keep = [i for i in range(30) if i not in (4, 9)]
    got = read(out, meta)
    assert np.allclose(got.dense[:, 0], data["x"][keep], atol=1e-6)
    with pytest.raises(DataError, match=r"s.tsv:5: expected 4 fields, got 5"):
        run(tmp_path, [path], {**schema, "on_bad_row": "error"}, name="o2")


def test_an_unfinished_folder_is_never_read_as_prepared_and_is_replaced(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", rows(10))
    partial = tmp_path / "out.partial"
    (partial / "train").mkdir(parents=True)  # what a killed run leaves
    with pytest.raises(DataError, match="not a prepared folder.*did not finish"):
        load_splits([str(tmp_path / "out")], 1, [6, 13])
    out, _ = run(tmp_path, [path])
    assert not partial.exists()
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert meta["format"] == "recsys-prepared-v3" and meta["rows"]["train"] == 10
    with pytest.raises(DataError, match="exists; choose another --out or pass --overwrite"):
        run(tmp_path, [path])
    _, again = run(tmp_path, [write_parquet(tmp_path / "b.parquet", rows(12))], overwrite=True)
    assert again["rows"]["train"] == 12 and not partial.exists()


def test_the_skipped_line_tells_bad_values_from_lines_that_did_not_split():
    from recsys.prepare.pipeline import skipped_line

    assert skipped_line({"y": 1, "x": 1200}) == "bad values per column: y 1, x 1,200"
    assert skipped_line({"y": 2, "lines": 3}) == (
        "bad values per column: y 2; 3 text lines that did not split"
    )
    assert skipped_line({"lines": 1}) == "1 text lines that did not split"


def test_the_command_line_names_a_bad_value(tmp_path, capsys):
    from recsys.cli.preprocess import main

    schema = tmp_path / "schema.json"  # JSON is YAML
    schema.write_text(json.dumps(SCHEMA))
    path = _bad(tmp_path, "y", [0] * 3 + [None] + [1] * 16)
    argv = ["--schema", str(schema), path, "--workers", "0", "--no-progress"]
    with pytest.raises(SystemExit, match=r"error: .*bad.parquet: column 'y', row 3: a label"):
        main([*argv, "--out", str(tmp_path / "out")])
    capsys.readouterr()
    main([*argv, "--out", str(tmp_path / "out"), "--on-bad-row", "skip"])
    with open(tmp_path / "out" / "meta.json") as f:
        assert json.load(f)["skipped"] == {"y": 1}
    said = capsys.readouterr()
    assert "prepare: skipped rows (bad values per column: y 1; meta.json's 'skipped')" in (
        said.out + said.err
    )


# ---------------------------------------------------------------------------------------------
# Issue 37


def test_a_column_of_arrow_null_type_is_missing_in_every_row_with_a_warning(tmp_path):
    a, b = rows(40, 1), rows(30, 2)
    b["u"] = pa.nulls(30)  # what a writer gives a column that held nothing in this file
    files = [write_parquet(tmp_path / "a.parquet", a), write_parquet(tmp_path / "b.parquet", b)]
    assert pa.types.is_null(pq.read_schema(files[1]).field("u").type)
    logged: list[str] = []
    out, meta = run(tmp_path, files, log=logged.append)
    [warning] = meta["warnings"]
    assert "column 'u'" in warning and "b.parquet" in warning
    assert any("column 'u'" in line and "warning" in line for line in logged)
    got = read(out, meta)
    assert len(got) == 70 and meta["table_sizes"][0] == 7  # a's five users, missing, unseen
    assert (got.values[0][:40] > 0).all() and (got.values[0][40:] == 0).all()
    assert got.labels[:, 0].tolist() == np.concatenate([a["y"], b["y"]]).tolist()

    # a column null in every file: prepared, every id 0 (missing and unseen rows), the same
    # warning
    out, meta = run(tmp_path, files[1:], name="only_nulls")
    assert "column 'u'" in meta["warnings"][0] and meta["table_sizes"][0] == 2
    assert (read(out, meta).values[0] == 0).all()


def test_a_multi_hot_column_of_arrow_null_type_is_empty_lists_with_a_warning(tmp_path):
    a, b = rows(20, 1), rows(20, 2)
    b["h"] = pa.nulls(20)
    files = [write_parquet(tmp_path / "a.parquet", a), write_parquet(tmp_path / "b.parquet", b)]
    out, meta = run(tmp_path, files)
    assert "column 'h'" in meta["warnings"][0]
    assert (read(out, meta).lengths[20:, 1] == 0).all()


INF = [
    ("parquet", float("inf"), r"bad.parquet: column 'x', row 5: .*finite.* \(got inf\)"),
    ("parquet", float("-inf"), r"bad.parquet: column 'x', row 5: .*finite.* \(got -inf\)"),
    ("csv", "inf", r"bad.csv: column 'x', row 5 \(line 7\): .*finite.* \(got 'inf'\)"),
    ("csv", "-Infinity", r"bad.csv: column 'x', row 5 \(line 7\): .*finite.* \(got '-Infinity'\)"),
]


@pytest.mark.parametrize("fmt, value, message", INF, ids=[f"{f}-{v}" for f, v, _ in INF])
def test_an_infinite_number_is_a_bad_value(tmp_path, fmt, value, message):
    ok = 1.5 if fmt == "parquet" else "1.5"
    path = _bad(tmp_path, "x", [ok] * 5 + [value] + [ok] * 14, fmt)
    with pytest.raises(DataError, match=message):
        run(tmp_path, [path], {**SCHEMA, "format": fmt})
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_infinite_numbers_are_skipped_and_counted_and_nan_is_still_missing(tmp_path, fmt):
    x: list = [float(i) for i in range(20)]
    x[3], x[8], x[10] = float("inf"), float("-inf"), float("nan")
    missing = [10]
    if fmt == "csv":
        x = [repr(v) for v in x]
        x[12] = ""  # text's other way of saying missing
        missing.append(12)
    path = _bad(tmp_path, "x", x, fmt)
    schema = {**SCHEMA, "format": fmt, "on_bad_row": "skip", "dense": {"x": {"fill": -7.0}}}
    out, meta = run(tmp_path, [path], schema)
    assert meta["skipped"] == {"x": 2} and meta["rows"]["train"] == 18
    expect = [-7.0 if i in missing else float(i) for i in range(20) if i not in (3, 8)]
    assert read(out, meta).dense[:, 0].tolist() == expect
    assert meta["dense_stats"]["x"]["count"] == 18


def test_a_label_with_one_class_in_a_split_is_prepared_and_reported(tmp_path):
    n = 100
    y = np.arange(n) % 2
    y[80:90] = 1  # every validation row (the rows before the last 10) is a click
    data = {**rows(n, 7), "y": y.astype(np.int8)}
    schema = {**SCHEMA, "split": {"by": "order", "val_fraction": 0.1, "test_fraction": 0.1}}
    logged: list[str] = []
    _, meta = run(tmp_path, [write_parquet(tmp_path / "o.parquet", data)], schema,
                  log=logged.append)  # fmt: skip
    assert meta["rows"] == {"train": 80, "val": 10, "test": 10}
    assert meta["label_counts"] == {
        "train": {"y": {"rows": 80, "positives": 40}},
        "val": {"y": {"rows": 10, "positives": 10}},
        "test": {"y": {"rows": 10, "positives": 5}},
    }
    [warning] = meta["warnings"]
    assert "'y'" in warning and "val" in warning and "10 rows, all 1" in warning
    assert any(warning in line for line in logged)


def test_labels_with_one_class_everywhere_are_prepared_and_reported(tmp_path):
    n = 60
    data = {**rows(n, 8), "y": np.ones(n, np.int8), "z": np.zeros(n, np.int8)}
    schema = {**SCHEMA, "labels": ["y", "z"],
              "split": {"by": "hash", "val_fraction": 0.25, "test_fraction": 0.25}}  # fmt: skip
    out, meta = run(tmp_path, [write_parquet(tmp_path / "one.parquet", data)], schema)
    assert sum(meta["rows"].values()) == n and min(meta["rows"].values()) > 0
    for split, count in meta["rows"].items():
        assert meta["label_counts"][split] == {
            "y": {"rows": count, "positives": count},
            "z": {"rows": count, "positives": 0},
        }
    warnings = meta["warnings"]
    assert len(warnings) == 6
    for split, count in meta["rows"].items():
        assert any(f"'y' has one class in {split} ({count} rows, all 1)" in w for w in warnings)
        assert any(f"'z' has one class in {split} ({count} rows, all 0)" in w for w in warnings)
    assert (read(out, meta).labels == [1, 0]).all()


def test_a_dictionary_encoded_id_column_prepares_as_its_plain_strings(tmp_path):
    data = rows(200, 9)
    cat = {**data, "u": pa.array(data["u"]).dictionary_encode()}  # pandas' category
    plain_file = write_parquet(tmp_path / "plain.parquet", data)
    cat_file = write_parquet(tmp_path / "cat.parquet", cat)
    assert pa.types.is_dictionary(pq.read_schema(cat_file).field("u").type)
    schema = {**SCHEMA, "split": {"val_fraction": 0.2, "test_fraction": 0.2}}  # hash: no time
    a, meta_a = run(tmp_path, [plain_file], schema, name="a")
    b, meta_b = run(tmp_path, [cat_file], schema, name="b")
    assert meta_a["split"]["by"] == "hash" and min(meta_a["rows"].values()) > 0
    for meta in (meta_a, meta_b):
        del meta["sources"]
    assert meta_a == meta_b  # the same split, shards, vocabularies, statistics, id types
    files = sorted(
        os.path.relpath(os.path.join(d, f), a)
        for d, _, names in os.walk(a) for f in names if f.endswith(".npy")
    )  # fmt: skip
    assert any(f.startswith("val/") for f in files) and any(f.startswith("test/") for f in files)
    for f in files:
        with open(os.path.join(a, f), "rb") as fa, open(os.path.join(b, f), "rb") as fb:
            assert fa.read() == fb.read(), f
    assert sorted(files) == sorted(
        os.path.relpath(os.path.join(d, f), b)
        for d, _, names in os.walk(b) for f in names if f.endswith(".npy")
    )  # fmt: skip

    # the two files together agree on the column's type, and equal rows get equal ids
    both, meta = run(tmp_path, [plain_file, cat_file], schema, name="both")
    assert sum(meta["rows"].values()) == 400
    for split in ("train", "val", "test"):
        ids = read(both, meta, split).values[0]
        half = len(ids) // 2
        assert np.array_equal(ids[:half], ids[half:])


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_identity_ids_that_are_not_whole_numbers_are_bad_values(tmp_path, policy):
    """``identity`` ids in text: a word or a decimal is named (error) or skipped and counted,
    never a traceback; big integers are read exactly (not through floats)."""
    data = rows(10)
    data["u"] = ["3", "abc", "2.0", str(2**53 + 1), *["7"] * 6]  # 2**53 + 1: not a float
    path = write_text(tmp_path / "a.csv", data)
    sparse = {"u": {"identity": True, "hash_buckets": 1000}, "h": {"multi_hot": True}}
    schema = {**SCHEMA, "format": "csv", "on_bad_row": policy, "sparse": sparse}
    if policy == "error":
        with pytest.raises(DataError, match=r"column 'u', row 1 \(line 3\): identity ids must"):
            run(tmp_path, [path], schema)
        return
    out, meta = run(tmp_path, [path], schema)
    assert meta["skipped"] == {"u": 2}
    assert read(out, meta).values[0].tolist() == [3, (2**53 + 1) % 1000, *[7] * 6]  # 993


def test_integer_ids_declared_hex_are_served_as_the_integers_they_were_prepared_as(tmp_path):
    data = {**rows(30), "u": np.arange(30) * 255}
    path = write_parquet(tmp_path / "a.parquet", data)
    schema = {**SCHEMA, "sparse": {"u": {"hex": True}, "h": {"multi_hot": True}}}
    _, meta = run(tmp_path, [path], schema)
    assert meta["id_types"]["u"] == "int"


def test_the_example_rows_are_good_rows(tmp_path):
    """``skip``: a bad value among the first rows is left out of the served model's example."""
    data = rows(20)
    data["x"] = ["oops", *[str(v) for v in data["x"][1:]]]
    path = write_text(tmp_path / "a.csv", data)
    out, _ = run(tmp_path, [path], {**SCHEMA, "format": "csv", "on_bad_row": "skip"})
    example = pq.read_table(os.path.join(out, "examples.parquet"))
    assert example.column("u").to_pylist() == data["u"][1:6]


def test_a_folders_files_are_read_with_numbers_in_their_names_by_value(tmp_path):
    from recsys.prepare.sources import input_files

    for k in (10, 2, 1):
        write_parquet(tmp_path / f"day_{k}.parquet", rows(3))
    names = [os.path.basename(f) for f in input_files([str(tmp_path)], "parquet")]
    assert names == ["day_1.parquet", "day_2.parquet", "day_10.parquet"]


def test_the_time_column_follows_the_rules_of_derived_time_features(tmp_path):
    """One timestamp reader (``epoch_seconds``): a time column in epoch milliseconds is refused
    for the split as for a derived feature, naming column and row; the same instants as
    Parquet timestamps in milliseconds, as epoch seconds and as ISO text split alike."""
    n = 50
    secs = 1_700_000_000 + np.arange(n) * 3600
    base = {"y": (np.arange(n) % 2).astype(np.int8), "x": np.zeros(n), "u": ["a"] * n,
            "h": [["w"]] * n}  # fmt: skip
    split = {"val_fraction": 0.2, "test_fraction": 0.2}
    schema = {**SCHEMA, "time": "ts", "split": split}
    derived = {**schema, "sparse": {**SCHEMA["sparse"], "hour": {"derive": "hour", "source": "ts"}}}
    millis = write_parquet(tmp_path / "ms.parquet", {**base, "ts": secs * 1000})
    for s in (schema, derived):
        with pytest.raises(DataError, match=r"column 'ts', row 0: .*epoch seconds \(years"):
            run(tmp_path, [millis], s, name="bad")
    stamps = pa.array(secs * 1000, pa.timestamp("ms"))
    iso = [f"{np.datetime64(int(s), 's')}Z" for s in secs]
    metas = [
        run(
            tmp_path,
            [write_parquet(tmp_path / f"{k}.parquet", {**base, "ts": ts})],
            derived,
            name=k,
        )[1]
        for k, ts in (("stamps", stamps), ("secs", secs), ("iso", iso))
    ]
    assert [m["split"]["time_cuts"] for m in metas] == [metas[0]["split"]["time_cuts"]] * 3
    assert [m["rows"] for m in metas] == [metas[0]["rows"]] * 3
    assert metas[0]["rows"]["test"] == 10 and metas[0]["split"]["time_cuts"][1] > secs[0]


def test_serving_names_a_folder_of_an_earlier_version(tmp_path):
    """The prepared folder beside an old export, of an earlier format: refused with what to do,
    by the one reader of meta.json."""
    import json

    from recsys.prepare.like import load_fitted

    (tmp_path / "meta.json").write_text(json.dumps({"format": "recsys-prepared-v2"}))
    with pytest.raises(ValueError, match="'recsys-prepared-v2' of an earlier version; prepare"):
        load_fitted(str(tmp_path))
    with pytest.raises(DataError, match="not a prepared folder"):
        load_fitted(str(tmp_path / "missing"))


def test_each_row_keeps_its_group(tmp_path):
    """``group_by``: each row's group is the hash of its raw value (``groups.npy``, read back by
    ``RowSource.groups`` across shards and splits), 0 for a row without one; a column the model
    does not read serves too, and two users whose ids share the unseen row stay two groups."""
    data = rows(60)
    data["session"] = [None if i % 10 == 3 else f"s{i % 7}" for i in range(60)]
    sparse = {"u": {"min_count": 30}, "h": SCHEMA["sparse"]["h"]}  # every user unseen
    schema = DatasetSchema.from_dict({**SCHEMA, "group_by": "session", "sparse": sparse})
    src = write_parquet(tmp_path / "a.parquet", data)
    out = str(tmp_path / "out")
    prepare(schema, [src], out, workers=0, log=lambda s: None)
    splits = load_splits([out], 1, [1, 1])
    got = splits.train.groups(0, len(splits.train))
    hashes, missing = hash_ids(pa.array(data["session"]))
    want = np.where(missing, 0, hashes.view(np.int64))
    assert np.array_equal(got, want) and (got[3::10] == 0).all() and len(set(got) - {0}) == 7
    assert np.array_equal(splits.train.groups(5, 9), want[5:9])
    by_user = DatasetSchema.from_dict({**schema.to_dict(), "group_by": "u"})
    prepare(by_user, [src], str(tmp_path / "users"), workers=0, log=lambda s: None)
    users = load_splits([str(tmp_path / "users")], 1, [1, 1]).train
    ids = users.read(0, len(users)).values[0]
    assert len(set(ids)) < 5 and len(set(users.groups(0, len(users)))) == 5  # rare users kept apart
