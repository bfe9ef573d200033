"""Configs round-trip through plain dicts and refuse bad values with named errors."""

from __future__ import annotations

import pytest

from recsys.config import ConfigError, ExperimentConfig, QRConfig


def test_round_trip_through_plain_dict():
    cfg = ExperimentConfig().with_overrides(
        {"embeddings.qr.threshold": 500, "loss.weights": [1, 3], "model.interaction": "cat"}
    )
    plain = cfg.to_dict()
    assert isinstance(plain["loss"]["weights"], list)
    back = ExperimentConfig.from_dict(plain)
    assert back == cfg
    assert back.embeddings.qr == QRConfig(threshold=500)
    assert back.loss.weights == (1.0, 3.0)


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"'embeddings.qr.treshold'.*'embeddings.qr.threshold'"):
        ExperimentConfig().with_overrides({"embeddings.qr.treshold": 3})
    with pytest.raises(ConfigError, match=r"'model.interactoin'.*did you mean 'interaction'"):
        ExperimentConfig.from_dict({"model": {"interactoin": "dot"}})


def test_wrong_type_names_field():
    with pytest.raises(ConfigError, match=r"embeddings.dim: expected int, got 'big'"):
        ExperimentConfig.from_dict({"embeddings": {"dim": "big"}})


def test_keys_cover_nested_fields():
    keys = ExperimentConfig.all_keys()
    for k in ("model.interaction", "embeddings.dim", "embeddings.qr.collisions", "optim.lr"):
        assert k in keys


def _literal_keys() -> list[tuple[str, tuple]]:
    """Every dotted key whose type is a Literal (or a list/optional of one), with its choices."""
    import typing

    from recsys.configlib import choices, dotted_keys

    out = []
    for key in dotted_keys(ExperimentConfig):
        cls, *path = [ExperimentConfig], *key.split(".")
        tp = None
        for part in path:
            tp = typing.get_type_hints(cls[-1])[part]
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(tp) in (typing.Union, type(int | None)) and len(inner) == 1:
                tp = inner[0]
            cls.append(tp)
        if typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        if choices(tp):
            out.append((key, choices(tp)))
    return out


def test_every_literal_field_is_checked_with_its_derived_choices():
    keys = _literal_keys()
    assert {"model.interaction", "data.source", "optim.dense_optimizer"} <= {k for k, _ in keys}
    for key, allowed in keys:
        value = ["nonsense"] if key.startswith("sharding.default.") else "nonsense"
        with pytest.raises(ConfigError, match=rf"{key}(\[0\])?='nonsense': not one of") as e:
            ExperimentConfig().with_overrides({key: value})
        assert str(allowed) in str(e.value)  # the message lists the choices the type declares


def test_dot_over_a_single_vector_is_refused_with_the_config():
    """No numeric feature and one id feature leave ``dot`` no pair: refused when the config is
    built (so a search space's check catches it before launch), not when the model is."""
    one = {"model": {"num_dense": 0, "interaction": "dot"}, "embeddings": {"num_embeddings": [9]}}
    with pytest.raises(ConfigError, match="dot needs two vectors"):
        ExperimentConfig.from_dict(one)
    ExperimentConfig.from_dict({**one, "model": {"num_dense": 0, "interaction": "cat"}})
    ExperimentConfig.from_dict({**one, "model": {"num_dense": 1, "interaction": "dot"}})


def test_a_negative_pause_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"train.pause_at=-1.*must be >= 0 \(0: off\)"):
        ExperimentConfig.from_dict({"train": {"pause_at": -1}})
    assert ExperimentConfig.from_dict({"train": {"pause_at": 6}}).train.pause_at == 6
