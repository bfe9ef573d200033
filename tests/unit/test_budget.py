"""A training budget in epochs (``train.epochs``): made steps by one pure function for the
workers and the sweep's driver, from the training rows (known without reading the data) and the
workers; ASHA counts it in epochs; a trial's status is decided against its own last step."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from recsys.config import ConfigError, ExperimentConfig
from recsys.data.columns import DataError
from recsys.data.dataset import steps_per_epoch, train_rows, with_budget
from tests.helpers import prepared_log


def epochs(value: float, batch: int = 32, reports: int = 1, **more: object) -> ExperimentConfig:
    return ExperimentConfig().with_overrides(
        {"train.epochs": value, "train.batch_size": batch, "train.reports_per_epoch": reports,
         **more}
    )  # fmt: skip


# --- the derivation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "batch", "world", "value", "per_epoch", "steps"),
    [
        (1000, 10, 1, 1.0, 100, 100),  # divides: an epoch is exactly the split
        (1000, 10, 2, 1.0, 50, 50),  # twice the workers, half the steps
        (1000, 30, 1, 1.0, 34, 34),  # 33.3 steps: the last batch is filled from the next epoch
        (1000, 30, 2, 3.0, 17, 51),  # 16.7 an epoch -> 17, three of them
        (1000, 30, 3, 2.5, 12, 30),  # 11.1 -> 12, x 2.5
        (1000, 64, 4, 0.5, 4, 2),  # half an epoch of 3.9 -> 4 steps: 2
        (1000, 7, 3, 0.1, 48, 5),  # 0.1 x 48 = 4.8 -> 5
        (300, 10, 1, 0.1, 30, 3),  # 0.1 x 30 is 3.0000000000000004 in floats: still 3
        (5, 256, 8, 2.0, 1, 2),  # fewer rows than one global batch: one step an epoch
        (1000, 10, 1, 1e-9, 100, 1),  # at least one step
    ],
)
def test_steps_come_from_rows_workers_and_batch(rows, batch, world, value, per_epoch, steps):
    cfg = with_budget(epochs(value, batch), rows, world)
    assert steps_per_epoch(rows, batch, world) == per_epoch == math.ceil(rows / (batch * world))
    assert cfg.train.steps == steps
    assert cfg.train.eval_every == cfg.train.checkpoint_every == per_epoch
    assert cfg.train.epochs == value and cfg.train.batch_size == batch  # the rest is kept
    assert with_budget(cfg, rows, world) == cfg  # idempotent: a derived config derives to itself


@pytest.mark.parametrize(
    ("per_epoch_rows", "reports", "every"),
    [(1000, 1, 100), (1000, 2, 50), (1000, 3, 33), (1000, 4, 25), (1000, 100, 1), (1000, 500, 1)],
)
def test_reports_per_epoch_sets_the_report_interval(per_epoch_rows, reports, every):
    cfg = with_budget(epochs(2.0, 10, reports), per_epoch_rows, 1)
    assert cfg.train.checkpoint_every == every
    # evaluation at every report: eval_every is a multiple (the same) of checkpoint_every
    assert cfg.train.eval_every % cfg.train.checkpoint_every == 0
    assert cfg.train.eval_every == cfg.train.checkpoint_every
    assert cfg.train.steps == 200


def test_given_steps_and_intervals_are_replaced_and_steps_budgets_left_alone():
    given = {"train.steps": 7, "train.eval_every": 6, "train.checkpoint_every": 3}
    cfg = with_budget(epochs(1.0, 10, **given), 1000, 1)
    assert (cfg.train.steps, cfg.train.eval_every, cfg.train.checkpoint_every) == (100, 100, 100)
    plain = ExperimentConfig().with_overrides(given)
    assert with_budget(plain, 1000, 4) is plain  # train.epochs 0: train.steps counts
    assert with_budget(plain, 0, 0) is plain


def test_the_budget_is_in_samples_on_a_resume_with_other_workers():
    # 1000 rows, 10 a worker: 2 epochs on 2 workers are 100 steps of 20 samples
    cfg = epochs(2.0, 10)
    assert with_budget(cfg, 1000, 2, done_steps=50, done_samples=1000).train.steps == 100
    # one epoch done on 2 workers (50 steps), resumed on 4 (40 a step): 25 steps left, not 0
    assert with_budget(cfg, 1000, 4, done_steps=50, done_samples=1000).train.steps == 75
    # ... resumed on 1 (10 a step): 100 steps left, not 150
    assert with_budget(cfg, 1000, 1, done_steps=50, done_samples=1000).train.steps == 150
    # on 3 (30 a step, 34 steps an epoch): what a run on 3 trains (68 steps, 2040 samples) less
    # the samples done, rounded up to whole steps
    assert with_budget(cfg, 1000, 3, done_steps=50, done_samples=1000).train.steps == 50 + 35
    # a finished (or over-trained) run has nothing left
    assert with_budget(cfg, 1000, 1, done_steps=100, done_samples=2000).train.steps == 100
    assert with_budget(cfg, 1000, 4, done_steps=100, done_samples=2000).train.steps == 100
    # a checkpoint that counted no samples: its steps at the current global batch
    assert with_budget(cfg, 1000, 2, done_steps=30, done_samples=0).train.steps == 100


def test_a_budget_without_rows_or_workers_is_refused():
    with pytest.raises(ConfigError, match=r"train.epochs=1.0.*0 rows"):
        with_budget(epochs(1.0), 0, 2)
    with pytest.raises(ConfigError, match=r"0 workers"):
        with_budget(epochs(1.0), 100, 0)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("train.epochs", -1, r"train.epochs=-1.0: must be a number >= 0"),
        ("train.epochs", float("inf"), r"train.epochs=inf: must be a number >= 0"),
        ("train.epochs", float("nan"), r"train.epochs=nan: must be a number >= 0"),
        ("train.reports_per_epoch", 0, r"train.reports_per_epoch=0: must be >= 1"),
        ("train.epochs", "two", r"train.epochs: expected float"),
    ],
)
def test_config_refuses_bad_budgets(key, value, match):
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig().with_overrides({key: value})


def test_epochs_default_off_and_ints_are_taken():
    assert ExperimentConfig().train.epochs == 0.0
    assert ExperimentConfig().train.reports_per_epoch == 1
    assert ExperimentConfig().with_overrides({"train.epochs": 3}).train.epochs == 3.0


# --- the training rows, without reading the data --------------------------------------------


def _loaded_train_rows(cfg: ExperimentConfig) -> int:
    from recsys.data.input.loader import load_splits

    return len(load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).train)


@pytest.mark.parametrize(
    ("n", "val", "test"), [(20_000, 0.1, 0.1), (1001, 0.15, 0.05), (999, 0.0, 0.25), (7, 0.3, 0.3)]
)
def test_synthetic_train_rows_match_the_split(n, val, test):
    cfg = ExperimentConfig().with_overrides(
        {"data.synthetic.num_samples": n, "data.val_fraction": val, "data.test_fraction": test}
    )
    assert train_rows(cfg) == _loaded_train_rows(cfg)
    refit = cfg.with_overrides({"data.refit": True})
    if val == 0:
        with pytest.raises(DataError, match="data.refit: .* has no validation rows to add"):
            _loaded_train_rows(refit)
    else:
        assert train_rows(refit) == _loaded_train_rows(refit) == n - round(n * test)


def test_prepared_train_rows_come_from_meta(tmp_path):
    from recsys.data.dataset import resolve
    from recsys.data.input.loader import load_splits

    folder = prepared_log(tmp_path, {"click": np.arange(1000) % 2})
    cfg = resolve(ExperimentConfig().with_overrides({"data.source": "prepared",
                                                     "data.paths": [folder]}))  # fmt: skip
    assert train_rows(cfg) == _loaded_train_rows(cfg) == 600
    refit = cfg.with_overrides({"data.refit": True})  # training, then validation rows
    assert train_rows(refit) == _loaded_train_rows(refit) == 800
    splits = load_splits(refit.data, refit.model.num_dense, refit.embeddings.num_embeddings)
    plain = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    joined, (before, after) = splits.train.read(590, 610), (plain.train.read(590, 600),
                                                             plain.val.read(0, 10))  # fmt: skip
    for name in ("sparse", "labels"):
        want = np.concatenate([getattr(before, name), getattr(after, name)])
        assert np.array_equal(getattr(joined, name), want)
    assert np.array_equal(splits.test.read(0, 200).labels, plain.test.read(0, 200).labels)
    missing = cfg.with_overrides({"data.paths": [str(tmp_path / "nothing")]})
    with pytest.raises(ConfigError, match="not a prepared folder"):
        train_rows(missing)


def _torchrec_folder(folder, rows: list[int]) -> str:
    folder.mkdir()
    for k, n in enumerate(rows):
        np.save(folder / f"day_{k}_dense.npy", np.full((n, 13), np.log(2), np.float32))
        np.save(folder / f"day_{k}_sparse.npy", np.zeros((n, 26), np.int32))
        np.save(folder / f"day_{k}_labels.npy", (np.arange(n) % 2).reshape(n, 1).astype(np.int32))
    return str(folder)


@pytest.mark.parametrize("split", ["fraction", "files"])
def test_torchrec_train_rows_come_from_the_file_headers(tmp_path, split):
    folder = _torchrec_folder(tmp_path / "days", [300, 200, 150, 101])
    cfg = ExperimentConfig().with_overrides({
        "data.source": "torchrec", "data.paths": [folder], "data.split": split,
        "data.torchrec_dense_min": 0, "embeddings.num_embeddings": [10] * 26,
    })  # fmt: skip
    expected = {"fraction": 751 - round(75.1) - round(75.1), "files": 500}[split]
    assert train_rows(cfg) == _loaded_train_rows(cfg) == expected
    refit = cfg.with_overrides({"data.refit": True})
    plus = {"fraction": round(75.1), "files": 150}[split]
    assert train_rows(refit) == _loaded_train_rows(refit) == expected + plus
    empty = cfg.with_overrides({"data.paths": [str(tmp_path / "none")]})
    with pytest.raises(ConfigError, match="train.epochs needs the training rows"):
        train_rows(empty)


def test_synthetic_files_split_is_refused():
    cfg = ExperimentConfig().with_overrides({"data.split": "files"})
    with pytest.raises(ConfigError, match="needs >= 3 files"):
        train_rows(cfg)


# --- the sweep: ASHA in epochs, the driver's steps, a trial's status ------------------------


def _space(**overrides: object):
    from recsys.tune.space import SearchSpace

    base = ExperimentConfig().with_overrides(
        {"data.synthetic.num_samples": 10_000, "train.batch_size": 64, **overrides}
    )  # 8000 training rows
    return SearchSpace("s", "s.yaml", base, [])


def _opts(scheduler: str = "asha", workers: int = 2):
    from recsys.tune.state import SweepOptions

    return SweepOptions(name="s", storage="/tmp/unused", tracking_uri="sqlite:///unused",
                        scheduler=scheduler, num_workers=workers)  # fmt: skip


def test_asha_of_an_epochs_space_counts_in_epochs():
    from recsys.tune.sweep import _scheduler, budgeted
    from recsys.tune.trial import EPOCHS_DONE

    space = _space(**{"train.epochs": 4})
    asha = _scheduler(_opts(workers=2), space, single=False)
    assert asha._time_attr == EPOCHS_DONE == "epochs_done"
    assert asha._max_t == 4.0
    rungs = sorted(m for m, _ in asha._brackets[0]._rungs)
    assert rungs[0] == 1.0  # the grace period: one epoch
    assert rungs == [1.0, 4.0]  # reduction factor 4
    # the same epochs whatever the workers (Tune restores the scheduler as saved on a resume);
    # the steps they come to are the driver's (8000 rows / (64 x 2) = 63 steps an epoch)
    assert _scheduler(_opts(workers=4), space, single=False)._max_t == 4.0
    assert budgeted(space, 2).base.train.steps == 4 * 63
    assert budgeted(space, 4).base.train.steps == 4 * 32
    # shorter than an epoch: the grace period is the whole budget
    assert _scheduler(_opts(), _space(**{"train.epochs": 0.5}), single=False)._max_t == 0.5
    short = _scheduler(_opts(), _space(**{"train.epochs": 0.5}), single=False)
    assert [m for m, _ in short._brackets[0]._rungs] == [0.5]


def test_hyperband_is_asha_with_three_brackets_of_longer_grace():
    from recsys.tune.sweep import _scheduler

    hyperband = _scheduler(_opts("hyperband"), _space(**{"train.epochs": 16}), single=False)
    firsts = [min(m for m, _ in b._rungs) for b in hyperband._brackets]
    assert firsts == [1.0, 4.0, 16.0]  # each bracket's grace: 1, 4, 16 epochs (the maximum)
    assert (
        len(_scheduler(_opts("asha"), _space(**{"train.epochs": 16}), single=False)._brackets) == 1
    )


def test_asha_in_epochs_stops_weak_trials_at_a_rung_and_never_at_the_maximum():
    from ray.tune.schedulers import TrialScheduler

    from recsys.tune.sweep import _scheduler

    asha = _scheduler(_opts(), _space(**{"train.epochs": 4}), single=False)
    trials = [SimpleNamespace(trial_id=f"t{i}") for i in range(5)]
    for t in trials:
        asha.on_trial_add(None, t)

    def report(t, done, score):
        return asha.on_trial_result(None, t, {"epochs_done": done, "best_val_auc": score})

    for t, score in zip(trials[:4], [0.70, 0.72, 0.74, 0.76], strict=True):
        assert report(t, 1.02, score) == TrialScheduler.CONTINUE  # before the rung: no cut
    assert report(trials[4], 0.51, 0.50) == TrialScheduler.CONTINUE  # not yet at one epoch
    assert report(trials[4], 1.02, 0.50) == TrialScheduler.STOP  # at the rung, the weakest
    # the best trial's last report passes train.epochs a little: it ends by itself
    assert report(trials[3], 4.08, 0.80) == TrialScheduler.CONTINUE


def test_asha_of_a_steps_space_counts_in_steps_and_never_stops_at_the_maximum():
    from ray.tune.schedulers import TrialScheduler

    from recsys.tune.sweep import _scheduler

    space = _space(**{"train.steps": 300, "train.checkpoint_every": 50, "train.eval_every": 50})
    asha = _scheduler(_opts(), space, single=False)
    assert (asha._time_attr, asha._max_t) == ("step", 300)
    assert min(m for m, _ in asha._brackets[0]._rungs) == 50
    trial = SimpleNamespace(trial_id="t0")
    asha.on_trial_add(None, trial)
    # its last report: the trial ends by itself (Train finishes it), Tune does not stop it there
    last = asha.on_trial_result(None, trial, {"step": 300, "best_val_auc": 0.7})
    assert last == TrialScheduler.CONTINUE
    assert type(_scheduler(_opts("fifo"), space, single=False)).__name__ == "FIFOScheduler"


def test_the_driver_prints_what_the_budget_came_to():
    from recsys.tune.sweep import budget_line, budgeted

    space = budgeted(_space(**{"train.epochs": 3, "train.reports_per_epoch": 2}), 2)
    line = budget_line(space, 2)
    assert line == (
        "budget: 3 epochs of 8000 training rows = 189 steps of 2 workers x 64 (63 steps an "
        "epoch), a report every 31 steps"
    )
    assert budget_line(_space(), 2) == ""


def test_a_trial_config_has_its_own_steps():
    from recsys.tune.trial import TrialSpec, trial_config

    space = _space(**{"train.epochs": 2})
    spec = TrialSpec("s", space.base.to_dict(), "/tmp", "sqlite:///x", "0", "p", 2, False, 1.0, 0)
    cfg = trial_config(spec, {"train.batch_size": 32})  # a swept batch size: its own steps
    assert cfg.train.steps == 2 * 125
    assert cfg.train.eval_every == cfg.train.checkpoint_every == 125
    assert trial_config(spec, {}).train.steps == 2 * 63


def test_a_trial_status_is_decided_against_its_own_last_step():
    from recsys.tune.results import trial_status

    # the workers report the step they train to: a trial with a larger batch ends earlier
    assert trial_status({"step": 126, "train_steps": 126}, 252) == "finished"
    assert trial_status({"step": 126, "train_steps": 252}, 126) == "stopped"
    assert trial_status({"step": 126}, 126) == "finished"  # no own steps: the sweep's
    assert trial_status({"step": 126, "train_steps": math.nan}, 126) == "finished"
    assert trial_status({"step": 6, "train_steps": 126, "early_stopped": 1.0}, 126) == (
        "early_stopped"
    )
