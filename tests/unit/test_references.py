"""A reference's grid walks its edges: where the best point sits on the edge of a numeric key,
one point a step beyond it (the ratio at that edge; a decade beside a 0), until the best is
inside or the walk took ``MAX_EDGE_STEPS`` steps that side; a 0 at the low edge is closed. And
the default recipes: logistic regression solved over decades of L2, the FM by Adam."""

from __future__ import annotations

import pandas as pd
import pytest

from recsys.tune import baselines
from recsys.tune import references as refs
from recsys.tune.baselines import best_trained, done_line, header
from recsys.tune.references import MAX_EDGE_STEPS, Walk, next_value, walkable
from recsys.tune.space import load
from tests.helpers import space_file


def test_a_step_beyond_an_edge_keeps_the_grids_ratio_there():
    assert next_value([1e-5, 1e-4, 1e-3, 1e-2], "low") == pytest.approx(1e-6)
    assert next_value([1e-5, 1e-4, 1e-3, 1e-2], "high") == pytest.approx(1e-1)
    assert next_value([1e-3, 3e-3, 1e-2], "high") == pytest.approx(1e-2 * 10 / 3)
    assert next_value([0.0, 1e-5], "high") == pytest.approx(1e-4)  # a decade beside the 0
    assert next_value([0.0, 1e-5], "low") is None  # no decay is the end of decays


def test_only_numeric_lines_are_walked():
    assert walkable([1e-3, 1e-2]) and walkable([0, 1e-5])
    assert not walkable([1e-3]) and not walkable([True, False]) and not walkable(["a", "b"])
    assert not walkable([-1.0, 1.0])


def test_a_walk_goes_until_the_best_is_inside_or_its_bound():
    walk = Walk({"optim.weight_decay": [1e-5, 1e-4, 1e-3, 1e-2], "optim.lr": [0.01]})
    best = {"model.arch": "lr", "optim.weight_decay": 1e-2, "optim.lr": 0.01}
    assert walk.edges(best) == [("optim.weight_decay", "high")]
    step = walk.next_points(best)
    assert step == [{"optim.weight_decay": 0.1, "optim.lr": 0.01}]
    assert walk.summary({**best, "optim.weight_decay": 1e-2}) == (
        "weight_decay extended up 1 step to 0.1; best 0.01, inside"
    )
    for _ in range(MAX_EDGE_STEPS + 2):  # the best keeps to the newest edge
        best = {**best, "optim.weight_decay": max(walk.grid["optim.weight_decay"])}
        walk.next_points(best)
    assert walk.steps == {("optim.weight_decay", "high"): MAX_EDGE_STEPS}
    assert max(walk.grid["optim.weight_decay"]) == pytest.approx(10.0)
    assert walk.next_points(best) == []  # at its bound
    assert "still on its edge at the bound" in walk.summary(best)
    assert walk.still_on_edge(best) == ["weight_decay (high)"]


def test_a_best_inside_walks_nothing():
    walk = Walk({"optim.lr": [1e-3, 3e-3, 1e-2], "optim.weight_decay": [0.0, 1e-5]})
    best = {"optim.lr": 3e-3, "optim.weight_decay": 0.0}
    assert walk.next_points(best) == [] and walk.summary(best) == ""  # 0: a closed low edge


