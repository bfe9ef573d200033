"""The planted log (``recsys.demo.planted``): categorical fields only, reproducible from its
seed, its ``p_click`` the probability each click was drawn with (so its AUC is the oracle's),
pairwise terms that a linear model cannot see, and a schema the product's preparation takes, whose
test split is the file's last rows."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from recsys.cli import planted as planted_cli
from recsys.config import DataConfig
from recsys.data.input.loader import load_splits
from recsys.data.schema import DatasetSchema
from recsys.demo import planted
from recsys.metrics.binary import auc
from recsys.prepare.pipeline import prepare


def test_the_same_seed_writes_the_same_rows(tmp_path):
    a = pq.read_table(planted.write(str(tmp_path / "a"), 3000, seed=3))
    b = pq.read_table(planted.write(str(tmp_path / "b"), 3000, seed=3))
    c = pq.read_table(planted.write(str(tmp_path / "c"), 3000, seed=4))
    assert a.equals(b) and not a.equals(c)
    assert a.column_names == [*planted.FIELDS, "click", planted.TRUTH]
    assert a.column("user").type == "string" and a.column("item").type == "int64"


def test_p_click_is_the_probability_the_clicks_were_drawn_with():
    model = planted.Planted(seed=1)
    rows = model.draw(200_000, np.random.default_rng(5))
    p, y = rows[planted.TRUTH], rows["click"]
    assert abs(y.mean() - model.shape.positive_rate) < 0.01
    edges = np.quantile(p, np.linspace(0, 1, 11))
    for lo, hi in itertools.pairwise(edges):  # calibrated in every decile
        sel = (p >= lo) & (p < hi)
        assert abs(y[sel].mean() - p[sel].mean()) < 0.015
    parts = model.parts(rows)
    np.testing.assert_allclose(model.bias + sum(parts.values()), rows["logit"])
    oracle = auc(y, p)
    main = auc(y, parts["main"])  # what a model without the pairs could reach at best
    assert oracle > 0.8 and oracle - main > 0.1
    assert set(np.unique(rows["category"])) <= set(range(model.shape.categories))
    assert (rows["category"] == model.category_of[rows["item"]]).all()  # an item's own category


def test_ids_are_zipf_so_many_are_rare():
    rows = planted.Planted().draw(60_000, np.random.default_rng(0))
    counts = np.bincount(rows["user"], minlength=planted.Shape().users)
    assert (counts < 5).mean() > 0.3  # many users are seen a few times: overfitting matters
    assert np.sort(counts)[-100:].sum() / counts.sum() > 0.4  # and a few often


def test_it_prepares_and_its_test_split_is_the_files_last_rows(tmp_path):
    path = planted.write(str(tmp_path / "raw"), 2000, seed=0, val_fraction=0.2, test_fraction=0.25)
    with open(tmp_path / "raw" / planted.SCHEMA_FILE) as f:
        schema = DatasetSchema.from_dict(yaml.safe_load(f))
    assert schema.to_dict() == DatasetSchema.from_dict(planted.schema_dict(0.2, 0.25)).to_dict()
    meta = prepare(schema, [str(tmp_path / "raw")], str(tmp_path / "prep"), workers=0,
                   log=lambda s: None)  # fmt: skip
    assert meta["rows"] == {"train": 1100, "val": 400, "test": 500}
    assert meta["feature_names"] == list(planted.FIELDS) and meta["schema"]["dense"] == {}
    test = planted.test_rows(path, meta)
    assert len(test) == 500
    split = load_splits(DataConfig(source="prepared", paths=[str(tmp_path / "prep")]), 0,
                        meta["table_sizes"]).test  # fmt: skip
    prepared = split.read(0, len(split)).labels[:, 0]
    np.testing.assert_array_equal(prepared, test["click"].to_numpy())
    assert planted.oracle_auc(test) == pytest.approx(auc(test["click"], test[planted.TRUTH]))


def test_the_command_line_writes_the_log_and_its_schema(tmp_path, capsys):
    planted_cli.main(["--out", str(tmp_path), "--rows", "500", "--seed", "2"])
    assert (tmp_path / planted.FILE).is_file() and (tmp_path / planted.SCHEMA_FILE).is_file()
    assert "wrote 500 rows" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="rows=3"):
        planted_cli.main(["--out", str(tmp_path / "x"), "--rows", "3"])


def test_two_tasks_share_some_terms_and_conflict_on_one():
    """With 2 tasks each row has a like drawn with its known ``p_like``: calibrated, its logit
    the click's shared terms, ``taste`` with the opposite sign and the items' own quality; the
    click columns are the one-task log's of the same seed."""
    one, two = planted.Planted(seed=2), planted.Planted(seed=2, shape=planted.Shape(tasks=2))
    a, b = one.draw(100_000, np.random.default_rng(7)), two.draw(100_000, np.random.default_rng(7))
    for key in ("user", "item", "logit", "click"):
        np.testing.assert_array_equal(a[key], b[key])
    p, y = b["p_like"], b["like"]
    assert abs(y.mean() - two.shape.like_rate) < 0.01 and two.labels == ["click", "like"]
    edges = np.quantile(p, np.linspace(0, 1, 11))
    for lo, hi in itertools.pairwise(edges):
        sel = (p >= lo) & (p < hi)
        assert abs(y[sel].mean() - p[sel].mean()) < 0.015
    parts = two.parts(b)
    like = two.like_parts(b, parts)
    np.testing.assert_allclose(two.like_bias + sum(like.values()), b["like_logit"])
    np.testing.assert_array_equal(like["taste"], -parts["taste"])  # the conflict
    np.testing.assert_array_equal(like["screen"], parts["screen"])  # shared
    assert auc(y, p) > 0.75
    # the click's oracle scores the like worse than the like's own: the tasks differ
    assert auc(y, b["logit"]) < auc(y, p) - 0.1


def test_two_tasks_write_both_labels_and_their_schema(tmp_path, capsys):
    planted_cli.main(["--out", str(tmp_path), "--rows", "3000", "--tasks", "2"])
    table = pq.read_table(tmp_path / planted.FILE)
    assert table.column_names == [*planted.FIELDS, "click", "p_click", "like", "p_like"]
    with open(tmp_path / planted.SCHEMA_FILE) as f:
        schema = yaml.safe_load(f)
    assert schema["labels"] == ["click", "like"] and "p_like" not in schema["sparse"]
    frame = table.to_pandas()
    assert planted.oracle_auc(frame, "like") == pytest.approx(auc(frame["like"], frame["p_like"]))
    with pytest.raises(ValueError, match="tasks=3"):
        planted.Shape(tasks=3)
