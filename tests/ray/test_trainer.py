"""One configuration under Ray Train's TorchTrainer on 2 CPU workers of a local Ray."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from recsys.tracking.tags import Tag
from recsys.train.ray_trainer import Resources, make_trainer
from tests.helpers import fit_killed_once
from tests.helpers import trainer_config as config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_local_rays_workers_run_at_the_drivers_priority(ray_2_cpus):
    """Ray's default lowers its workers to nice 15, where next to any process at nice 0 a trial
    gets a few percent of a core; a local Ray of ours runs them at nice 0, as the driver."""
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)  # the default makes it os.nice(0) + 15


def test_trainer_learns_and_metrics_match_sklearn(ray_2_cpus, tmp_path):
    import ray

    from recsys.data.input.loader import load_splits, to_batch
    from recsys.distributed.checkpoint import load_model_unsharded
    from recsys.models import DLRM, ModelAndLoss
    from recsys.runtime.cluster import start_train_coordinator

    # Train's controller asks this actor for resources with 5 s to answer: started and running
    # before the run (a Ray that moved it fails here, not with a traceback on a busy console)
    start_train_coordinator()
    ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    cfg = config()
    trainer = make_trainer(cfg, Resources(2), name="learn", storage_path=str(tmp_path))
    result = trainer.fit()
    m = result.metrics
    assert m["step"] == 120 and m["val_auc"] > 0.7, m
    # the reported figures equal sklearn's on predictions of the checkpointed model
    model = load_model_unsharded(
        result.checkpoint.path, ModelAndLoss(DLRM(cfg.model, cfg.embeddings), cfg.loss)
    )
    val = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings).val
    with torch.no_grad():
        _, out = model.eval()(to_batch(val.read(0, len(val)), cfg.embeddings.layout()))
    logits, labels = out["logits"][:, 0].numpy(), out["labels"][:, 0].numpy()
    assert m["val_count"] == len(val)
    # histogram AUC (summed over ranks on the device): within the bound it reports, a small one
    assert abs(m["val_auc"] - roc_auc_score(labels, logits)) <= m["val_auc_error_bound"] + 1e-12
    assert m["val_auc_error_bound"] < 1e-3
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert m["val_log_loss"] == pytest.approx(log_loss(labels, probs), abs=1e-5)
    with open(os.path.join(result.checkpoint.path, "sharding_plan.json")) as f:
        plan = json.load(f)
    assert {t["sharding_type"] for t in plan["tables"].values()} == {"table_wise"}


def test_killed_worker_restarts_from_last_checkpoint(ray_2_cpus, tmp_path):
    fit_killed_once(tmp_path, Resources(2))


def test_a_finished_run_extends_and_a_run_with_nothing_left_finishes(ray_2_cpus, tmp_path):
    """Re-running a finished training with more steps continues it (checkpoints without
    validation kept beside validated ones: every score must be a number Ray can order after its
    JSON snapshot is restored), and re-running it at the same step count reports its stored best
    and finishes (a sweep resumed right after a trial's last checkpoint)."""
    import glob
    import tempfile

    staged = os.path.join(tempfile.gettempdir(), "recsys-step*")
    before = len(glob.glob(staged))
    short = {"train.steps": 20, "train.checkpoint_every": 10, "train.eval_every": 20}
    first = make_trainer(config(**short), Resources(1), name="ext", storage_path=str(tmp_path))
    out = first.fit()
    best = out.metrics["best_val_auc"]
    # written in place on the run's storage (a file system here), never staged and copied
    assert out.checkpoint.path.startswith(str(tmp_path)) and len(glob.glob(staged)) == before
    longer = config(**{**short, "train.steps": 40})
    result = make_trainer(longer, Resources(1), name="ext", storage_path=str(tmp_path)).fit()
    assert result.error is None and result.metrics["step"] == 40
    assert result.metrics["best_val_auc"] >= best
    again = make_trainer(longer, Resources(1), name="ext", storage_path=str(tmp_path)).fit()
    assert again.error is None
    m = again.metrics
    assert m["step"] == 40 and m["best_val_auc"] == result.metrics["best_val_auc"]
    assert m["best_step"] == result.metrics["best_step"]


@pytest.fixture(scope="module")
def one_worker(ray_2_cpus, tmp_path_factory) -> tuple[Any, Any]:
    """A 60-step configuration and its run on Ray Train with one worker (what the inline paths
    must equal)."""
    cfg = config(**{"train.steps": 60, "data.synthetic.num_samples": 6000})
    folder = str(tmp_path_factory.mktemp("one_worker"))
    return cfg, make_trainer(cfg, Resources(1), name="ray", storage_path=folder).fit()


KEYS = ["step", "loss", "val_auc", "val_log_loss", "samples_seen"]


def test_a_one_worker_cpu_trial_trains_the_same_in_its_tune_trial_as_on_ray_train(
    one_worker, tmp_path
):
    """``recsys.train.inline``: the same training, reports and checkpoints, in a Tune trial's own
    process over a one-rank group, as Ray Train's one worker gives, even where that process dies
    after its first checkpoint (Tune tries it again: it resumes exactly); its reports reach Tune
    as ``ReportToTune`` sends them, and the driver reads its folder as a Train result. Resumed on
    2 Ray Train workers, then on one (a Ray task), then on 2 again, each goes on from the newest
    checkpoint."""
    from ray import tune

    from recsys.tracking.tune_reports import RUN_ID, to_tune, tune_report
    from recsys.train import inline
    from recsys.train.launch import InlineRun

    cfg, on_ray_train = one_worker
    root, marker = str(tmp_path / "inline"), str(tmp_path / "died")

    def trial(_: dict) -> None:
        report = inline.InlineReporter.report

        def report_then_die_once(self: Any, metrics: dict, folder: str, step: int) -> None:
            report(self, metrics, folder, step)
            if step == 30 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # the trial's process dies (a lost node, an OOM kill)

        inline.InlineReporter.report = report_then_die_once  # type: ignore[method-assign]
        inline.train(cfg, root, to_tune("run-1"), cpus=1.0)

    tuner = tune.Tuner(
        tune.with_resources(trial, {"CPU": 1}),
        run_config=tune.RunConfig(name="t", storage_path=str(tmp_path / "tune"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )  # fmt: skip
    outcome = tuner.fit()[0]
    assert os.path.exists(marker) and outcome.error is None
    reports = outcome.metrics_dataframe
    ours = inline.persisted(root)
    assert {k: ours.metrics[k] for k in KEYS} == {k: on_ray_train.metrics[k] for k in KEYS}
    assert [m["step"] for _, m in ours.best_checkpoints] == [30, 60]  # (both kept)
    last = reports.iloc[-1].to_dict()
    assert last[RUN_ID] == "run-1" and last["checkpoint_path"] == ours.checkpoint.path
    run, report, uri = tune_report(last)
    assert run == "run-1" and uri == ours.checkpoint.path and report["step"] == 60
    # the same run resumed on Ray Train with 2 workers (a sweep resumed on more) goes on from
    # the inline run's last checkpoint
    longer = cfg.with_overrides({"train.steps": 90})
    resumed = make_trainer(longer, Resources(2), name="inline", storage_path=str(tmp_path)).fit()
    note = "resumed at step 60 on 2 workers from a checkpoint of 1"
    assert resumed.metrics["step"] == 90 and note in resumed.metrics.get("resume_note", "")
    # on one worker again (a Ray task), then on 2 workers again: Ray Train goes on from the
    # newest checkpoint in the folder, not from the last one it registered itself (step 90)
    further = InlineRun(cfg.with_overrides({"train.steps": 120}), Resources(1), "inline",
                        str(tmp_path)).fit()  # fmt: skip
    assert further.metrics["step"] == 120
    again = make_trainer(cfg.with_overrides({"train.steps": 150}), Resources(2), name="inline",
                         storage_path=str(tmp_path)).fit()  # fmt: skip
    note = "resumed at step 120 on 2 workers from a checkpoint of 1"
    assert again.metrics["step"] == 150 and note in again.metrics.get("resume_note", ""), again


def test_a_one_worker_training_outside_a_sweep_trains_in_a_ray_task(
    one_worker, tmp_path, monkeypatch
):
    """``recsys.train.launch``: ``recsys-train``, a refit and a retrain's trainings of one CPU
    worker train in a Ray task, as Ray Train's one worker would (its step, loss and scores
    exactly), even where the task's process dies after the first checkpoint (tried again, it
    resumes from it); each report reaches the MLflow run it is given, once, the one the dead
    process never sent too (logged before the next attempt)."""
    from mlflow import MlflowClient

    from recsys.train import inline, launch
    from recsys.train.reporting import write_report

    cfg, on_ray_train = one_worker
    real, marker = launch.train_task, str(tmp_path / "died")

    def dies_once(*args: Any) -> Any:  # (a generator, pickled by value into the task)
        report = inline.InlineReporter.report

        def report_then_die(self: Any, metrics: dict, folder: str, step: int) -> None:
            if step == 30 and not os.path.exists(marker):
                open(marker, "w").close()
                write_report(folder, metrics)  # the checkpoint's report, never sent: the
                os._exit(1)  # process dies (a lost node, an OOM kill) before it reaches MLflow
            report(self, metrics, folder, step)

        inline.InlineReporter.report = report_then_die  # type: ignore[method-assign]
        try:
            yield from real(*args)
        finally:
            inline.InlineReporter.report = report  # type: ignore[method-assign]

    monkeypatch.setattr(launch, "train_task", dies_once)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    said: list[str] = []
    run = launch.make_run(cfg, Resources(1), name="task", storage_path=str(tmp_path),
                          max_failures=1, report_to=(uri, run_id), log=said.append)  # fmt: skip
    assert isinstance(run, launch.InlineRun)
    result = run.fit()
    assert os.path.exists(marker) and len(said) == 1 and "trying again" in said[0], said
    assert {k: result.metrics[k] for k in KEYS} == {k: on_ray_train.metrics[k] for k in KEYS}
    assert result.checkpoint.path == str(tmp_path / "task" / "step_00000060")
    steps = [m.step for m in client.get_metric_history(run_id, "step")]
    assert sorted(steps) == [30, 60]  # the step-30 report logged once: by the second attempt
    (val,) = client.get_metric_history(run_id, "val_auc")  # (evaluated at step 60)
    assert (val.step, val.value) == (60, result.metrics["val_auc"])
    tags = client.get_run(run_id).data.tags
    assert tags[Tag.LAST_CHECKPOINT] == str(tmp_path / "task" / "step_00000060")


def test_a_training_in_a_ray_task_is_not_tried_again_on_an_input_error(
    ray_2_cpus, tmp_path, monkeypatch
):
    """An error of the input is raised at once, as itself; any other failure is tried again up
    to ``max_failures`` times, then raised."""
    from recsys.data.errors import DataError
    from recsys.train import launch

    attempts = tmp_path / "attempts"

    def failing(error: type[Exception]) -> Any:
        def task(*args: Any) -> Any:
            with open(attempts, "a") as f:
                f.write("x")
            raise error("clicks.csv: column 'price': 'abc' is not a number")
            yield  # (a generator, as the task is)

        return task

    run = launch.make_run(config(), Resources(1), name="bad", storage_path=str(tmp_path),
                          max_failures=2, log=lambda s: None)  # fmt: skip
    monkeypatch.setattr(launch, "train_task", failing(DataError))
    with pytest.raises(DataError, match="column 'price'"):
        run.fit()
    assert attempts.read_text() == "x"
    monkeypatch.setattr(launch, "train_task", failing(RuntimeError))
    with pytest.raises(RuntimeError, match="column 'price'"):
        run.fit()
    assert attempts.read_text() == "x" + "xxx"  # the first and its 2 retries


def test_a_run_that_no_task_can_hold_is_built_for_ray_train(ray_2_cpus, tmp_path):
    """One CPU worker: a Ray task; two workers: Ray Train's ``TorchTrainer`` (a GPU or an object
    store too: ``inline.fits``, tests/unit/test_inline.py)."""
    from ray.train.torch import TorchTrainer

    from recsys.train.launch import InlineRun, make_run

    cfg, folder = config(), str(tmp_path)
    assert isinstance(make_run(cfg, Resources(1), name="a", storage_path=folder), InlineRun)
    assert isinstance(make_run(cfg, Resources(2), name="a", storage_path=folder), TorchTrainer)
