"""A budget in epochs in the product loop (the ``Trainer`` with a local reporter, gloo ranks):
the run ends at the step the epochs come to for its workers, reports (evaluated, checkpointed)
once an epoch or ``reports_per_epoch`` times, and a run resumed on another number of workers
trains the samples it has left."""

from __future__ import annotations

import pytest

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# 1000 synthetic rows: 800 train; 32 a worker: 2 workers read 64 a step, 13 steps an epoch
ROWS, TRAIN_ROWS = 1000, 800


def _config(value, reports=1):
    return tiny_config(
        **{
            "data.synthetic.num_samples": ROWS,
            "train.epochs": value,
            "train.reports_per_epoch": reports,
            # replaced by the budget in epochs
            "train.steps": 5,
            "train.eval_every": 4,
            "train.checkpoint_every": 2,
        }
    )


def _train(rank, world, root, value, reports=1):
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    reporter = LocalReporter(root, rank)
    trainer = Trainer(_config(value, reports), current(False), reporter, log=lambda s: None)
    trainer.train()
    keys = ("step", "epochs_done", "samples_seen", "val_auc", "best_step", "train_steps")
    return {
        "steps": trainer.cfg.train.steps,
        "reports": [{k: r.get(k) for k in keys} for r in reporter.reports],
    }


def test_a_run_of_epochs_ends_at_its_step_and_reports_each_epoch(tmp_path):
    ranks = run_ranks(_train, str(tmp_path / "a"), 2.0)
    for r in ranks:
        assert r["steps"] == 26  # ceil(800 / 64) = 13 steps an epoch, two of them
        assert [x["step"] for x in r["reports"]] == [13, 26]
        assert [x["train_steps"] for x in r["reports"]] == [26, 26]  # what a sweep's status reads
        assert [x["epochs_done"] for x in r["reports"]] == [13 * 64 / 800, 26 * 64 / 800]
        assert all(x["val_auc"] is not None for x in r["reports"])  # every report evaluated
    assert sorted(p.name for p in tmp_path.joinpath("a").iterdir()) == [
        "step_00000013", "step_00000026"
    ]  # fmt: skip
    # two reports an epoch (every 6 steps), the budget's end reports too; a fractional budget
    again = run_ranks(_train, str(tmp_path / "b"), 1.5, 2)[0]
    assert again["steps"] == 20  # ceil(1.5 x 13)
    assert [x["step"] for x in again["reports"]] == [6, 12, 18, 20]


def test_a_resume_on_other_workers_trains_the_samples_left(tmp_path):
    root = str(tmp_path / "run")
    first = run_ranks(_train, root, 1.0)[0]  # one epoch on 2 workers: 13 steps, 832 samples
    assert first["steps"] == 13 and first["reports"][-1]["samples_seen"] == 832
    # two epochs, resumed on 1 worker (32 a step, 25 steps an epoch: a run of 50 steps, 1600
    # samples): 768 samples left are 24 steps, so it ends at step 37, not at 50 nor at once
    resumed = run_ranks(_train, root, 2.0, world_size=1)[0]
    assert resumed["steps"] == 13 + 24
    assert [x["step"] for x in resumed["reports"]] == [25, 37]
    last = resumed["reports"][-1]
    assert last["train_steps"] == 37
    assert last["samples_seen"] == 1600 and last["epochs_done"] == 2.0
