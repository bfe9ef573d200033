"""What data a trial saw, recorded as an MLflow dataset input (the UI's Datasets column)."""

from __future__ import annotations

import json

from mlflow import MlflowClient

from recsys.config import ExperimentConfig
from recsys.tracking.inputs import describe
from recsys.tracking.tracker import Tracker
from tests.helpers import prepared_log


def test_a_prepared_folder_is_named_with_its_digest_schema_and_split_rows(tmp_path):
    import numpy as np

    folder = prepared_log(tmp_path / "clicks", {"click": np.array([0, 1] * 50)})
    cfg = ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}})
    fields = describe(cfg.data)
    assert fields["name"] == "prepared" and fields["source"] == folder  # the folder's name
    assert json.loads(fields["schema"])["labels"] == ["click"]
    rows = json.loads(fields["profile"])["rows"]
    assert sum(rows.values()) == 100 and rows["train"] > 0
    again = prepared_log(tmp_path / "other", {"click": np.array([1, 0] * 50)})
    other = ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [again]}})
    assert describe(other.data)["digest"] != fields["digest"]  # other rows, other digest

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    exp = tracker.experiment("s")
    run = tracker.parent_run(exp, "s")
    tracker.log_dataset(run, lambda: fields)
    (logged,) = MlflowClient(uri).get_run(run).inputs.dataset_inputs
    assert (logged.dataset.name, logged.dataset.digest) == ("prepared", fields["digest"])
    assert [(t.key, t.value) for t in logged.tags] == [("mlflow.data.context", "training")]


def test_generated_data_is_named_by_its_settings():
    a = describe(ExperimentConfig.from_dict({}).data)
    b = describe(ExperimentConfig.from_dict({"data": {"synthetic": {"seed": 9}}}).data)
    assert a["name"] == b["name"] == "synthetic" and a["digest"] != b["digest"]
