"""Search spaces: every shipped one loads; bad ones fail before launch, naming file, key, value."""

from __future__ import annotations

import os

import pytest

from recsys.configlib import ConfigError
from recsys.tune import space as spaces

SHIPPED = sorted(f[:-5] for f in os.listdir(spaces.SPACES_DIR) if f.endswith(".yaml"))


OWN_DATA = {"clicklogs"}  # spaces over a prepared folder of one's own data
DATA = {"clicklogs": "demo_prepared", "criteo": "criteo_prepared"}  # the folder each space needs


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("smoke", [False, True])
def test_shipped_spaces_load(name, smoke, request):
    data = request.getfixturevalue(DATA[name]) if name in DATA else None
    space = spaces.load(name, smoke=smoke, data=data)
    weights = "loss.task_weights.like" if name in OWN_DATA else "loss.weights"
    metric = "val_auc/mean" if name in OWN_DATA else "val_auc"
    assert space.dimensions and space.metric == metric
    keys = {d.key for d in space.dimensions}
    assert {"model.interaction", "embeddings.dim", "embeddings.qr.threshold", weights} <= keys
    param_space = space.param_space()
    assert set(param_space) == keys


def test_default_space_is_small_and_smoke_is_smaller():
    full, smoke = spaces.load("default"), spaces.load("default", smoke=True)
    assert full.base.data.source == "synthetic"
    assert smoke.base.train.steps < full.base.train.steps


def write(tmp_path, body: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text("base: debug\n" + body)
    return str(path)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (
            "space:\n  embeddings.qr.treshold: {choice: [1]}\n",
            "did you mean 'embeddings.qr.threshold'",
        ),
        (
            "space:\n  embeddings.dim: {choice: [8, big]}\n",
            r"embeddings.dim: value 'big' is invalid",
        ),
        ("space:\n  embeddings.dim: {choice: []}\n", "needs a non-empty list"),
        ("space:\n  optim.lr: {loguniform: [0.1, 0.01]}\n", r"low >= high in \[0.1, 0.01\]"),
        ("space:\n  optim.lr: {normal: [0, 1]}\n", "unknown primitive 'normal'"),
        ("space: {}\n", "space is empty"),
        ("spaces:\n  optim.lr: {uniform: [0, 1]}\n", "unknown section 'spaces'"),
        ("overrides: {train.stepz: 3}\nspace:\n  optim.lr: {uniform: [0.1, 1]}\n", "train.steps"),
        (
            "overrides: {embeddings.qr.threshold: 10, embeddings.qr.operation: concat}\n"
            "space:\n  embeddings.dim: {choice: [8, 12]}\n",
            "% 8",
        ),
    ],
)
def test_bad_spaces_are_refused(tmp_path, body, match):
    with pytest.raises(ConfigError, match=match) as err:
        spaces.load(write(tmp_path, body))
    assert "s.yaml" in str(err.value)


def test_impossible_combination_is_named(tmp_path):
    body = (
        "overrides: {embeddings.qr.threshold: 10}\n"
        "space:\n  embeddings.dim: {choice: [8, 12]}\n"
        "  embeddings.qr.operation: {choice: [mult, concat]}\n"
    )
    with pytest.raises(ConfigError, match=r"combination .*'embeddings.dim': 12.*'concat'"):
        spaces.load(write(tmp_path, body))


def test_unknown_space_name():
    with pytest.raises(ConfigError, match="search space 'nope' not found"):
        spaces.load("nope")
