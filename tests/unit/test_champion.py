"""The registered model's ``@champion`` alias: set only on the sweep's confirmed winner (the best
confirmed mean, separable from the runner-up, beating every reference); its version's tags carry
the verdict either way."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from recsys.tracking.tracker import Tag, Tracker
from recsys.tune.publish import crown


def sweep_with(uri: str, **tags: str) -> tuple[Tracker, str]:
    """A sweep `s` whose parent run has ``tags`` and whose trial `t1` has a registered model
    version of `m`; the trial's run id."""
    t = Tracker(uri)
    exp = t.experiment("s")
    parent = t.parent_run(exp, "s")
    t.set_tags(parent, {Tag.CONFIRMED_ORDER: json.dumps(["t1", "t2"]), **tags})
    run = t.trial_run(exp, parent, "s", "t1", {})
    client = MlflowClient(uri)
    if not client.search_registered_models("name = 'm'"):
        client.create_registered_model("m")
    client.create_model_version("m", f"runs:/{run}/served_model", run_id=run)
    return t, run


WON = {Tag.SEPARABLE: "yes", f"{Tag.VERDICT}.lr": "beats: lead +0.0200"}


def test_the_confirmed_winner_is_the_champion(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker, run = sweep_with(uri, **WON)
    model_uri, line = crown(tracker, "m", "s", run)
    assert model_uri == "models:/m@champion" and line.startswith("@champion: version 1")
    client = MlflowClient(uri)
    version = client.get_model_version_by_alias("m", "champion")
    assert version.run_id == run and version.tags[Tag.CHAMPION] == "yes"
    assert version.tags[f"{Tag.VERDICT}.lr"] == "beats: lead +0.0200"


@pytest.mark.parametrize(
    ("tags", "why"),
    [
        ({**WON, Tag.SEPARABLE: "no"}, "its lead over t2 is inside the seed noise"),
        ({**WON, f"{Tag.VERDICT}.fm": "ties: lead +0.0010"}, "it ties fm"),
        ({**WON, Tag.CONFIRMED_ORDER: json.dumps(["t2", "t1"])}, "trial t2 has the best confirmed"),
        ({**WON, Tag.CONFIRMED_ORDER: "[]"}, "no seed check confirmed it"),
    ],
)
def test_no_alias_where_the_verdict_does_not_say_it_won(tmp_path, tags, why):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker, run = sweep_with(uri, **tags)
    model_uri, line = crown(tracker, "m", "s", run)
    assert model_uri == "models:/m/1" and why in line
    version = MlflowClient(uri).get_model_version("m", "1")
    assert version.tags[Tag.CHAMPION].startswith("no: ") and why in version.tags[Tag.CHAMPION]
    assert not version.aliases
