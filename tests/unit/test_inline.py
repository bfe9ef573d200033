"""A one-worker CPU trial trained in its Tune trial (``recsys.train.inline``): which trials do,
the checkpoints it keeps, and the Train result the driver reads from its folder as it reads Ray
Train's persisted runs."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest

from recsys.train import inline
from recsys.train.reporting import REPORT
from recsys.train.results import train_result
from recsys.tune.trial import TrialSpec, trains_inline, trial_cpus, trial_failures

SPEC = TrialSpec("s", {}, "/runs", "sqlite:///x", "0", "p", 1, False, 0.5, 1, role="baseline")


def test_a_one_worker_cpu_trial_on_a_file_system_trains_inline_and_no_other():
    assert trains_inline(SPEC)
    assert trial_cpus(SPEC, 0.1) == pytest.approx(0.6)  # its driver's and its worker's CPUs
    others = [
        dataclasses.replace(SPEC, num_workers=2),
        dataclasses.replace(SPEC, use_gpu=True),
        dataclasses.replace(SPEC, storage="s3://bucket/runs"),
    ]
    assert trains_inline(dataclasses.replace(SPEC, role="trial"))  # the search's and seed check's
    assert trial_failures(SPEC).max_failures == 1  # Tune tries it again (Ray Train would)
    for spec in others:
        assert not trains_inline(spec), spec
        assert trial_cpus(spec, 0.1) == pytest.approx(0.1)  # its workers: Ray Train's
        assert trial_failures(spec).max_failures == 0  # (Ray Train's own FailureConfig)


def checkpoint(
    root: str, step: int, score: float | None, complete: bool = True, name: str = ""
) -> str:
    """A checkpoint folder as a step's save and report leave it (``.metadata``: DCP's last
    write; ``metrics.json``: the report; ``score`` None: saved but not reported)."""
    folder = os.path.join(root, name or f"step_{step:08d}")
    os.makedirs(folder)
    if complete:
        open(os.path.join(folder, ".metadata"), "w").close()
    if score is not None:
        report = {"step": step, "ckpt_score": score, "val_auc": score}
        with open(os.path.join(folder, REPORT), "w") as f:
            json.dump(report, f)
    return folder


def nothing(report: dict, folder: str) -> None:
    pass


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_best_two_by_score_and_the_latest_are_kept(tmp_path, mode):
    root = str(tmp_path / "trial_1")
    scores = [0.60, 0.75, 0.70, 0.65, 0.62]
    for i, score in enumerate(scores):
        checkpoint(root, 10 * (i + 1), score if mode == "max" else -score)
    checkpoint(root, 60, None, complete=False)  # being written: not touched
    inline.InlineReporter(root, nothing, mode).prune()
    kept = sorted(os.listdir(root))
    assert kept == ["step_00000020", "step_00000030", "step_00000050", "step_00000060"]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_report_without_a_score_ranks_last_either_way(tmp_path, mode):
    root = str(tmp_path / "trial_1")
    checkpoint(root, 10, 0.5 if mode == "max" else -0.5)
    os.makedirs(os.path.join(root, "step_00000020"))
    open(os.path.join(root, "step_00000020", ".metadata"), "w").close()
    with open(os.path.join(root, "step_00000020", REPORT), "w") as f:
        json.dump({"step": 20}, f)  # (a report with no validation: Ray Train's WORST)
    checkpoint(root, 30, 0.4 if mode == "max" else -0.4)
    checkpoint(root, 40, 0.3 if mode == "max" else -0.3)
    inline.InlineReporter(root, nothing, mode).prune()
    assert sorted(os.listdir(root)) == ["step_00000010", "step_00000030", "step_00000040"]


def test_the_driver_reads_an_inline_run_as_ray_trains_persisted_one(tmp_path):
    root = str(tmp_path / "trial_1")
    with pytest.raises(RuntimeError):  # nothing yet: as Ray Train's ``from_path``
        train_result(root)
    first = checkpoint(root, 10, 0.7)
    last = checkpoint(root, 20, 0.6)
    result = train_result(root)  # (no Ray Train snapshot: the inline run's)
    assert result.metrics["step"] == 20 and result.checkpoint.path == last
    assert [(c.path, m["step"]) for c, m in result.best_checkpoints] == [(first, 10), (last, 20)]
    assert result.get_best_checkpoint("ckpt_score", "max").path == first
    assert result.error is None


def test_the_later_of_ray_trains_run_and_the_inline_one_is_read(tmp_path, monkeypatch):
    """A trial resumed on other workers ran both ways in one folder: the driver reads the one
    that reached the later step (Ray Train's on a tie)."""
    from types import SimpleNamespace

    from recsys.train import results

    root = str(tmp_path / "trial_1")
    checkpoint(root, 60, 0.7)
    ray_train = SimpleNamespace(metrics={"step": 30})
    monkeypatch.setattr(results, "ray_train_result", lambda path, fs: ray_train)
    assert train_result(root).metrics["step"] == 60  # resumed inline after Ray Train's 30
    ray_train.metrics = {"step": 90}
    assert train_result(root) is ray_train  # ... or on Ray Train after the inline 60
    ray_train.metrics = {"step": 60}
    assert train_result(root) is ray_train


def test_a_checkpoint_without_its_report_is_neither_resumed_nor_a_result(tmp_path):
    """A trial killed between its checkpoint's last write and its report: as Ray Train, which
    registers only what was reported, it resumes from the checkpoint before, the driver records
    none of it, and the step's folder is written anew."""
    root = str(tmp_path / "trial_1")
    reporter = inline.InlineReporter(root, nothing, "max")
    checkpoint(root, 10, None)
    assert reporter.checkpoints() == []
    with pytest.raises(RuntimeError):
        inline.persisted(root)
    first = checkpoint(root, 5, 0.6)
    assert reporter.checkpoints() == [first]
    folder = reporter.checkpoint_dir(10)
    assert os.listdir(folder) == []  # (the unreported save removed)


def test_a_step_written_again_after_a_skipped_one_is_the_newer(tmp_path):
    """After a corrupt checkpoint is skipped, the same step's next save is named after it; that
    save is the newer of the two whatever order the folder lists them in."""
    root = str(tmp_path / "trial_1")
    bad = checkpoint(root, 50, 0.9)
    reporter = inline.InlineReporter(root, nothing, "max")
    reporter.skip_names_of(bad)
    good = reporter.checkpoint_dir(50)
    assert os.path.basename(good) == "step_00000050_after_step_00000050"
    open(os.path.join(good, ".metadata"), "w").close()
    with open(os.path.join(good, REPORT), "w") as f:
        json.dump({"step": 50, "ckpt_score": 0.8}, f)
    assert reporter.checkpoints() == [good, bad]
    assert inline.persisted(root).checkpoint.path == good


def test_a_sweep_of_inline_trials_waits_for_a_node_that_holds_driver_and_worker(monkeypatch):
    """One Tune actor holds an inline trial's driver and worker: the cluster must hold both on
    one node (one bundle), not a worker anywhere and a driver anywhere."""
    from recsys.runtime import cluster
    from recsys.tune import sweep
    from recsys.tune.state import SweepOptions

    asked = []
    monkeypatch.setattr(cluster, "connect", lambda address: None)
    monkeypatch.setattr(cluster, "start_train_coordinator", lambda: None)
    monkeypatch.setattr(cluster, "wait_for_fit", lambda *a: asked.append(a))
    monkeypatch.setattr(sweep, "check_nodes_see", lambda *paths: None)
    space = SimpleNamespace(base=SimpleNamespace(data=None))
    monkeypatch.setattr(sweep, "run_paths", lambda storage, data: [])
    for workers, store in [(1, "/runs"), (2, "/runs"), (1, "s3://bucket/runs")]:
        opts = SweepOptions(name="s", storage=store, tracking_uri="sqlite:///x",
                            num_workers=workers, cpus_per_worker=1.5, driver_cpus=0.1,
                            wait_for_nodes=0)  # fmt: skip
        sweep.start_on_ray(space, opts, None)  # type: ignore[arg-type]
    assert asked == [(1, 1.6, 0.0, 0.0, 0), (2, 1.5, 0.0, 0.1, 0), (1, 1.5, 0.0, 0.1, 0)]
