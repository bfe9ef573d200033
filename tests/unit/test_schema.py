"""The dataset schema: the shipped one parses; every bad key or value is refused naming it."""

from __future__ import annotations

import pytest

from recsys.configlib import ConfigError
from recsys.data.schema import DatasetSchema
from tests.conftest import SCHEMA

GOOD = {
    "labels": ["click", "like"],
    "time": "ts",
    "dense": {"price": {"transform": "log1p"}, "age": None},
    "sparse": {"user_id": {}, "history": {"multi_hot": True, "max_len": 5}},
}


def test_the_shipped_schema_parses_in_order():
    s = DatasetSchema.load(SCHEMA)
    assert s.labels == ["click", "like"] and s.time == "event_ts"
    assert list(s.dense) == ["price", "age"]
    assert list(s.sparse) == ["user_id", "item_id", "country", "history", "tags", "event_hour",
                              "event_weekday", "item_age"]  # fmt: skip
    assert s.multi_hot == ["history", "tags"]
    assert s.derived == ["event_hour", "event_weekday", "item_age"]
    assert s.sparse["event_hour"].time_zone == "Europe/Berlin" and s.sparse["item_age"].rows == 7
    assert s.columns() == ["click", "like", "event_ts", "price", "age", "user_id", "item_id",
                           "country", "history", "tags", "history_weights",
                           "published_ts"]  # fmt: skip
    assert s.sparse["tags"].pooling == "sum" and s.sparse["history"].max_len == 50
    assert s.shared() == {"history": "item_id"} and s.weighted == ["history"]
    assert s.sparse["item_id"].max_size == 4000 and s.sparse["user_id"].oov_buckets == 8
    assert s.sparse["country"].hash_buckets == 64 and s.dense["age"].fill == 45
    assert DatasetSchema.from_dict(s.to_dict()) == s


def test_an_empty_column_entry_takes_the_defaults():
    s = DatasetSchema.from_dict(GOOD)
    assert s.dense["age"].transform == "none" and s.sparse["user_id"].min_count == 1


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"sparse": {"history": {"multi_hot": True, "max_lne": 5}}}, "did you mean 'max_len'"),
        ({"dense": {"price": {"transfrom": "log1p"}}}, "did you mean 'transform'"),
        ({"lables": ["click"]}, "did you mean 'labels'"),
        ({"dense": {"price": {"transform": "log"}}}, "log1p"),
        ({"labels": []}, "at least one label"),
        ({"sparse": {}}, "at least one id column"),
        ({"split": {"by": "time"}, "time": None}, "needs a time column"),
        ({"split": {"by": "order"}}, "splits by time"),
        ({"split": {"by": "files"}, "time": None}, "split.by=files names files"),
        ({"split": {"test_files": ["d*"]}, "time": None}, "only with split.by=files"),
        ({"csv": {"delimiter": "\t"}}, "only with format: csv"),
        ({"format": "csv", "csv": {"header": False}}, "name the columns"),
        ({"format": "csv", "csv": {"header": False, "columns": ["click"]}}, "lacks columns"),
        ({"format": "csv", "csv": {"columns": ["a"]}}, "only with csv.header: false"),
        ({"sparse": {"user_id": {"identity": True}}}, "identity ids need hash_buckets"),
        ({"sparse": {"price": {}}}, "already used as dense"),
        ({"time": "click"}, "already used as labels"),
        ({"sparse": {"user_id": {"min_count": 0}}}, "min_count"),
        ({"sparse": {"user_id": {"pooling": "max"}}}, "pooling"),
        ({"split": {"val_fraction": 0.5, "test_fraction": 0.5}}, "leaves no training"),
        ({"format": "json"}, "format"),
        ({"group_by": "click"}, "group_by='click': is a label"),
        ({"group_by": "history"}, "is a multi-hot column: a row's group is one value"),
        ({"group_by": ""}, "name a column, or leave group_by out"),
        (
            {
                "format": "csv",
                "csv": {
                    "header": False,
                    "columns": ["click", "like", "ts", "price", "age", "user_id", "history"],
                },
                "group_by": "session",
            },
            "lacks columns",
        ),
    ],
)
def test_bad_schemas_are_refused_naming_the_key(change, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        DatasetSchema.from_dict({**GOOD, **change}, "s.yaml")


def test_a_group_column_is_read_once_whatever_else_it_is():
    """``group_by``: a feature's column (read once) or a column of its own (read too)."""
    assert DatasetSchema.from_dict({**GOOD, "group_by": "user_id"}).columns().count("user_id") == 1
    own = DatasetSchema.from_dict({**GOOD, "group_by": "session"})
    assert own.columns()[-1] == "session" and "session" not in own.sparse
    assert DatasetSchema.from_dict(own.to_dict()).group_by == "session"


def test_a_schema_file_that_is_missing_or_not_yaml_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such schema file"):
        DatasetSchema.load(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels: [click\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        DatasetSchema.load(str(bad))


def test_a_log_of_ids_only_needs_no_numeric_column():
    s = DatasetSchema.from_dict({**GOOD, "dense": {}})
    assert s.dense == {} and s.columns() == ["click", "like", "ts", "user_id", "history"]


@pytest.mark.parametrize("name, split", [("criteo_kaggle", "order"), ("criteo_terabyte", "files")])
def test_the_shipped_criteo_schemas_load_by_name(name, split):
    s = DatasetSchema.load(name)
    assert s.format == "csv" and s.csv.delimiter == "\t" and not s.csv.header
    assert s.csv.columns == ["label", *s.dense, *s.sparse] and len(s.sparse) == 26
    assert all(c.hex for c in s.sparse.values()) and s.split_by == split
    assert {d.transform for d in s.dense.values()} == {"log1p"}