def test_logistic_regression_is_solved_over_decades_of_l2(tmp_path):
    body = ("overrides: {train.steps: 40, data.synthetic.num_samples: 4000}\n"
            "space:\n  optim.lr: {loguniform: [0.01, 0.1]}\nbaselines: [lr, fm]\n")  # fmt: skip
    space = load(space_file(tmp_path, body))
    lr, fm = space.references["lr"], space.references["fm"]
    assert lr.rule == fm.rule == "dense" and lr.solved and not fm.solved
    assert lr.grid == {"optim.weight_decay": [1e-5, 1e-4, 1e-3, 1e-2]}
    cfg = space.config_for(lr.points(space.base)[0])
    assert cfg.train.solver == "lbfgs" and cfg.train.epochs == 0 and cfg.model.arch == "lr"
    assert cfg.sharding.default.sharding_types == ["data_parallel"]
    assert fm.overrides["optim.dense_optimizer"] == "adam"
    shared = load(space_file(tmp_path, body.replace("num_samples: 4000}",
                                                    "num_samples: 4000, embeddings.shared: "
                                                    "{cat_1: cat_0}, embeddings.num_embeddings: "
                                                    "[100, 100, 1000, 5000, 20000, 50, 2000, "
                                                    "10000]}")))  # fmt: skip
    assert shared.base.embeddings.shared == {"cat_1": "cat_0"}  # the search's trials share it
    for ref in shared.references.values():  # a table per feature, as a one-hot LR or FM has
        assert shared.config_for(ref.points(shared.base)[0]).embeddings.shared == {}
    line = header(space, "asha")
    assert line.startswith(
        "baselines: lr (4 trials, dense: L-BFGS to its optimum), fm (6 trials, dense); beside "
        "the search, fm under successive halving (the best 1/3 go on at each rung)"
    )  # (not the solved LR: ``halves``)
    assert "edges walked" in line and "edges walked" not in header(
        load(space_file(tmp_path, body), smoke=True), "fifo")  # fmt: skip
    assert refs.references() == ("lr", "fm")


def test_the_reference_is_the_best_trained_to_its_end(tmp_path):
    body = "overrides: {train.steps: 40}\nspace:\n  optim.lr: {choice: [0.1]}\nbaselines: [lr]\n"
    space = load(space_file(tmp_path, body))
    rows = [("a", "stopped", 0.81, 1e-3), ("b", "finished", 0.80, 1e-4),
            ("c", "early_stopped", 0.79, 1e-5)]  # fmt: skip
    frame = pd.DataFrame([{"trial": t, "role": "baseline", "arch": "lr", "status": s,
                           "best_val_auc": v, "params": {"model.arch": "lr",
                                                         "optim.weight_decay": wd}}
                          for t, s, v, wd in rows])  # fmt: skip
    best = best_trained(frame, space)
    assert best is not None and best["trial"] == "b"  # a: stopped at a rung
    walk = Walk(dict(space.references["lr"].grid))
    line = done_line("lr", frame, walk, space)
    assert line == ("reference lr: val_auc 0.8000, best of 2 trained to their end (1 stopped at "
                    "a rung): weight_decay=0.0001")  # fmt: skip


def test_references_share_the_trials_at_once_side_by_side():
    assert baselines.lanes(2, 2) == (2, 1) and baselines.lanes(4, 2) == (2, 2)
    assert baselines.lanes(1, 2) == (1, 1) and baselines.lanes(3, 1) == (1, 3)
    assert baselines.lanes(2, 3) == (2, 1) and baselines.lanes(5, 2) == (2, 2)  # never above


def test_the_header_says_how_the_references_share_the_slots(tmp_path):
    body = "overrides: {train.steps: 40}\nspace:\n  optim.lr: {choice: [0.1]}\n"
    space = load(space_file(tmp_path, body + "baselines: [lr, fm]\n"))
    assert "2 side by side, 1 trial at a time each" in header(space, "fifo", False, slots=2)
    assert "2 side by side, 2 trials at a time each" in header(space, "fifo", False, slots=4)
    assert "side by side" not in header(space, "fifo", False, slots=1)


