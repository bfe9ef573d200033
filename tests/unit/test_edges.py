"""A finished search reads its own edges and early peaks: a range whose 3 best trials all sit in
its outer tenth (a loguniform one on a log scale), a numeric choice whose 3 best all took its
smallest or largest value, each said in a line and widened by ``--more N --widen``; most trials
peaking within the first tenth of their budget, said with what to change."""

from __future__ import annotations

import pandas as pd

from recsys.tune.edges import early_peaks, edge_of, search_edges, widen, widened
from recsys.tune.space import Dimension, load
from recsys.tune.state import SweepOptions, save_state, start_growth, widenings
from tests.helpers import space_file

BODY = (
    "overrides: {train.steps: 100, data.synthetic.num_samples: 4000}\n"
    "space:\n"
    "  optim.lr: {loguniform: [0.001, 0.1]}\n"
    "  embeddings.dim: {choice: [8, 16, 32]}\n"
    "  model.interaction: {choice: [dot, cat, sum]}\n"
    "  loss.weights: {choice: [[1.0, 1.0], [1.0, 2.0]]}\n"
)


def trials(rows: list[tuple[float, float, int, str, int]]) -> pd.DataFrame:
    """Ranked search rows: (score, lr, dim, interaction, best_step) of 100-step trials."""
    frame = pd.DataFrame([{"trial": f"t{i}", "role": "trial", "status": "finished",
                           "best_val_auc": s, "best_step": b, "train_steps": 100,
                           "params": {"optim.lr": lr, "embeddings.dim": d,
                                      "model.interaction": op, "loss.weights": [1.0, 1.0]}}
                          for i, (s, lr, d, op, b) in enumerate(rows)])  # fmt: skip
    return frame.sort_values("best_val_auc", ascending=False).reset_index(drop=True)


def test_the_best_trials_at_a_ranges_top_and_a_choices_largest_are_edges(tmp_path):
    space = load(space_file(tmp_path, BODY))
    frame = trials([(0.80, 0.09, 32, "dot", 50), (0.79, 0.07, 32, "cat", 40),
                    (0.78, 0.08, 32, "sum", 60), (0.70, 0.002, 8, "dot", 90)])  # fmt: skip
    edges = {e.dim.key: e for e in search_edges(frame, space)}
    assert set(edges) == {"optim.lr", "embeddings.dim"}  # no order among interactions
    lr, dim = edges["optim.lr"], edges["embeddings.dim"]
    assert (lr.side, dim.side) == ("high", "high")
    assert lr.line() == (
        "edge: optim.lr: the 3 best trials sit in the top tenth of loguniform [0.001, 0.1] "
        "(0.09, 0.07, 0.08): its optimum may lie beyond; --more N --widen searches [0.001, 1.0]"
    )
    assert "top value of choice [8, 16, 32]" in dim.line() and "[8, 16, 32, 64]" in dim.line()
    assert lr.saved() == {"key": "optim.lr", "side": "high"}


def test_the_best_spread_over_a_range_or_too_few_are_no_edge(tmp_path):
    space = load(space_file(tmp_path, BODY))
    spread = trials([(0.80, 0.09, 8, "dot", 50), (0.79, 0.002, 32, "cat", 40),
                     (0.78, 0.01, 16, "sum", 60)])  # fmt: skip
    assert search_edges(spread, space) == []
    assert search_edges(spread.head(2), space) == []  # fewer than 3 scored: nothing said
    lr = Dimension("optim.lr", "loguniform", [0.001, 0.1])
    assert edge_of(lr, [0.0012, 0.0014, 0.0011]) == "low"  # the bottom tenth of the log range
    assert edge_of(lr, [0.0012, 0.002, 0.0011]) is None  # 0.002 is 15% of the way up


def test_widening_a_side_by_its_kind():
    assert widened(Dimension("k", "loguniform", [0.01, 0.1]), "low").values == [0.001, 0.1]
    assert widened(Dimension("k", "uniform", [0.1, 2.0]), "high").values == [0.1, 3.9]
    assert widened(Dimension("k", "uniform", [0.5, 2.0]), "low").values == [0, 2.0]  # >= 0 kept
    assert widened(Dimension("k", "randint", [2, 9]), "high").values == [2, 16]
    assert widened(Dimension("k", "choice", [8, 16]), "low").values == [4, 8, 16]
    assert widened(Dimension("k", "choice", [0.0, 0.1, 0.3]), "high").values == [0.0, 0.1, 0.3,
                                                                                   0.9]  # fmt: skip
    dropout = Dimension("k", "choice", [0.0, 0.1, 0.2, 0.3])  # as printed: 0.45, not 0.4499...
    assert widened(dropout, "high").values == [0.0, 0.1, 0.2, 0.3, 0.45]


def test_most_trials_peaking_in_their_first_tenth_is_said(tmp_path):
    space = load(space_file(tmp_path, BODY))
    frame = trials([(0.8, 0.01, 8, "dot", 10), (0.79, 0.01, 8, "dot", 5),
                    (0.78, 0.01, 8, "dot", 90)])  # fmt: skip
    peaks = early_peaks(frame, space)
    assert (peaks.early, peaks.of, peaks.most) == (2, 3, True)
    assert peaks.line().startswith("early peaks: 2 of 3 trials peaked within the first tenth of "
                                   "their budget (best_step <= 10 of 100)")  # fmt: skip
    assert "train.reports_per_epoch" in peaks.line() and "lower the learning rates" in peaks.line()
    assert not early_peaks(frame.tail(2), space).most  # 1 of 2: not most


def test_a_widened_growth_is_recorded_with_its_space(tmp_path):
    space = load(space_file(tmp_path, BODY))
    opts = SweepOptions(name="s", storage=str(tmp_path / "runs"), tracking_uri="x", more=4,
                        widen=True)  # fmt: skip
    save_state(space, opts)
    from recsys.tune.state import mark_finished, saved_edges

    mark_finished(opts, 8, edges=[{"key": "optim.lr", "side": "high"}])
    assert saved_edges(opts) == [{"key": "optim.lr", "side": "high"}]
    assert start_growth(opts) == 1
    from recsys.tune.state import growths

    (part,) = growths(opts)
    assert widenings(part) == [{"key": "optim.lr", "side": "high"}]
    wide = widen(space, widenings(part))
    assert next(d for d in wide.dimensions if d.key == "optim.lr").values == [0.001, 1.0]
    assert wide.raw["space"]["optim.lr"] == {"loguniform": [0.001, 1.0]}
    from recsys.tune.sweep import searched_space

    assert searched_space(space, growths(opts)).dimensions == wide.dimensions
