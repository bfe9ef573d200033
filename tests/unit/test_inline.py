"""A one-worker CPU trial trained in its Tune trial (``recsys.train.inline``): which trials do,
the checkpoints it keeps, and the Train result the driver reads from its folder as it reads Ray
Train's persisted runs."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from recsys.train import inline
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


def checkpoint(root: str, step: int, score: float | None, complete: bool = True) -> str:
    """A checkpoint folder as a step's save and report leave it (``.metadata``: DCP's last
    write; ``metrics.json``: the report; ``score`` None: saved but not reported)."""
    folder = os.path.join(root, f"step_{step:08d}")
    os.makedirs(folder)
    if complete:
        open(os.path.join(folder, ".metadata"), "w").close()
    if score is not None:
        with open(os.path.join(folder, inline.METRICS), "w") as f:
            json.dump({"step": step, "ckpt_score": score, "val_auc": score}, f)
    return folder


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_best_two_by_score_and_the_latest_are_kept(tmp_path, mode):
    root = str(tmp_path / "trial_1")
    scores = [0.60, 0.75, 0.70, 0.65, 0.62]
    for i, score in enumerate(scores):
        checkpoint(root, 10 * (i + 1), score if mode == "max" else -score)
    checkpoint(root, 60, None, complete=False)  # being written: not touched
    inline.InlineReporter(root, lambda report, folder: None, mode).prune()
    kept = sorted(os.listdir(root))
    assert kept == ["step_00000020", "step_00000030", "step_00000050", "step_00000060"]


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


def test_a_checkpoint_without_its_report_is_no_result(tmp_path):
    """A trial killed between its checkpoint's last write and its report: resumable from it
    (complete), but the driver has no report of it to record."""
    root = str(tmp_path / "trial_1")
    checkpoint(root, 10, None)
    assert inline.completed(root) == [os.path.join(root, "step_00000010")]
    with pytest.raises(RuntimeError):
        inline.persisted(root)
