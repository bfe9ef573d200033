"""What real logs need, on the data side: missing is not unseen (row 0 missing, OOV rows for
unseen values), a vocabulary cap (``max_size``), time features derived from timestamp columns
(``derive``: hour and weekday in a time zone across a DST change, an age in buckets) and shared
tables (``table``: one vocabulary over the values of every column sharing it). Each is prepared
from raw rows into shards (``prepare(..., workers=0)``) and mapped again by serving's code in a
fresh process (``load_fitted``, ``raw_table``, ``encode``, ``tabular_batch``): the same ids. Every
bad combination is refused naming its keys and columns."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.configlib import ConfigError
from recsys.data.errors import DataError
from recsys.data.prepared.folder import load_splits
from recsys.data.schema import DatasetSchema
from recsys.prepare.ids import hash_ids
from recsys.prepare.pipeline import prepare
from recsys.prepare.values import epoch_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BERLIN = ZoneInfo("Europe/Berlin")
N = 60  # rows: 36 train, 12 validation, 12 test (split by order)
START = datetime(2026, 3, 28, 20, 0, tzinfo=UTC)  # every 15 minutes: across 2026-03-29 01:00
# UTC, when Berlin's clocks jump from 02:00 to 03:00, and across midnight in Berlin (Sunday)

SCHEMA = {
    "labels": ["y"],
    "split": {"by": "order", "val_fraction": 0.2, "test_fraction": 0.2},
    "sparse": {
        "item_id": {"max_size": 4, "oov_buckets": 16},
        "history": {"multi_hot": True, "table": "item_id"},
        "hour": {"derive": "hour", "source": "event_ts", "time_zone": "Europe/Berlin"},
        "weekday": {"derive": "weekday", "source": "event_ts", "time_zone": "Europe/Berlin"},
        "utc_hour": {"derive": "hour", "source": "event_ts"},
        "age": {"derive": "age", "source": "event_ts", "since": "published_ts", "unit": "hours",
                "buckets": [0, 1, 24]},
    },
}  # fmt: skip


def planted_log() -> dict:
    """Item ids with planted counts (training rows 0-35), lists of item ids, timestamps."""
    train_items = ["a"] * 9 + ["b"] * 6 + ["c"] * 6 + ["d"] * 5 + ["e"] * 4 + ["f"] * 2
    train_items += [None, "", None, ""]  # missing: 4 more training rows (36 in all)
    later = ["a", "new1", "new2", None, "b", "", "g", "c"] * 3  # new1/new2/g: never in training
    items = train_items + later
    history: list = [[] for _ in range(N)]
    for r in range(0, 12):  # "h" only ever in lists: 12 times, more than any item_id value
        history[r] = ["h"]
    history[12], history[13], history[14] = ["e", "e", "e"], ["e", None, ""], None
    history[15] = ["f", "f", "f", "f"]  # f: 2 + 4 = 6 in all (ties with b and c at 6)
    history[40], history[41] = ["h", "new1", None], ["g", "a"]
    times = [START + timedelta(minutes=15 * r) for r in range(N)]
    published = [t - timedelta(minutes=37 * (r % 50) - 30) for r, t in enumerate(times)]
    published[3] = published[50] = None
    return {
        "y": np.arange(N) % 2,
        "item_id": items,
        "history": history,
        "event_ts": pa.array(times, pa.timestamp("s")),
        "published_ts": pa.array(published, pa.timestamp("s")),
    }


def prepared(tmp_path, schema=SCHEMA, data=None, name="out"):
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(pa.table(data or planted_log()), path)
    out = str(tmp_path / name)
    meta = prepare(DatasetSchema.from_dict(schema), [path], out, workers=0, log=lambda s: None)
    return path, out, meta


def shard_ids(out: str, meta: dict) -> dict[str, tuple[list, list]]:
    """Per feature, all rows' ids (train, val, test in order) and lengths, from the shards."""
    splits = load_splits([out], 0, meta["table_sizes"])
    parts = [s.read(0, len(s)) for s in (splits.train, splits.val, splits.test)]
    out_ids = {}
    for f, name in enumerate(meta["feature_names"]):
        ids = np.concatenate([p.values[f] for p in parts]).astype(np.int64)
        lengths = np.concatenate([p.lengths[:, f] for p in parts]).astype(np.int64)
        out_ids[name] = (ids.tolist(), lengths.tolist())
    return out_ids


def expected_vocabulary() -> list[str]:
    """Joint training counts of item_id and history, min_count 1, the 4 most frequent, ties
    by the value's hash."""
    data = planted_log()
    counts = collections.Counter(v for v in data["item_id"][:36] if v)
    counts.update(v for lst in data["history"][:36] if lst for v in lst if v)
    hashes = dict(zip(counts, hash_ids(pa.array(list(counts)))[0].tolist(), strict=True))
    return sorted(counts, key=lambda v: (-counts[v], hashes[v]))[:4]


