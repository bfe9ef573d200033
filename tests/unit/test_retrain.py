"""The retrain's decision and its refusals (``recsys.lifecycle.retrain``): ``@champion`` moves
only where the retrained seeds' lead over the frozen champion is outside their noise; a new
period whose features or tables do not match the model's is refused before anything trains."""

from __future__ import annotations

import pytest

from recsys.config import ExperimentConfig
from recsys.lifecycle.retrain import Plan, check_same_features, decide


def plan(metric: str = "auc") -> Plan:
    cfg = ExperimentConfig()
    mode = "min" if metric == "log_loss" else "max"
    return Plan("m", "3", "run", "ckpt", cfg, cfg, "d", 3, metric, mode)


def test_a_lead_inside_the_seed_noise_keeps_the_champion():
    noisy = [0.7010, 0.6950, 0.7090]  # mean 0.7017, its 95% interval about +-0.017
    kept = decide(plan(), noisy, frozen=0.7000, kept_version="3")
    assert not kept.promote
    assert kept.line.startswith("kept @champion (version 3): lead +0.0017 inside the noise")
    tight = [0.7110, 0.7105, 0.7115]  # the interval [0.710, 0.712] clear of 0.7000
    won = decide(plan(), tight, frozen=0.7000, kept_version="3")
    assert won.promote and "lead +0.0110, outside the noise" in won.line
    behind = decide(plan(), [0.69, 0.691, 0.689], frozen=0.7000, kept_version="3")
    assert not behind.promote and "lead -0.0100" in behind.line


def test_log_loss_decides_downwards():
    lower = decide(plan("log_loss"), [0.401, 0.400, 0.402], frozen=0.45, kept_version="3")
    assert lower.promote and "lead +0.0490" in lower.line
    higher = decide(plan("log_loss"), [0.46, 0.461, 0.459], frozen=0.45, kept_version="3")
    assert not higher.promote


def test_a_period_prepared_otherwise_is_refused(tmp_path):
    """The new period must be prepared ``--like`` the champion's data: its ids then mean what the
    champion's tables learnt; one with vocabularies of its own, or other features, is refused."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.dataset import resolve
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    rng = np.random.default_rng(0)
    table = pa.table({"y": rng.integers(0, 2, 200).astype(np.int8),
                      "u": [f"u{i}" for i in rng.integers(0, 9, 200)],
                      "i": rng.integers(0, 5, 200)})  # fmt: skip
    pq.write_table(table, tmp_path / "raw.parquet")
    schema = DatasetSchema.from_dict({"labels": ["y"], "sparse": {"u": {}, "i": {}}})
    folders = {}
    for name, like in (("week1", None), ("week2", "week1"), ("week3", "week2"), ("own", None)):
        folders[name] = str(tmp_path / name)
        prepare(schema, [str(tmp_path / "raw.parquet")], folders[name], workers=0,
                like=folders.get(like or ""), log=lambda s: None)  # fmt: skip

    def cfg(folder):
        return resolve(ExperimentConfig.from_dict({"data": {"source": "prepared",
                                                            "paths": [folder]}}))  # fmt: skip

    frozen = cfg(folders["week1"])
    check_same_features(frozen, cfg(folders["week2"]), folders["week2"])
    check_same_features(frozen, cfg(folders["week3"]), folders["week3"])  # like week2 like week1
    check_same_features(frozen, frozen, folders["week1"])  # the same folder again
    with pytest.raises(ValueError, match="prepared with vocabularies of its own, not like"):
        check_same_features(frozen, cfg(folders["own"]), folders["own"])
    other = frozen.with_overrides(
        {"embeddings.feature_names": ["v", "i"], "embeddings.feature_pooling": {}}
    )
    with pytest.raises(ValueError, match=r"its features \['v', 'i'\] are not the model's"):
        check_same_features(frozen, other, folders["week2"])


def test_the_command_refuses_before_ray_starts(tmp_path, capsys):
    """``recsys-retrain``: a model the store lacks, or too few seeds, refused naming it."""
    from recsys.cli import retrain

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = ["--data", str(tmp_path), "--tracking-uri", uri]
    with pytest.raises(SystemExit, match="error: --model 'models:/nope@champion': not in"):
        retrain.main(["--model", "models:/nope@champion", *base])
    with pytest.raises(SystemExit, match="expected models:/NAME@ALIAS or models:/NAME/VERSION"):
        retrain.main(["--model", "nope", *base])
    with pytest.raises(SystemExit):
        retrain.parse_args(["--model", "models:/m@champion", "--data", "d", "--seeds", "0"])
    assert "--seeds: '0'" in capsys.readouterr().err
