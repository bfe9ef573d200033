"""The registered model's ``@champion`` alias: set only on the sweep's confirmed winner (the best
confirmed mean, separable from the runner-up, beating every reference); its version's tags carry
the verdict either way."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from recsys.serving.mlflow_model import crown
from recsys.tracking.tracker import Tag, Tracker


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


def test_the_version_the_alias_leaves_no_longer_says_yes(tmp_path):
    """A second winner takes @champion; the first keeps its verdicts but not its ``yes`` (one
    version of a name says ``yes``: the one the alias names)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker, first = sweep_with(uri, **WON)
    crown(tracker, "m", "s", first)
    _, second = sweep_with(uri, **WON)
    crown(tracker, "m", "s", second)
    client = MlflowClient(uri)
    assert str(client.get_model_version_by_alias("m", "champion").version) == "2"
    old, new = client.get_model_version("m", "1"), client.get_model_version("m", "2")
    assert old.tags[Tag.CHAMPION] == "was: @champion moved to version 2"
    assert new.tags[Tag.CHAMPION] == "yes" and old.tags[f"{Tag.VERDICT}.lr"].startswith("beats")
    crown(tracker, "m", "s", second)  # crowned again: it stays, and says so
    assert client.get_model_version("m", "2").tags[Tag.CHAMPION] == "yes"


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


def reference_won(uri: str, checked: bool) -> tuple[Tracker, str]:
    """A sweep `s` whose best model is reference `r1` (its trial t1 trails it), with a
    registered version of `m` logged by the reference's run."""
    t = Tracker(uri)
    exp = t.experiment("s")
    parent = t.parent_run(exp, "s")
    order = ["t1"] if checked else []
    t.set_tags(parent, {Tag.CONFIRMED_ORDER: json.dumps(order), Tag.WINNER: "lr (a reference, "
                        "trial r1)", Tag.WINNER_TRIAL: "r1", Tag.WINNER_KIND: "reference",
                        f"{Tag.VERDICT}.lr": "does not beat: lead -0.0200"})  # fmt: skip
    t.trial_run(exp, parent, "s", "t1", {})
    run = t.trial_run(exp, parent, "s", "r1", {}, kind="baseline")
    t.set_tags(run, {Tag.BEST_CHECKPOINT: "/ckpt/r1"})
    client = MlflowClient(uri)
    client.create_registered_model("m")
    client.create_model_version("m", f"runs:/{run}/served_model", run_id=run)
    return t, run


@pytest.mark.parametrize("checked", [True, False], ids=["seed-checked", "single-reports"])
def test_a_reference_no_trial_beats_is_the_export_and_may_be_the_champion(tmp_path, checked):
    """A user asked for the best model, not the best DLRM: the reference the search's best
    trails is what an export takes, and the champion where the seed check saw it outside the
    noise."""
    from recsys.tune import publish

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker, run = reference_won(uri, checked)
    ref = publish.winning_reference(tracker, "s", None)
    assert ref is not None and ref.info.run_id == run
    assert publish.winning_reference(tracker, "s", max_emb_bytes=0.0) is None  # over a budget
    model_uri, line = crown(tracker, "m", "s", run)
    version = MlflowClient(uri).get_model_version("m", "1")
    assert version.tags[Tag.WINNER] == "lr (a reference, trial r1)"
    if checked:
        assert model_uri == "models:/m@champion" and "a reference no trial beats" in line
        assert version.tags[Tag.CHAMPION] == "yes"
    else:
        assert model_uri == "models:/m/1" and version.tags[Tag.CHAMPION].startswith("no: no seed")
