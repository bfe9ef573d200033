"""Search spaces: every shipped one loads; bad ones fail before launch, naming file, key, value;
a metric the data cannot give (one class or no rows in the validation split) is refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from recsys.configlib import ConfigError
from recsys.tune import space as spaces
from recsys.tune.preflight import check_space
from tests.helpers import metric_space, prepared_log, space_file

SHIPPED = sorted(f[:-5] for f in os.listdir(spaces.SPACES_DIR) if f.endswith(".yaml"))


OWN_DATA = {"clicklogs"}  # spaces over a prepared folder of one's own data
DATA = {"clicklogs": "demo_prepared", "criteo": "criteo_prepared"}  # the folder each space needs
DEVICE = {"criteo": "cuda"}  # the workers a space is for (its decay on fp32 tables: GPUs only)


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
    if name in DATA:  # the spaces for real logs choose the architecture too
        assert {"model.arch", "model.finalmlp.heads"} <= keys
        arch = next(d for d in space.dimensions if d.key == "model.arch")
        assert arch.values == ["dlrm", "finalmlp"]
        assert space.config_for({"model.arch": "finalmlp"}).model.arch == "finalmlp"
    param_space = space.param_space()
    assert set(param_space) == keys
    check_space(space, DEVICE.get(name, "cpu"), 2)  # every point trains on the space's workers


def test_a_point_a_worker_would_refuse_refuses_the_sweep_before_it_launches(tmp_path):
    space = spaces.load(
        space_file(tmp_path, "space:\n  embeddings.dtype: {choice: [fp32, bf16]}\n")
    )
    check_space(space, "cuda", 2)  # GPU workers hold bf16 tables
    with pytest.raises(ConfigError) as e:
        check_space(space, "cpu", 2)
    assert "the trial with embeddings.dtype='bf16' cannot train on 2 cpu worker(s): " in str(
        e.value
    )
    assert "FBGEMM's CPU kernels have no bf16 tables" in str(e.value)


def test_default_space_is_small_and_smoke_is_smaller():
    full, smoke = spaces.load("default"), spaces.load("default", smoke=True)
    assert full.base.data.source == "synthetic"
    assert smoke.base.train.steps < full.base.train.steps


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
        (
            "overrides: {data.refit: true}\nspace:\n  optim.lr: {uniform: [0.1, 1]}\n",
            r"s.yaml: data.refit: a sweep chooses by its validation rows, which a refit trains",
        ),
        ("space:\n  data.refit: {choice: [false, true]}\n", "space.data.refit: a sweep chooses"),
    ],
)
def test_bad_spaces_are_refused(tmp_path, body, match):
    with pytest.raises(ConfigError, match=match) as err:
        spaces.load(space_file(tmp_path, body))
    assert "s.yaml" in str(err.value)


def test_impossible_combination_is_named(tmp_path):
    body = (
        "overrides: {embeddings.qr.threshold: 10}\n"
        "space:\n  embeddings.dim: {choice: [8, 12]}\n"
        "  embeddings.qr.operation: {choice: [mult, concat]}\n"
    )
    with pytest.raises(ConfigError, match=r"combination .*'embeddings.dim': 12.*'concat'"):
        spaces.load(space_file(tmp_path, body))


def test_unknown_space_name():
    with pytest.raises(ConfigError, match="search space 'nope' not found"):
        spaces.load("nope")


@pytest.fixture(scope="module")
def one_class_val(tmp_path_factory) -> str:
    """``click`` is all 1 in the validation split, ``like`` has both classes everywhere."""
    rng = np.random.default_rng(1)
    click = (rng.random(1000) < 0.3).astype(np.int8)
    click[600:800] = 1
    like = (rng.random(1000) < 0.5).astype(np.int8)
    return prepared_log(tmp_path_factory.mktemp("one_class"), {"click": click, "like": like})


@pytest.mark.parametrize("metric", ["val_auc", "val_auc/click", "val_auc/mean"])
def test_an_auc_of_a_one_class_validation_split_is_refused(tmp_path, one_class_val, metric):
    from recsys.data.prepared.meta import read_meta

    counts = read_meta(one_class_val)["label_counts"]["val"]
    assert counts["click"] == {"rows": 200, "positives": 200} and counts["like"]["positives"]
    with pytest.raises(ConfigError) as err:
        spaces.load(metric_space(tmp_path, metric), data=one_class_val)
    assert str(err.value) == (
        f"{tmp_path / 's.yaml'}: {metric} cannot be computed: the validation split of "
        f"{one_class_val} has 200 rows, all with click=1 (meta.json label_counts); choose "
        "another metric (val_log_loss) or another split"
    )


def test_a_mean_auc_names_every_one_class_task(tmp_path):
    rng = np.random.default_rng(3)
    click, like = (rng.random((2, 1000)) < 0.3).astype(np.int8)
    click[600:800], like[600:800] = 1, 0
    folder = prepared_log(tmp_path, {"click": click, "like": like})
    with pytest.raises(ConfigError, match=r"val_auc/mean cannot be computed: .* has 200 rows, "
                       r"all with click=1, all with like=0 \(meta.json"):  # fmt: skip
        spaces.load(metric_space(tmp_path, "val_auc/mean"), data=folder)


@pytest.mark.parametrize(
    ("metric", "mode"), [("val_log_loss", "min"), ("val_auc/like", "max"), ("val_ne/mean", "min")]
)
def test_a_metric_the_validation_split_can_give_is_accepted(tmp_path, one_class_val, metric,
                                                           mode):  # fmt: skip
    space = spaces.load(metric_space(tmp_path, metric, mode), data=one_class_val)
    assert space.metric == metric and space.base.loss.names() == ["click", "like"]
    assert space.base.model.num_dense == 0


def test_a_metric_without_validation_rows_or_of_no_task_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    folder = prepared_log(tmp_path, {"click": (rng.random(1000) < 0.3).astype(np.int8)}, 0.0)
    with pytest.raises(ConfigError, match=r"val_log_loss cannot be computed: the validation "
                       r"split of .*prepared has no rows"):  # fmt: skip
        spaces.load(metric_space(tmp_path, "val_log_loss", "min"), data=folder)
    # one task: its figures are reported without a suffix, so a suffixed name never comes
    with pytest.raises(ConfigError, match=r"val_auc/click is never reported: the data has one "
                       r"task \(click\).*use val_auc"):  # fmt: skip
        spaces.load(metric_space(tmp_path, "val_auc/click"))
    with pytest.raises(ConfigError, match=r"metric='val_auc/clik'.*no task 'clik'"):
        spaces.load(metric_space(tmp_path, "val_auc/clik"))
