"""Preparation as Ray tasks (a 2-CPU local Ray, every file cut into several pieces) writes the
same bytes as the same pieces run one after the other in this process (``workers=0``), for
Parquet and for Criteo's headerless TSV, with bad rows stopping the run or skipped; a bad line is
named by its file and its line in the whole file, whichever piece it is in; and the pieces do not
change the data: another ``chunk_mb`` gives the same rows, split by split."""

from __future__ import annotations

import gzip
import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.data import DataError
from recsys.data.prepared.folder import load_splits
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import prepare
from recsys.prepare.sources import input_files, plan_pieces
from tests.conftest import write_criteo

pytestmark = pytest.mark.ray

KAGGLE = DatasetSchema.load("criteo_kaggle")
TSV_CHUNK_MB = 0.05  # 4 pieces per 600-row plain file
PARQUET = {
    "labels": ["click"],
    "time": "ts",
    "split": {"val_fraction": 0.1, "test_fraction": 0.1},
    "dense": {"price": {"transform": "log1p"}, "age": {"transform": "standardize", "fill": 40}},
    "sparse": {
        "user": {"min_count": 2},
        "country": {},  # dictionary-encoded (pandas' category)
        "item": {"hash_buckets": 64},
        "history": {"multi_hot": True, "max_len": 4},
    },
}
PARQUET_CHUNK_MB = 0.003  # a piece of one or two 100-row groups
ROWS = 600


def parquet_inputs(folder, bad: bool = False) -> str:
    """Three Parquet files of 600 rows in 100-row groups; ``bad``: three bad values planted
    (a null label, an infinite price, a label 2) in different files and pieces."""
    os.makedirs(folder, exist_ok=True)
    for k in range(3):
        rng = np.random.default_rng(k)
        click: list = rng.integers(0, 2, ROWS).tolist()
        price = rng.exponential(10, ROWS)
        price[rng.random(ROWS) < 0.1] = np.nan
        if bad:
            if k == 0:
                click[5] = None
            if k == 1:
                price[250] = np.inf
            if k == 2:
                click[599] = 2
        words = [f"w{i}" for i in range(40)]
        history = [[words[j] for j in rng.integers(0, 40, rng.integers(0, 8))] for _ in range(ROWS)]
        history[7] = None
        table = pa.table({
            "click": pa.array(click, pa.int8()),
            "ts": rng.integers(0, 100_000, ROWS),
            "price": price,
            "age": np.where(rng.random(ROWS) < 0.05, np.nan, rng.normal(40, 12, ROWS)),
            "user": [f"user{v}" for v in rng.zipf(1.3, ROWS) % 500],
            "country": pa.array([f"c{v}" for v in rng.integers(0, 20, ROWS)]).dictionary_encode(),
            "item": rng.integers(0, 10_000, ROWS),
            "history": history,
        })  # fmt: skip
        pq.write_table(table, os.path.join(folder, f"part_{k}.parquet"), row_group_size=100)
    return str(folder)


def edit_lines(path: str, edits: dict[int, str]) -> None:
    """Replace lines (1-based) of a plain or gzip text file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.readlines()
    for line, text in edits.items():
        lines[line - 1] = text
    with opener(path, "wt") as f:
        f.writelines(lines)


def line(path: str, n: int) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.readlines()[n - 1]


def extra_field(text: str) -> str:
    return text.rstrip("\n") + "\textra\n"


def bad_field(text: str, index: int, value: str) -> str:
    fields = text.rstrip("\n").split("\t")
    fields[index] = value
    return "\t".join(fields) + "\n"


def tsv_inputs(folder, bad: bool = False, gzip_last: bool = True) -> str:
    """Criteo-format days (600 rows each): two plain files and (``gzip_last``) a gzip one;
    ``bad``: two malformed lines and two bad values planted in different files and pieces."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(3):
        compress = gzip_last and k == 2
        path = os.path.join(folder, f"day_{k}" + (".gz" if compress else ""))
        write_criteo(path, rows=ROWS, seed=k, compress=compress)
        paths.append(path)
    if bad:
        edit_lines(paths[0], {
            2: extra_field(line(paths[0], 2)),
            290: bad_field(line(paths[0], 290), 1, "x"),  # I1 not a number
        })  # fmt: skip
        edit_lines(paths[1], {599: bad_field(line(paths[1], 599), 14, "zz")})  # C1 not hex
        edit_lines(paths[2], {10: line(paths[2], 10).rsplit("\t", 1)[0] + "\n"})  # one short
    return str(folder)


def contents(folder: str) -> dict[str, object]:
    """Every file of a prepared folder as bytes, ``meta.json`` without its ``sources`` (the
    input paths)."""
    out: dict[str, object] = {}
    for d, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(d, name)
            key = os.path.relpath(path, folder)
            if name == "meta.json":
                with open(path) as f:
                    meta = json.load(f)
                del meta["sources"]
                out[key] = meta
            else:
                with open(path, "rb") as f:
                    out[key] = f.read()
    return out


def splits_of(folder: str, meta: dict) -> dict[str, tuple]:
    """Each split's rows, concatenated over its shards."""
    splits = load_splits([folder], len(meta["schema"]["dense"]), meta["table_sizes"])
    out = {}
    for name in ("train", "val", "test"):
        s = getattr(splits, name)
        rows = s.read(0, len(s))
        out[name] = (rows.dense, rows.labels, rows.lengths, *rows.values)
    return out


