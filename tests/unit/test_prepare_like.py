"""A later period prepared like an earlier one (``prepare(..., like=EARLIER)``, ``recsys-preprocess
--like``): known ids keep their rows, unseen ones go to the unseen rows and are counted, the dense
columns keep the earlier statistics, a model configured on the earlier folder reads the new one
unchanged; a column whose type changed or that went missing is refused naming it; with
``grow_vocab`` new ids frequent enough take rows at the end of their table, up to ``max_size``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from recsys.config import ExperimentConfig
from recsys.data.columns import DataError
from recsys.data.dataset import resolve
from recsys.data.prepared.folder import load_splits
from recsys.data.schema import DatasetSchema
from recsys.prepare.ids import hash_ids
from recsys.prepare.like import load_fitted
from recsys.prepare.pipeline import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = {
    "labels": ["y"],
    "dense": {"x": {"transform": "standardize"}},
    "sparse": {"u": {}, "item": {"min_count": 2, "max_size": 12}},
    "split": {"val_fraction": 0.0, "test_fraction": 0.0},
}


def period(n: int, items: tuple[int, int], users: int, seed: int, shift: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "y": rng.integers(0, 2, n).astype(np.int8),
        "x": rng.normal(shift, 1.0, n),
        "u": [f"user{v}" for v in rng.integers(0, users, n)],
        "item": rng.integers(*items, n).astype(np.int64),
    }


def write(path, data: dict) -> str:
    pq.write_table(pa.table(data), str(path))
    return str(path)


@pytest.fixture
def earlier(tmp_path):
    out = str(tmp_path / "week1")
    src = write(tmp_path / "week1.parquet", period(400, (0, 10), 5, seed=0))
    prepare(DatasetSchema.from_dict(SCHEMA), [src], out, workers=0, log=lambda s: None)
    return out


def test_known_ids_keep_their_rows_and_unseen_ones_are_counted(earlier, tmp_path):
    data = period(300, (5, 20), 8, seed=1, shift=5.0)  # items 10-19 and users 5-7 are new
    src = write(tmp_path / "week2.parquet", data)
    out = str(tmp_path / "week2")
    schema = load_fitted(earlier).schema
    meta = prepare(schema, [src], out, workers=0, like=earlier, log=lambda s: None)
    old = load_fitted(earlier)
    hashes, _ = hash_ids(pa.array(data["item"]))
    rows = load_splits([out], 1, [1, 1]).train.read(0, 300).sparse[:, 1, 0]
    assert np.array_equal(rows, old.vocabs["item"].ids(hashes))  # the earlier rows, unseen: 1
    new_items = int((data["item"] >= 10).sum())
    new_users = sum(u in {"user5", "user6", "user7"} for u in data["u"])
    assert meta["unseen"]["train"] == {"u": new_users, "item": new_items} and new_items > 50
    with open(os.path.join(earlier, "meta.json")) as f:
        first = json.load(f)
    assert meta["dense_stats"] == first["dense_stats"]  # the earlier training rows' statistics
    assert meta["like"] == {"folder": os.path.abspath(earlier), "grown": {}}
    assert meta["table_sizes"] == first["table_sizes"]
    on = {"data": {"source": "prepared"}}
    cfg_old = resolve(ExperimentConfig.from_dict({"data": {**on["data"], "paths": [earlier]}}))
    cfg_new = resolve(ExperimentConfig.from_dict({"data": {**on["data"], "paths": [out]}}))
    assert cfg_new.embeddings == cfg_old.embeddings and cfg_new.model == cfg_old.model


def test_a_group_column_of_floats_is_refused(tmp_path):
    data = period(50, (0, 10), 5, seed=5)
    data["session"] = np.linspace(0, 1, 50)
    schema = DatasetSchema.from_dict({**SCHEMA, "group_by": "session"})
    with pytest.raises(DataError, match="group_by='session': a column of double"):
        prepare(schema, [write(tmp_path / "f.parquet", data)], str(tmp_path / "o"), workers=0)
    gone = {k: v for k, v in data.items() if k != "session"}
    with pytest.raises(DataError, match="column 'session' .group_by in the schema. is missing"):
        prepare(schema, [write(tmp_path / "g.parquet", gone)], str(tmp_path / "o"), workers=0)


def test_a_column_that_changed_type_or_went_missing_is_refused_naming_it(earlier, tmp_path):
    schema = load_fitted(earlier).schema
    text = period(50, (0, 10), 5, seed=2)
    text["item"] = [str(v) for v in text["item"]]
    src = write(tmp_path / "text.parquet", text)
    with pytest.raises(DataError, match="column 'item': string ids here, int ids in .*week1"):
        prepare(schema, [src], str(tmp_path / "o1"), workers=0, like=earlier)
    dense = period(50, (0, 10), 5, seed=2)
    dense["x"] = [f"{v:.2f}" for v in dense["x"]]
    with pytest.raises(DataError, match="column 'x': text here, numbers in"):
        prepare(schema, [write(tmp_path / "d.parquet", dense)], str(tmp_path / "o2"), workers=0,
                like=earlier)  # fmt: skip
    gone = {k: v for k, v in period(50, (0, 10), 5, seed=2).items() if k != "u"}
    with pytest.raises(DataError, match="column 'u' .* is missing"):
        prepare(schema, [write(tmp_path / "g.parquet", gone)], str(tmp_path / "o3"), workers=0,
                like=earlier)  # fmt: skip
    other = DatasetSchema.from_dict({**SCHEMA, "dense": {"x": {"transform": "log1p"}}})
    with pytest.raises(DataError, match=r"schema differs from that folder's in \['dense'\]"):
        prepare(other, [src], str(tmp_path / "o4"), workers=0, like=earlier)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("o")]  # nothing half-written


def test_grown_vocabularies_append_new_ids_up_to_max_size(earlier, tmp_path):
    old = load_fitted(earlier)
    data = period(600, (0, 40), 5, seed=3)  # 30 new items, each seen ~15 times
    src = write(tmp_path / "week2.parquet", data)
    out = str(tmp_path / "week2")
    meta = prepare(old.schema, [src], out, workers=0, like=earlier, grow_vocab=True,
                   log=lambda s: None)  # fmt: skip
    new = load_fitted(out)
    kept = len(old.vocabs["item"].hashes)
    assert kept == 10 and len(new.vocabs["item"].hashes) == 12  # max_size 12 in all
    assert np.array_equal(new.vocabs["item"].hashes[:kept], old.vocabs["item"].hashes)
    assert meta["like"]["grown"] == {"item": 2} and meta["table_sizes"][1] == 2 + 12
    assert len(new.vocabs["u"].hashes) == 5  # no new user: nothing grew
    with pytest.raises(DataError, match="--grow-vocab grows an earlier folder's"):
        prepare(old.schema, [src], str(tmp_path / "x"), workers=0, grow_vocab=True)


def test_the_command_takes_a_folder_or_a_schema(earlier, tmp_path):
    src = write(tmp_path / "week2.parquet", period(100, (0, 12), 5, seed=4))
    run = [sys.executable, "-m", "recsys.cli.preprocess", src, "--workers", "0"]
    ok = subprocess.run([*run, "--like", earlier, "--out", str(tmp_path / "w2")],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "prepare: item: " in ok.stderr and f"not in the vocabulary of {earlier}" in ok.stderr
    neither = subprocess.run([*run, "--out", "o"], capture_output=True, text=True, cwd=ROOT,
                             timeout=120)  # fmt: skip
    assert neither.returncode != 0 and "name the data's schema (--schema)" in neither.stderr
    other = tmp_path / "other.yaml"  # another split is free; another transform is not
    other.write_text(yaml.safe_dump({**SCHEMA, "split": {"val_fraction": 0.2}}))
    ok = subprocess.run([*run, "--like", earlier, "--schema", str(other), "--out",
                         str(tmp_path / "w3")], capture_output=True, text=True, cwd=ROOT,
                        timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    other.write_text(yaml.safe_dump({**SCHEMA, "dense": {"x": {"transform": "log1p"}}}))
    both = subprocess.run([*run, "--like", earlier, "--schema", str(other), "--out", "o"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert both.returncode != 0 and "the schema differs from that folder's in ['dense']" in \
        both.stderr  # fmt: skip
    grow = subprocess.run([*run, "--schema", "clicklogs", "--grow-vocab", "--out", "o"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert grow.returncode != 0 and "--grow-vocab grows the vocabularies of --like" in grow.stderr


def test_the_drift_log_is_written_a_period_a_folder_and_prepared_like_the_first(tmp_path, capsys):
    """``recsys-synth --drift``: one folder a period, later in time each, with the schema to
    prepare them; a period prepared ``--like`` the first keeps its ids' rows."""
    from recsys.cli import synth

    logs = tmp_path / "logs"
    synth.main(["--drift", "--periods", "2", "--rows-per-period", "400", "--out", str(logs)])
    first, second = (pq.read_table(logs / f"period-{k}" / "log.parquet") for k in (1, 2))
    assert first.num_rows == second.num_rows == 400 and "p_click" not in first.column_names
    assert max(first.column("ts").to_pylist()) < min(second.column("ts").to_pylist())
    schema = DatasetSchema.load(str(logs / "schema.yaml"))
    assert schema.group_by == "user" and schema.labels == ["click"]
    prepare(schema, [str(logs / "period-1")], str(tmp_path / "p1"), workers=0, log=lambda s: None)
    prepare(schema, [str(logs / "period-2")], str(tmp_path / "p2"), workers=0,
            like=str(tmp_path / "p1"), log=lambda s: None)  # fmt: skip
    assert json.loads((tmp_path / "p2" / "meta.json").read_text())["rows"]["test"] > 0
    earlier, later = load_fitted(str(tmp_path / "p1")), load_fitted(str(tmp_path / "p2"))
    for name, vocab in earlier.vocabs.items():  # the first period's ids keep their rows
        assert np.array_equal(later.vocabs[name].hashes, vocab.hashes), name
    with pytest.raises(SystemExit, match="--periods 0 and --rows-per-period 400 must be >= 1"):
        synth.main(["--drift", "--periods", "0", "--rows-per-period", "400", "--out", "x"])
    for argv, said in [(["--drift", "--rows=5"], "--rows is not read with --drift"),
                       (["--periods", "2"], "--periods is not read without --drift")]:  # fmt: skip
        with pytest.raises(SystemExit):
            synth.main([*argv, "--out", str(tmp_path / "x")])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_shared_tables_column_that_changed_type_is_named_as_the_change_it_is(tmp_path):
    """The drift log's ``item`` shares its table with ``history``: cast to text in a later
    period, it is refused as the change against ``--like``'s folder (was: as a disagreement with
    ``history``, naming neither the earlier folder nor the change)."""
    from recsys.cli import synth

    logs = tmp_path / "logs"
    synth.main(["--drift", "--periods", "2", "--rows-per-period", "400", "--out", str(logs)])
    schema = DatasetSchema.load(str(logs / "schema.yaml"))
    assert schema.table_of("history") == "item"
    prepare(schema, [str(logs / "period-1")], str(tmp_path / "p1"), workers=0, log=lambda s: None)
    later = pq.read_table(logs / "period-2" / "log.parquet")
    i = later.column_names.index("item")
    later = later.set_column(i, "item", later.column("item").cast(pa.string()))
    (tmp_path / "text").mkdir()
    pq.write_table(later, tmp_path / "text" / "log.parquet")
    with pytest.raises(DataError, match=r"column 'item': string ids here, int ids in .*p1 "
                                        r"\(--like\)"):  # fmt: skip
        prepare(schema, [str(tmp_path / "text")], str(tmp_path / "p2"), workers=0,
                like=str(tmp_path / "p1"), log=lambda s: None)  # fmt: skip
    assert not (tmp_path / "p2").exists()


def test_the_unseen_ids_line_says_what_grew_and_what_is_left():
    """``--like``'s line per feature: the ids the vocabulary lacks, or, where the table grew,
    by how many rows and the ids still left to the unseen rows."""
    from recsys.cli.preprocess import unseen_lines

    counts = {"train": {"u": 30, "i": 5}, "test": {"u": 10, "i": 5}}
    ids = {"train": {"u": 300, "i": 100}, "test": {"u": 100, "i": 100}}
    meta = {"like": {"folder": "/d/w1", "grown": {"u": 7}}, "unseen": counts, "ids": ids}
    assert unseen_lines(meta) == [
        "prepare: u: its table grew by 7 rows for new ids; 40 of 400 ids (10.0%) still read its "
        "unseen rows",
        "prepare: i: 10 of 200 ids (5.0%) not in the vocabulary of /d/w1: they read its "
        "unseen rows",
    ]