SERVE = """
import sys
import numpy as np
import pyarrow.parquet as pq
from recsys.prepare.encode import encode
from recsys.prepare.like import load_fitted
from recsys.serving.scorer import raw_table, tabular_batch

folder, raw, dest = sys.argv[1:4]
fitted = load_fitted(folder)
frame = pq.read_table(raw).to_pandas().drop(columns=["y"])
enc = encode(raw_table(frame, fitted), fitted, with_labels=False)
kjt = tabular_batch(frame, fitted, fitted.table_sizes()).sparse_features.to_dict()
arrays = {}
for name in fitted.schema.sparse:
    arrays["ids." + name] = enc.ids[name]
    arrays["kjt." + name] = kjt[name].values().numpy()
    arrays["len." + name] = kjt[name].lengths().numpy()
np.savez(dest, sizes=np.array(fitted.table_sizes()), **arrays)
"""


def served_in_a_fresh_process(tmp_path, out: str, raw: str) -> dict[str, np.ndarray]:
    dest = str(tmp_path / "served.npz")
    r = subprocess.run([sys.executable, "-c", SERVE, out, raw, dest], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(dest) as f:
        return dict(f)


def test_prepared_and_served_ids_agree_in_a_fresh_process(tmp_path):
    """Shared table + time features + max_size + oov_buckets, prepared, then served by a fresh
    process from the prepared folder: every feature's ids are the shards' ids."""
    raw, out, meta = prepared(tmp_path)
    served = served_in_a_fresh_process(tmp_path, out, raw)
    assert served["sizes"].tolist() == meta["table_sizes"] == [21, 21, 25, 8, 25, 5]
    stored = shard_ids(out, meta)
    for name in meta["feature_names"]:
        ids, lengths = stored[name]
        assert served[f"ids.{name}"].tolist() == ids, name
        assert served[f"kjt.{name}"].tolist() == ids, name
        assert served[f"len.{name}"].tolist() == lengths, name
    # the hours as the Berlin wall clock reads them, by the standard library
    times = [START + timedelta(minutes=15 * r) for r in range(N)]
    assert stored["hour"][0] == [1 + t.astimezone(BERLIN).hour for t in times]
    assert stored["weekday"][0] == [1 + t.astimezone(BERLIN).weekday() for t in times]
    assert stored["utc_hour"][0] == [1 + t.hour for t in times]


def test_missing_and_unseen_values_have_rows_of_their_own(tmp_path):
    _, out, meta = prepared(tmp_path)
    vocab = expected_vocabulary()
    assert vocab[:3] == ["h", "a", "e"]  # then one of b, c, f (6 each): by hash
    stored = np.load(os.path.join(out, meta["vocab"]["item_id"]))
    assert stored.tolist() == hash_ids(pa.array(vocab))[0].tolist()
    assert meta["features"]["item_id"]["rows"] == {
        "missing": 0,
        "unseen": [1, 16],
        "vocabulary": [17, 20],
    }
    ids = shard_ids(out, meta)["item_id"][0]
    items = planted_log()["item_id"]
    row_of = {v: 17 + k for k, v in enumerate(vocab)}
    oov = {v: 1 + int(h) % 16 for v, h in zip(items, hash_ids(pa.array(items))[0], strict=True)}
    expected = [0 if not v else row_of.get(v, oov[v]) for v in items]
    assert ids == expected
    assert all(ids[r] == 0 for r, v in enumerate(items) if not v)  # null and "": row 0
    assert 1 <= oov["new1"] <= 16 and 1 <= oov["new2"] <= 16
    assert oov["new1"] != oov["new2"]  # two unseen values, two rows
    assert ids[items.index("new1")] == oov["new1"] and ids[items.index("new2")] == oov["new2"]
    # null and "" inside a list are row 0 too; the list keeps its length
    history, lengths = shard_ids(out, meta)["history"]
    assert lengths[13] == 3 and lengths[14] == 0
    start = sum(lengths[:13])
    assert history[start : start + 3] == [row_of.get("e", oov["e"]), 0, 0]


def test_max_size_keeps_exactly_the_most_frequent_values(tmp_path):
    """Planted counts with ties at the cap: a 7, b c d 5, e 4, f 2, g 1; min_count 2 drops g,
    max_size 3 keeps a and the two of b, c, d with the smaller hashes."""
    counts = {"a": 7, "b": 5, "c": 5, "d": 5, "e": 4, "f": 2, "g": 1}
    items = [v for v, c in counts.items() for _ in range(c)]
    data = {"y": np.arange(len(items)) % 2, "item_id": items}
    schema = {"labels": ["y"], "split": {"val_fraction": 0.0, "test_fraction": 0.0},
              "sparse": {"item_id": {"min_count": 2, "max_size": 3}}}  # fmt: skip
    _, out, meta = prepared(tmp_path, schema, data)
    hashes = dict(zip(counts, hash_ids(pa.array(list(counts)))[0].tolist(), strict=True))
    tied = sorted("bcd", key=lambda v: hashes[v])
    kept = ["a", *tied[:2]]
    assert np.load(os.path.join(out, meta["vocab"]["item_id"])).tolist() == [
        hashes[v] for v in kept
    ]
    assert meta["table_sizes"] == [5]  # missing, unseen, 3 values
    row = {v: 2 + k for k, v in enumerate(kept)}
    assert shard_ids(out, meta)["item_id"][0] == [row.get(v, 1) for v in items]


def test_a_shared_table_counts_every_column_and_gives_a_value_one_row(tmp_path):
    _, out, meta = prepared(tmp_path)
    assert meta["shared"] == {"history": "item_id"}
    assert meta["vocab"]["history"] == meta["vocab"]["item_id"]
    assert sorted(os.listdir(os.path.join(out, "vocab"))) == ["sparse_0.npy"]  # one table
    assert meta["table_sizes"][0] == meta["table_sizes"][1] == 1 + 16 + 4
    assert meta["features"]["history"]["table"] == "item_id"
    vocab = expected_vocabulary()
    assert vocab[0] == "h"  # only ever in history's lists, yet the most frequent value
    assert vocab[2] == "e"  # 4 in item_id (fewer than b, c, d) + 4 in history lists
    row_of = {v: 17 + k for k, v in enumerate(vocab)}
    stored = shard_ids(out, meta)
    history, lengths = stored["history"]
    assert history[:12] == [row_of["h"]] * 12 and lengths[:12] == [1] * 12
    items = stored["item_id"][0]
    start = sum(lengths[:41])
    assert history[start : start + 2] == [items[42], items[36]]  # g, a: as item_id has them
    assert items[36] == row_of["a"] and 1 <= items[42] <= 16  # a known value, an unseen one


def test_a_shared_table_with_integer_and_string_ids_is_refused(tmp_path):
    data = {"y": [0, 1], "item_id": [1, 2], "history": [["1"], ["2"]]}
    schema = {
        "labels": ["y"],
        "split": {"val_fraction": 0.0, "test_fraction": 0.0},
        "sparse": {"item_id": {}, "history": {"multi_hot": True, "table": "item_id"}},
    }
    with pytest.raises(DataError, match=r"columns 'item_id' \(int ids\) and 'history' \(string "
                       r"ids\) share table 'item_id'"):  # fmt: skip
        prepared(tmp_path, schema, data)


def test_time_features_across_both_dst_changes_and_ages_in_buckets(tmp_path):
    """Berlin's clocks in spring (02:00 -> 03:00) and autumn (03:00 -> 02:00); an event after
    midnight in Berlin is the next weekday there; ages by the edges, side right."""
    utc = [
        "2026-03-29T00:30:00Z",  # 01:30 CET
        "2026-03-29T01:30:00Z",  # 03:30 CEST (02:xx never happens)
        "2026-10-25T00:30:00Z",  # 02:30 CEST
        "2026-10-25T01:30:00Z",  # 02:30 CET (the hour again)
        "2026-03-29T22:30:00Z",  # Monday 00:30 in Berlin, Sunday in UTC
        "2026-03-29T12:00:00Z",
    ]
    times = [datetime.fromisoformat(t) for t in utc]
    since = [
        times[0] - timedelta(hours=1),
        times[1] + timedelta(hours=2),
        times[2] - timedelta(hours=24),
        None,
        times[4] - timedelta(minutes=59),
        times[5],
    ]
    data = {"y": [0, 1] * 3, "event_ts": pa.array(times, pa.timestamp("s", tz="UTC")),
            "published_ts": pa.array(since, pa.timestamp("ms")), "item_id": ["x"] * 6}  # fmt: skip
    schema = {**SCHEMA, "split": {"by": "order", "val_fraction": 0.0, "test_fraction": 0.0}}
    schema["sparse"] = {k: v for k, v in SCHEMA["sparse"].items() if k != "history"}
    raw, out, meta = prepared(tmp_path, schema, data)
    stored = shard_ids(out, meta)
    assert stored["hour"][0] == [1 + h for h in (1, 3, 2, 2, 0, 14)]
    assert stored["weekday"][0] == [1 + d for d in (6, 6, 6, 6, 0, 6)]  # Monday is 0
    assert stored["utc_hour"][0] == [1 + h for h in (0, 1, 0, 1, 22, 12)]
    # age in hours, edges [0, 1, 24]: 1 -> row 3, -2 -> row 1, 24 -> row 4, missing -> 0,
    # 59 minutes -> row 2, 0 -> row 2
    assert stored["age"][0] == [3, 1, 4, 0, 2, 2]
    assert meta["features"]["age"]["rows"] == {"missing": 0, "buckets": [1, 4]}
    served = served_in_a_fresh_process(tmp_path, out, raw)
    for name in ("hour", "weekday", "utc_hour", "age"):
        assert served[f"ids.{name}"].tolist() == stored[name][0]


def test_timestamps_of_every_kind_are_the_same_instants():
    """Parquet timestamps in any unit (with a zone or without: UTC), dates, epoch seconds and
    ISO text with and without an offset all read as the same seconds since 1970 UTC."""
    t = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    s = t.timestamp()
    arrays = [
        pa.array([t, None], pa.timestamp("ns", tz="Europe/Berlin")),
        pa.array([t.replace(tzinfo=None), None], pa.timestamp("us")),
        pa.array([int(s), None], pa.int64()),
        pa.array([s, None], pa.float64()),
        pa.array(["2026-03-29T03:30:00+02:00", ""]),
        pa.array(["2026-03-29 01:30:00", None]),
        pa.array([str(int(s)), " "]),
    ]
    for arr in arrays:
        values, missing, bad = epoch_seconds(arr)
        assert values[0] == s and missing.tolist() == [False, True] and not bad.any(), arr.type
    day = epoch_seconds(pa.array([t.date()], pa.date32()))[0]
    assert day.tolist() == [s - 5400]
    _, _, bad = epoch_seconds(pa.array(["yesterday", "1.7e12", "2026-13-01"]))
    assert bad.tolist() == [True, True, True]  # not a time; milliseconds; no such month


def test_a_bad_timestamp_is_named_by_file_column_and_row(tmp_path):
    data = planted_log()
    data["published_ts"] = ["2026-01-01T00:00:00"] * 7 + ["soon"] + ["2026-01-01"] * (N - 8)
    with pytest.raises(DataError, match=r"out.parquet: column 'published_ts', row 7: a derived "
                       r"feature's timestamp column needs .*\(got 'soon'\)"):  # fmt: skip
        prepared(tmp_path, SCHEMA, data)
    _, _, meta = prepared(tmp_path, {**SCHEMA, "on_bad_row": "skip"}, data, name="skip")
    assert meta["skipped"] == {"published_ts": 1} and sum(meta["rows"].values()) == N - 1


def test_serving_needs_the_timestamp_columns_not_the_derived_names(tmp_path):
    from recsys.prepare.like import load_fitted
    from recsys.serving.scorer import raw_table

    raw, out, _ = prepared(tmp_path)
    fitted = load_fitted(out)
    frame = pq.read_table(raw).to_pandas()
    with pytest.raises(ValueError, match=r"input lacks the schema's columns \['published_ts'\]"):
        raw_table(frame.drop(columns=["published_ts"]), fitted)
    frame["event_ts"] = frame["event_ts"].astype(object)
    frame.loc[2, "event_ts"] = "never"
    with pytest.raises(ValueError, match=r"column 'event_ts'"):
        raw_table(frame, fitted)
    ok = (
        pq.read_table(raw)
        .to_pandas()
        .assign(event_ts=lambda f: f["event_ts"].astype("int64") // 10**9)
    )  # epoch seconds serve the same
    table = raw_table(ok, fitted)
    assert pa.types.is_integer(table.column("event_ts").type)


def test_the_demo_schema_uses_time_features_and_its_history_holds_item_ids():
    from recsys.demo.clicklogs import ClickLogs, Shape

    schema = DatasetSchema.load(os.path.join(ROOT, "schemas", "clicklogs.yaml"))
    assert schema.derived == ["event_hour", "event_weekday", "item_age"]
    assert schema.timestamps() == ["event_ts", "published_ts"]
    assert "published_ts" in schema.columns() and "event_hour" not in schema.columns()
    table = ClickLogs(500, 0, Shape(users=50, items=40)).block(0)
    items = set(table.column("item_id").to_pylist())
    history = {v for lst in table.column("history").to_pylist() for v in lst}
    assert history <= {f"i{k}" for k in range(40)} and len(items & history) > 10


def test_the_demo_log_is_written_as_the_files_asked_the_same_rows_however_split(tmp_path):
    """``recsys-synth --files N``: N files of as many rows each as can be, a generator block
    split over two where it must (a count that left a file empty failed, and one above the
    blocks wrote fewer files); together the rows of one file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.demo.clicklogs import BLOCK, Shape, write

    shape, rows = Shape(users=50, items=40), 2 * BLOCK + 10
    one = pq.read_table(write(str(tmp_path / "one"), rows, 1, 3, shape)[0])
    for files in (3, 7):
        paths = write(str(tmp_path / f"in{files}"), rows, files, 3, shape)
        counts = [pq.read_metadata(p).num_rows for p in paths]
        assert len(paths) == files and sum(counts) == rows and max(counts) - min(counts) <= 1
        whole = pa.concat_tables([pq.read_table(p) for p in paths]).combine_chunks()
        assert whole.cast(one.schema).equals(one.combine_chunks())
    with pytest.raises(ValueError, match="--files 5: more files than --rows 4"):
        write(str(tmp_path / "few"), 4, 5, 0, shape)


# ---------------------------------------------------------------------------------------------
# Refused at schema load, naming the keys and columns


def schema_with(**sparse) -> dict:
    return {"labels": ["y"], "sparse": {"item_id": {}, **sparse}}


REFUSED = [
    (schema_with(c={"hash_buckets": 8, "oov_buckets": 4}),
     r"sparse\.c\.oov_buckets=4: not with sparse\.c\.hash_buckets"),
    (schema_with(c={"hash_buckets": 8, "identity": True, "oov_buckets": 4}),
     r"sparse\.c\.oov_buckets=4: not with sparse\.c\.identity"),
    (schema_with(c={"hash_buckets": 8, "max_size": 4}),
     r"sparse\.c\.max_size=4: not with sparse\.c\.hash_buckets"),
    (schema_with(c={"hash_buckets": 8, "identity": True, "max_size": 4}),
     r"sparse\.c\.max_size=4: not with sparse\.c\.identity"),
    (schema_with(c={"max_size": 0}), r"sparse\.c\.max_size=0: must be >= 1"),
    (schema_with(c={"oov_buckets": 0}), r"sparse\.c\.oov_buckets=0: must be >= 1"),
    (schema_with(c={"source": "ts"}), r"sparse\.c\.source='ts': only with derive"),
    (schema_with(h={"derive": "hour"}), r"sparse\.h\.source=None: derive: hour needs a column"),
    (schema_with(h={"derive": "hour", "source": "ts", "time_zone": "Europe/Berln"}),
     r"sparse\.h\.time_zone='Europe/Berln': not an IANA time zone"),
    (schema_with(h={"derive": "hour", "source": "ts", "since": "p"}),
     r"sparse\.h\.since='p': only with derive: age"),
    (schema_with(h={"derive": "hour", "source": "ts", "buckets": [1]}),
     r"sparse\.h\.buckets=\[1\.0\]: only with derive: age"),
    (schema_with(a={"derive": "age", "source": "ts", "unit": "days", "buckets": [1]}),
     r"sparse\.a\.since=None: derive: age needs it"),
    (schema_with(a={"derive": "age", "source": "ts", "since": "p", "buckets": [1]}),
     r"sparse\.a\.unit=None: derive: age needs it"),
    (schema_with(a={"derive": "age", "source": "ts", "since": "p", "unit": "days"}),
     r"sparse\.a\.buckets=None: derive: age needs it"),
    (schema_with(a={"derive": "age", "source": "ts", "since": "p", "unit": "days",
                    "buckets": [7, 1]}), r"sparse\.a\.buckets=\[7\.0, 1\.0\]: needs finite"),
    (schema_with(a={"derive": "age", "source": "ts", "since": "p", "unit": "weeks",
                    "buckets": [1]}), r"sparse\.a\.unit='weeks': not one of"),
    (schema_with(a={"derive": "age", "source": "ts", "since": "p", "unit": "days",
                    "buckets": [1], "time_zone": "UTC"}), r"sparse\.a\.time_zone='UTC': not with"),
    (schema_with(h={"derive": "minute", "source": "ts"}), r"sparse\.h\.derive='minute'"),
    (schema_with(ts={"derive": "hour", "source": "ts"}),
     r"sparse\.ts='ts': a derived feature's name must not be a column the schema reads \(its own "
     r"source\)"),
    (schema_with(y={"derive": "hour", "source": "ts"}),
     r"sparse\.y='y': a derived feature's name must not be a column the schema reads \(labels\)"),
    (schema_with(h={"derive": "hour", "source": "y"}), r"sparse\.h\.source='y': is a label"),
    (schema_with(h={"derive": "hour", "source": "l"}, l={"multi_hot": True}),
     r"sparse\.h\.source='l': is a multi-hot column"),
    (schema_with(h={"derive": "hour", "source": "ts"}, g={"derive": "hour", "source": "h"}),
     r"sparse\.g\.source='h': is a derived feature"),
    (schema_with(h={"table": "h"}), r"sparse\.h\.table='h': names the column itself"),
    (schema_with(h={"table": "itemid"}), r"sparse\.h\.table='itemid': not a sparse column"),
    (schema_with(h={"table": "item_id"}, g={"table": "h"}),
     r"sparse\.g\.table='h': sparse\.h uses sparse\.item_id's table itself"),
    (schema_with(d={"derive": "hour", "source": "ts"}, h={"table": "d"}),
     r"sparse\.h\.table='d': sparse\.d is derived"),
    (schema_with(h={"multi_hot": True, "table": "item_id", "min_count": 3}),
     r"sparse\.h\.min_count=3: sparse\.h shares sparse\.item_id's table, whose vocabulary keys "
     r"are sparse\.item_id's \(min_count=1\)"),
    (schema_with(h={"table": "item_id", "hash_buckets": 10}),
     r"sparse\.h\.hash_buckets=10: sparse\.h shares sparse\.item_id's table"),
    (schema_with(h={"multi_hot": True, "table": "item_id"},
                 g={"multi_hot": True, "table": "item_id", "pooling": "mean"}),
     r"sparse\.g\.pooling='mean': sparse\.g and sparse\.h share a table \(item_id\) but pool "
     r"differently"),
]  # fmt: skip
DERIVED_REFUSED = ["min_count", "max_size", "oov_buckets", "hash_buckets", "multi_hot", "table",
                   "hex", "identity", "max_len", "pooling"]  # fmt: skip
VALUES = {
    "min_count": 2,
    "max_size": 5,
    "oov_buckets": 3,
    "hash_buckets": 9,
    "multi_hot": True,
    "table": "item_id",
    "hex": True,
    "identity": True,
    "max_len": 3,
    "pooling": "mean",
}


@pytest.mark.parametrize("schema, message", REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_a_bad_combination_is_refused_naming_its_keys(schema, message):
    with pytest.raises(ConfigError, match=message):
        DatasetSchema.from_dict(schema, "s.yaml")


@pytest.mark.parametrize("key", DERIVED_REFUSED)
def test_a_derived_feature_refuses_the_keys_of_ids(key):
    spec = {"derive": "weekday", "source": "ts", key: VALUES[key]}
    with pytest.raises(ConfigError, match=rf"sparse\.w\.{key}=.*not on a derived feature "
                       r"\(sparse\.w\.derive=weekday\)"):  # fmt: skip
        DatasetSchema.from_dict(schema_with(w=spec))


def test_the_schema_says_which_table_each_column_uses():
    s = DatasetSchema.from_dict(schema_with(
        history={"multi_hot": True, "table": "item_id", "pooling": "mean", "min_count": 1},
        last={"table": "item_id"}, tags={"multi_hot": True},
        hour={"derive": "hour", "source": "ts"},
    ))  # fmt: skip
    assert s.shared() == {"history": "item_id", "last": "item_id"}
    assert [s.table_of(n) for n in s.sparse] == ["item_id", "item_id", "item_id", "tags", "hour"]
    assert s.table_pooling("item_id") == s.table_pooling("last") == "mean"  # history's
    assert s.table_pooling("tags") == "sum"
    assert s.roles()["sparse"] == ["item_id", "history", "last", "tags"]
    assert s.roles()["timestamps"] == ["ts"] and s.serving_columns() == [*s.roles()["sparse"], "ts"]
    owner = DatasetSchema.from_dict(
        schema_with(h={"table": "item_id"})
        | {"sparse": {"item_id": {"hex": True, "min_count": 2}, "h": {"table": "item_id"}}}
    )
    assert owner.id_spec("h").hex and owner.id_spec("h").min_count == 2
    assert DatasetSchema.from_dict(s.to_dict()) == s


def test_hashed_columns_keep_row_zero_for_missing_values(tmp_path):
    data = {"y": [0, 1, 0, 1], "c": ["x", None, "", "y"], "u": [3, None, 12, 5]}
    schema = {
        "labels": ["y"],
        "split": {"by": "order", "val_fraction": 0.0, "test_fraction": 0.0},
        "sparse": {"c": {"hash_buckets": 10}, "u": {"identity": True, "hash_buckets": 10}},
    }
    _, out, meta = prepared(tmp_path, schema, data)
    assert meta["table_sizes"] == [11, 10]
    h = hash_ids(pa.array(["x", "y"]))[0]
    assert shard_ids(out, meta)["c"][0] == [1 + int(h[0]) % 10, 0, 0, 1 + int(h[1]) % 10]
    assert shard_ids(out, meta)["u"][0] == [3, 0, 2, 5]  # identity: missing shares row 0
    assert meta["features"]["c"]["rows"] == {"missing": 0, "hashed": [1, 10]}
    assert meta["features"]["u"]["rows"] == {"missing": 0, "identity": [0, 9]}


def test_a_frame_of_iso_text_serves_as_the_timestamps_it_writes(tmp_path):
    from recsys.prepare.encode import encode
    from recsys.prepare.like import load_fitted
    from recsys.serving.scorer import raw_table

    raw, out, meta = prepared(tmp_path)
    fitted = load_fitted(out)
    frame = pq.read_table(raw).to_pandas()
    texts = frame.assign(
        event_ts=[t.tz_localize("UTC").tz_convert("America/New_York").isoformat()
                  for t in frame["event_ts"]],
        published_ts=[None if pd.isna(t) else t.isoformat() for t in frame["published_ts"]],
    )  # fmt: skip
    a = encode(raw_table(frame, fitted), fitted, with_labels=False)
    b = encode(raw_table(texts, fitted), fitted, with_labels=False)
    for name in ("hour", "weekday", "utc_hour", "age"):
        assert a.ids[name].tolist() == b.ids[name].tolist() == shard_ids(out, meta)[name][0]


# ---------------------------------------------------------------------------------------------
# Weighted lists: a list column's parallel weight column, cut and served with its ids

WEIGHTED = {
    "labels": ["y"],
    "split": {"by": "order", "val_fraction": 0.25, "test_fraction": 0.25},
    "sparse": {
        "item_id": {},
        "history": {"multi_hot": True, "max_len": 2, "table": "item_id", "weights": "dwell"},
    },
}
HISTORY = [["a", "b", "c"], ["b"], [], None, ["c", "a"], ["a", None], ["b", "b", "b"], ["c"]]
DWELL = [[0.5, 1.5, 9.0], [2.0], [], None, [3.0, 0.25], [4.0, 1.0], [1.0, 2.0, 3.0], [7.5]]


def weighted_log(**change) -> dict:
    data = {"y": np.arange(8) % 2, "item_id": list("abcabcab"), "history": list(HISTORY),
            "dwell": list(DWELL)}  # fmt: skip
    for k, v in change.items():
        data[k] = v
    return data


WEIGHTS_SERVED = """
import sys
import numpy as np
import pyarrow.parquet as pq
from recsys.prepare.like import load_fitted
from recsys.serving.scorer import tabular_batch

folder, raw, dest = sys.argv[1:4]
fitted = load_fitted(folder)
frame = pq.read_table(raw).to_pandas().drop(columns=["y"])
kjt = tabular_batch(frame, fitted, fitted.table_sizes()).sparse_features
np.savez(dest, ids=kjt["history"].values().numpy(), weights=kjt["history"].weights().numpy(),
         item_weights=kjt["item_id"].weights().numpy())
"""


def test_a_weighted_list_keeps_its_weights_cut_with_its_ids_and_served_alike(tmp_path):
    """The weights are written beside the ids (``list_j.weights``), cut by ``max_len`` as the
    ids are, read back into the loader's weighted KJT, and a fresh serving process builds the
    same weighted KJT from the raw rows (the item_id feature weighing 1)."""
    raw, out, meta = prepared(tmp_path, WEIGHTED, weighted_log(), name="w")
    splits = load_splits([out], 0, meta["table_sizes"])
    parts = [s.read(0, len(s)) for s in (splits.train, splits.val, splits.test)]
    stored = np.concatenate([p.weights[1] for p in parts]).tolist()
    assert stored == [0.5, 1.5, 2.0, 3.0, 0.25, 4.0, 1.0, 1.0, 2.0, 7.5]  # lists cut to 2
    assert all(p.weights[0] is None for p in parts)
    dest = str(tmp_path / "w.npz")
    r = subprocess.run([sys.executable, "-c", WEIGHTS_SERVED, out, raw, dest], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(dest) as served:
        assert served["weights"].tolist() == stored
        assert served["ids"].tolist() == np.concatenate([p.values[1] for p in parts]).tolist()
        assert served["item_weights"].tolist() == [1.0] * 8


@pytest.mark.parametrize(
    "change, row, why",
    [
        ({"dwell": [*DWELL[:5], [4.0], *DWELL[6:]]}, 5, "as many weights as history has ids"),
        ({"dwell": [*DWELL[:1], None, *DWELL[2:]]}, 1, "as many weights as history has ids"),
        ({"dwell": [*DWELL[:6], [1.0, None, 3.0], *DWELL[7:]]}, 6, "finite numbers"),
        ({"dwell": [*DWELL[:7], [float("inf")]]}, 7, "finite numbers"),
    ],
    ids=["shorter", "missing", "null weight", "inf"],
)
def test_a_bad_weight_list_is_named_by_file_column_and_row(tmp_path, change, row, why):
    with pytest.raises(DataError, match=rf"column 'dwell', row {row}: .*{why}"):
        prepared(tmp_path, WEIGHTED, weighted_log(**change), name="bad")


def test_serving_names_a_weight_list_that_does_not_fit_its_ids(tmp_path):
    from recsys.prepare.like import load_fitted
    from recsys.serving.scorer import tabular_batch

    raw, out, _ = prepared(tmp_path, WEIGHTED, weighted_log(), name="w")
    frame = pq.read_table(raw).to_pandas().drop(columns=["y"])
    fitted = load_fitted(out)
    frame.at[4, "dwell"] = [3.0]
    with pytest.raises(ValueError, match=r"column 'dwell', row 4: .*as many weights as history"):
        tabular_batch(frame, fitted, fitted.table_sizes())
    with pytest.raises(ValueError, match=r"lacks the schema's columns \['dwell'\]"):
        tabular_batch(frame.drop(columns=["dwell"]), fitted, fitted.table_sizes())


WEIGHTS_REFUSED = [
        ({"item_id": {"weights": "w"}}, r"sparse\.item_id\.weights='w': .*only with multi_hot"),
        ({"h": {"multi_hot": True, "pooling": "mean", "weights": "w"}},
         r"sparse\.h\.weights='w': a weighted list pools by sum"),
        ({"h": {"multi_hot": True, "weights": "w"}, "t": {"multi_hot": True, "pooling": "mean"}},
         r"sparse\.t\.pooling='mean': with a weighted list \(sparse\.h\.weights\) every table "
         r"pools by sum"),
        ({"h": {"multi_hot": True, "weights": "item_id"}}, r"item_id.*already used as sparse"),
        ({"h": {"derive": "hour", "source": "ts", "weights": "w"}},
         r"sparse\.h\.weights='w': not on a derived feature"),
]  # fmt: skip


WEIGHTS_IDS = ["one-hot", "mean", "mean elsewhere", "a feature", "derived"]


@pytest.mark.parametrize("sparse, message", WEIGHTS_REFUSED, ids=WEIGHTS_IDS)
def test_weights_in_a_schema_that_cannot_use_them_are_refused(sparse, message):
    with pytest.raises(ConfigError, match=message):
        DatasetSchema.from_dict({"labels": ["y"], "sparse": {"item_id": {}, **sparse}})


def test_the_served_signature_takes_weights_as_python_floats_or_float32(tmp_path):
    """The MLflow model's signature comes from ``examples.parquet`` (float32 weights): its
    example has them as float64 lists, so a caller's Python floats and float32 arrays both pass
    MLflow's input check."""
    from mlflow.models import infer_signature
    from mlflow.models.utils import _enforce_schema

    from recsys.serving.mlflow_model import serving_example

    data = weighted_log(dwell=pa.array(DWELL, pa.list_(pa.float32())))  # as the demo's
    _, out, _ = prepared(tmp_path, WEIGHTED, data, name="w")
    example = serving_example(out)
    schema = infer_signature(example).inputs
    rows = pd.DataFrame({"item_id": ["a", "zz"], "history": [["a", "b"], []],
                         "dwell": [[1.0, 0.9], []]})  # fmt: skip
    assert _enforce_schema(rows, schema)["dwell"].tolist() == [[1.0, 0.9], []]
    rows["dwell"] = [np.array([1.0, 0.9], np.float32), np.zeros(0, np.float32)]
    _enforce_schema(rows, schema)


def test_a_csv_logs_lists_are_lists_in_the_served_example(tmp_path):
    """A CSV file's lists are text joined by the separator; the served model's input example
    (``examples.parquet``, its signature) holds them as lists, and serving maps them as the
    Parquet file's lists (was: each text split into characters, weights refused)."""
    import pyarrow.csv

    from recsys.prepare.like import load_fitted
    from recsys.serving.mlflow_model import serving_example
    from recsys.serving.scorer import tabular_batch

    def joined(rows):
        return ["" if v is None else "|".join("" if x is None else str(x) for x in v) for v in rows]

    data = {**weighted_log(), "history": joined(HISTORY), "dwell": joined(DWELL)}
    pyarrow.csv.write_csv(pa.table(data), tmp_path / "log.csv")
    out = str(tmp_path / "csv")
    schema = DatasetSchema.from_dict({**WEIGHTED, "format": "csv"})
    prepare(schema, [str(tmp_path / "log.csv")], out, workers=0, log=lambda s: None)
    example = serving_example(out)
    assert list(example["history"][0]) == ["a", "b", "c"] and len(example["history"][2]) == 0
    assert example["dwell"][0] == [0.5, 1.5, 9.0]
    fitted = load_fitted(out)
    kjt = tabular_batch(example, fitted, fitted.table_sizes()).sparse_features
    assert kjt["history"].lengths().tolist() == [2, 1, 0, 0, 2]  # cut by max_len 2
    assert kjt["history"].weights().tolist() == [0.5, 1.5, 2.0, 3.0, 0.25]


def test_the_served_signature_names_every_column_when_the_examples_lists_are_all_empty(tmp_path):
    """A log's first rows may all have empty histories (the drift demo's first period does);
    MLflow cannot infer a list's element type from empty lists and made the whole input ``Any``.
    The signature is inferred with one element in such a column (weights as floats, whatever
    the file's type), and it then takes rows with empty and full lists alike."""
    from mlflow.models import infer_signature
    from mlflow.models.utils import _enforce_schema

    from recsys.serving.mlflow_model import serving_example, signature_rows

    empty = [[] for _ in range(6)] + [["a"], ["b", "c"]]
    dwell = pa.array([[] for _ in range(6)] + [[1], [2, 3]], pa.list_(pa.int64()))  # integers
    data = weighted_log(history=empty, dwell=dwell)
    _, out, _ = prepared(tmp_path, WEIGHTED, data, name="e")
    example = serving_example(out)
    assert not any(len(v) for v in example["history"])  # the file's first rows: all empty
    schema = infer_signature(signature_rows(example, out)).inputs
    assert schema.input_names() == ["item_id", "history", "dwell"]
    assert not any(len(v) for v in example["history"])  # the example itself as it was
    rows = pd.DataFrame({"item_id": ["a", "zz"], "history": [["a", "b"], []],
                         "dwell": [[1.5, 0.5], []]})  # fmt: skip
    assert _enforce_schema(rows, schema)["dwell"].tolist() == [[1.5, 0.5], []]
