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


def test_two_threads_logging_one_new_dataset_both_record_it(tmp_path, monkeypatch):
    """MLflow looks a dataset up, then inserts it: two threads of one process (a retrain's
    lanes) would both insert, and one run lose its input. The first call in waits up to a second
    for a second one to come in beside it; one at a time, none does."""
    import threading

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    real = SqlAlchemyStore._log_inputs_impl
    inside, most, second_in = [0], [0], threading.Event()
    lock = threading.Lock()

    def spread(self, *args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            first = inside[0] == 1
        if first:
            second_in.wait(1.0)  # (without the tracker's lock, the second comes in here)
        else:
            second_in.set()
        try:
            return real(self, *args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(SqlAlchemyStore, "_log_inputs_impl", spread)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    exp = tracker.experiment("s")
    runs = [tracker.trial_run(exp, tracker.parent_run(exp, "s"), "s", f"t{k}", {})
            for k in range(2)]  # fmt: skip
    fields = {"name": "d", "digest": "0123456789abcdef", "source_type": "local", "source": "/d",
              "schema": "", "profile": ""}  # fmt: skip
    threads = [threading.Thread(target=Tracker(uri).log_dataset, args=(r, lambda: fields))
               for r in runs]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1  # one at a time
    for r in runs:
        (logged,) = MlflowClient(uri).get_run(r).inputs.dataset_inputs
        assert logged.dataset.digest == fields["digest"]