def test_trial_actors_are_reused_only_where_nothing_ends_a_running_trial():
    """Tune keeps the actor of a trial that ASHA or a stopper ended with its function still in
    ``fit()``; the next trial's reset then fails it (ray-project/ray#29268): no reuse there."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.stopper import MaximumIterationStopper

    from recsys.tune.trial import reuse_actors

    assert reuse_actors() and reuse_actors(FIFOScheduler())
    assert not reuse_actors(ASHAScheduler(time_attr="step", max_t=10, grace_period=1))
    assert not reuse_actors(FIFOScheduler(), stop=MaximumIterationStopper(3))


def test_the_rungs_of_successive_halving_are_reports_a_third_of_the_way_apart():
    from recsys.config import ExperimentConfig

    def cfg(**train):
        return ExperimentConfig.from_dict({"train": train})

    # a budget in epochs (its steps derived): one epoch, three, nine... before the last step
    epochs = cfg(epochs=6.0, steps=120, checkpoint_every=10, eval_every=10)
    assert baselines.rungs(epochs) == [20, 60]
    odd = cfg(epochs=6.0, steps=114, checkpoint_every=9, eval_every=9)  # 19 steps an epoch
    assert baselines.rungs(odd) == [27, 63]  # the first report at or past 19 and 57
    # a budget in steps (the solver's iterations): from two reports
    assert baselines.rungs(cfg(steps=100, checkpoint_every=5, eval_every=5)) == [10, 30, 90]
    assert baselines.rungs(cfg(epochs=1.0, steps=30, checkpoint_every=10)) == []  # one epoch


def test_a_round_keeps_the_best_third_that_paused_and_a_walks_point_meets_the_grid(tmp_path):
    body = "overrides: {train.steps: 40}\nspace:\n  optim.lr: {choice: [0.1]}\nbaselines: [lr]\n"
    space = load(space_file(tmp_path, body))
    key = space.objectives[0].key

    def frame(rows):
        return pd.DataFrame([{"trial": t, "status": s, key: v} for t, s, v in rows])

    grid = frame([
        ("a", "stopped", 0.70), ("b", "stopped", 0.72), ("c", "finished", 0.74),
        ("d", "stopped", 0.60), ("e", "stopped", 0.65), ("f", "stopped", 0.71),
    ])  # fmt: skip

    # the best 6 // 3 = 2: c (ended: nothing to go on with) and b
    def survivors(mine, earlier):  # (a round's rows ranked with the earlier points' of it)
        pool = baselines.ranked_refs([earlier, mine], space)
        return baselines.survivors(pool, set(mine["trial"]))

    assert survivors(grid, pd.DataFrame()) == ["b"]
    # a walk's point at the same rung: the best 7 // 3 = 2 of all seven
    assert survivors(frame([("w", "stopped", 0.73)]), grid) == ["w"]
    assert survivors(frame([("w", "stopped", 0.715)]), grid) == []


def test_a_points_row_is_its_latest_rounds_with_its_best_report_from_the_round_that_holds_it(
    tmp_path,
):
    body = "overrides: {train.steps: 40}\nspace:\n  optim.lr: {choice: [0.1]}\nbaselines: [lr]\n"
    space = load(space_file(tmp_path, body))
    key = space.objectives[0].key  # the run's best so far, carried on by each round's reports

    def row(trial, status, score, best_step, val_auc, last_step):
        return {"trial": trial, "status": status, key: score, "best_step": best_step,
                "val_auc": val_auc, "checkpoint": f"c{best_step}",
                "last_step": last_step}  # fmt: skip

    first = pd.DataFrame(
        [row("p", "stopped", 0.75, 6, 0.75, 6), row("q", "stopped", 0.7, 6, 0.7, 6)]
    )
    # p went on, and never beat its step-6 report: its round's best report is step 9's (0.74)
    second = pd.DataFrame([row("p", "finished", 0.75, 9, 0.74, 15)])
    merged = baselines.across_rounds([first, second], space).set_index("trial")
    p, q = merged.loc["p"], merged.loc["q"]
    assert (p["status"], p["last_step"]) == ("finished", 15)  # its latest round's
    assert (p["best_step"], p["val_auc"], p["checkpoint"]) == (6, 0.75, "c6")  # its best report's
    assert (q["status"], q["best_step"]) == ("stopped", 6)
