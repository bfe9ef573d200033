"""A trial's score (its best validation report), early stopping, dominance, feasibility before
launch, and the choice of the trial to publish."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.config_registry import debug
from recsys.distributed.checkpoint import TrainState
from recsys.distributed.sharding import Machine
from recsys.train.scoring import WORST, Scorer
from recsys.tune import feasibility
from recsys.tune.results import non_dominated


def test_scorer_keeps_the_best_report_and_counts_reports_since():
    s, state = Scorer("val_ne", "min", patience=2), TrainState()
    seen = []
    for step, ne in [(10, 1.1), (20, 0.9), (30, float("nan")), (40, 0.95), (50, 0.93)]:
        state.step = step
        keys = s.update(state, {"val_ne": ne})
        seen.append((keys["best_val_ne"], keys["best_step"], state.stale, s.should_stop(state)))
    assert seen == [
        (1.1, 10, 0, False),
        (0.9, 20, 0, False),
        (0.9, 20, 1, False),  # a NaN report never improves the score
        (0.9, 20, 2, True),  # two reports without improvement: stop
        (0.9, 20, 3, True),
    ]
    state.step = 60
    keys = s.update(state, {"loss": 0.3})  # a report without validation changes nothing
    assert keys["ckpt_score"] == WORST["min"] and state.stale == 3  # val_ne: lower is better
    assert not Scorer("val_auc", "max", patience=0).should_stop(state)  # 0: never stops


def test_non_dominated_marks_the_trade_off_front():
    points = np.array([[0.80, 100.0], [0.79, 50.0], [0.78, 60.0], [0.81, 200.0], [np.nan, 1.0]])
    assert non_dominated(points, ["max", "min"]).tolist() == [True, True, False, True, False]
    assert non_dominated(np.array([[0.7, 5.0], [0.7, 5.0]]), ["max", "min"]).all()  # ties stand


def test_budget_and_plan_verdicts_name_their_numbers():
    cfg = debug()
    ok = feasibility.check(cfg, {}, Machine("cpu", None, 4 * 2**30), 2, 2)
    assert ok.ok and 0 < ok.numbers["plan_bytes_per_worker"] <= ok.numbers["emb_bytes"]
    over = feasibility.check(cfg, {"emb_bytes_max": 1000}, Machine("cpu", None, 4 * 2**30), 2, 2)
    assert not over.ok and "emb_bytes = 2.474e+06 is over the space's emb_bytes_max" in over.reason
    small = feasibility.check(cfg, {}, Machine("cpu", None, 2**20), 2, 2)
    assert not small.ok and "no sharding plan fits 2 worker(s) with 1 MiB each" in small.reason


@pytest.mark.parametrize("metric", ["val_ne", "val_ne/mean"])  # a task's or the mean: a '/'
def test_the_trial_to_publish_follows_the_sweeps_mode_and_a_memory_budget(tmp_path, metric):
    from recsys.tracking.tracker import Tag, Tracker
    from recsys.tune.publish import best_trial

    uri = f"sqlite:///{tmp_path}/m.db"
    t = Tracker(uri)
    exp = t.experiment("s", None)
    parent = t.parent_run(exp, "s")
    t.set_tags(parent, {Tag.METRIC: metric, Tag.MODE: "min"})
    trials = [("a", 0.90, 3e6, "finished"), ("b", 0.85, 9e6, "early_stopped"),
              ("c", 0.80, 1e6, "diverged"), ("d", 0.95, 1e6, "finished")]  # fmt: skip
    for name, ne, size, status in trials:
        run = t.trial_run(exp, parent, "s", name, {})
        t.log_report(run, {"step": 10, f"best_{metric}": ne, "emb_bytes": size})
        t.set_tags(run, {Tag.STATUS: status, Tag.BEST_CHECKPOINT: f"/ckpt/{name}"})
        t.log_text(run, "{}\n", "config.yaml")
    assert best_trial(t, "s")[1] == "/ckpt/b"  # lowest NE among finished / stopped early
    assert best_trial(t, "s", max_emb_bytes=5e6)[1] == "/ckpt/a"  # under the budget
    with pytest.raises(ValueError, match="no finished trial with tables under 0.9537 MB"):
        best_trial(t, "s", max_emb_bytes=1e6 - 1)