def schema_for(fmt: str, on_bad_row: str = "error") -> tuple[DatasetSchema, float]:
    raw = PARQUET if fmt == "parquet" else KAGGLE.to_dict()
    return DatasetSchema.from_dict({**raw, "on_bad_row": on_bad_row}), (
        PARQUET_CHUNK_MB if fmt == "parquet" else TSV_CHUNK_MB
    )


def inputs_for(fmt: str, folder, bad: bool = False) -> str:
    return parquet_inputs(folder, bad) if fmt == "parquet" else tsv_inputs(folder, bad)


SKIPPED = {"parquet": {"click": 2, "price": 1}, "tsv": {"lines": 2, "I1": 1, "C1": 1}}


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
@pytest.mark.parametrize("fmt", ["parquet", "tsv"])
def test_ray_tasks_write_the_same_bytes_as_one_process(ray_2_cpus, tmp_path, fmt, on_bad_row):
    schema, chunk_mb = schema_for(fmt, on_bad_row)
    folder = inputs_for(fmt, tmp_path / "in", bad=on_bad_row == "skip")
    files = input_files([folder], schema.format)
    pieces = plan_pieces(files, schema, int(chunk_mb * 2**20))
    per_file = [sum(p.file == k for p in pieces) for k in range(len(files))]
    assert len(files) == 3 and min(per_file[:2]) >= 3, per_file  # (a gzip file is one piece)
    kw = {"chunk_mb": chunk_mb, "log": lambda s: None}
    one = prepare(schema, [folder], str(tmp_path / "one"), workers=0, **kw)
    two = prepare(schema, [folder], str(tmp_path / "two"), workers=2, **kw)
    assert two == one  # the returned meta.json, the same inputs' paths included
    assert one["skipped"] == (SKIPPED[fmt] if on_bad_row == "skip" else {})
    assert sum(one["rows"].values()) == 3 * ROWS - sum(one["skipped"].values())
    assert len(one["shards"]["train"]) == len(pieces)
    assert min(one["rows"].values()) > 0
    a, b = contents(str(tmp_path / "one")), contents(str(tmp_path / "two"))
    assert sorted(a) == sorted(b)
    assert len([k for k in a if k.endswith(".npy")]) >= 3 * len(pieces)
    different = [k for k in a if a[k] != b[k]]
    assert different == []


@pytest.mark.parametrize("by", ["order", "hash"])
@pytest.mark.parametrize("bad", ["line", "value"])
def test_a_bad_line_in_the_third_piece_of_the_second_file_names_file_and_line(
    ray_2_cpus, tmp_path, bad, by
):
    schema = DatasetSchema.from_dict({**KAGGLE.to_dict(), "split": {"by": by}})
    folder = tsv_inputs(tmp_path / "in", gzip_last=False)
    files = input_files([folder], "csv")
    second = [p for p in plan_pieces(files, schema, int(TSV_CHUNK_MB * 2**20)) if p.file == 1]
    assert len(second) >= 4
    with open(files[1], "rb") as f:
        before = f.read(second[2].start).count(b"\n")
        later = f.read().count(b"\n")  # the last line of the file
    n = before + 5  # the fifth line of the third piece
    if bad == "line":
        broken = extra_field(line(files[1], n))
        message = rf"^{re.escape(files[1])}:{n}: expected 40 fields, got 41$"
    else:
        broken = bad_field(line(files[1], n), 1, "x")
        message = (rf"^{re.escape(files[1])}: column 'I1', row {n - 1} \(line {n}\): a dense "
                   r"column needs a finite number \(or null\) \(got 'x'\)$")  # fmt: skip
    edit_lines(files[1], {n: broken})
    # later in the input, later pieces of the same file and the next file are broken too: the
    # error named is the first in input order, whichever task fails first
    edit_lines(files[1], {before + later: extra_field(line(files[1], before + later))})
    edit_lines(files[2], {3: extra_field(line(files[2], 3))})
    out = tmp_path / "out"
    with pytest.raises(DataError, match=message):
        prepare(schema, [folder], str(out), workers=2, chunk_mb=TSV_CHUNK_MB, log=lambda s: None)
    assert sorted(os.listdir(tmp_path)) == ["in"]  # no out, no out.partial, no lock


@pytest.mark.parametrize("fmt", ["parquet", "tsv"])
def test_other_pieces_give_the_same_rows_split_by_split(ray_2_cpus, tmp_path, fmt):
    schema, chunk_mb = schema_for(fmt)
    folder = inputs_for(fmt, tmp_path / "in")
    small = prepare(schema, [folder], str(tmp_path / "small"), workers=2, chunk_mb=chunk_mb,
                    log=lambda s: None)  # fmt: skip
    whole = prepare(schema, [folder], str(tmp_path / "whole"), workers=2, log=lambda s: None)
    assert len(small["shards"]["train"]) > len(whole["shards"]["train"]) == 3
    for key in ("rows", "ids", "skipped", "truncated", "split", "label_counts", "table_sizes",
                "vocab", "id_types", "warnings"):  # fmt: skip
        assert small[key] == whole[key], key
    for name, stats in small["dense_stats"].items():
        assert stats == pytest.approx(whole["dense_stats"][name], rel=1e-12), name
    a = splits_of(str(tmp_path / "small"), small)
    b = splits_of(str(tmp_path / "whole"), whole)
    for split in a:
        assert len(a[split][0]) == small["rows"][split] > 0
        for x, y in zip(a[split], b[split], strict=True):
            np.testing.assert_array_equal(x, y, err_msg=split)
    for name in small["vocab"]:
        vocab = small["vocab"][name]
        np.testing.assert_array_equal(np.load(tmp_path / "small" / vocab),
                                      np.load(tmp_path / "whole" / vocab))  # fmt: skip
