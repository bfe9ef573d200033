"""The seed check's statistics, its choice of configurations, the baselines' and seed check's
place in a space file, the table and plot, and the export's pick by confirmed mean."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from recsys.configlib import ConfigError
from recsys.tune import space as spaces
from recsys.tune.confirm import ranked, separation, spread, verdict
from recsys.tune.phases import confirm_points, spreads
from recsys.tune.results import format_table, pareto_plot, with_baselines
from recsys.tune.trial import CONFIRMS


def test_spread_is_numpys_mean_and_std_with_a_t_interval():
    values = [0.7912, 0.7931, 0.7899, 0.7940]
    s = spread("t1", values)
    a = np.array(values)
    half = stats.t.ppf(0.975, 3) * a.std(ddof=1) / 2.0
    assert s.n == 4 and s.mean == a.mean() and s.std == a.std(ddof=1)
    assert s.low == pytest.approx(a.mean() - half, abs=1e-15)
    assert s.high == pytest.approx(a.mean() + half, abs=1e-15)


def test_separation_is_welchs_interval():
    a, b = spread("a", [0.80, 0.81, 0.82]), spread("b", [0.70, 0.72, 0.71, 0.69])
    sep = separation(a, b, "max")
    welch = stats.ttest_ind([0.80, 0.81, 0.82], [0.70, 0.72, 0.71, 0.69], equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert sep.low == pytest.approx(ci.low, abs=1e-12)
    assert sep.high == pytest.approx(ci.high, abs=1e-12)
    assert sep.separable and sep.lead == pytest.approx(0.81 - 0.705)
    # lower is better: the lead is signed so that positive means the leader is better
    assert separation(b, a, "min").lead == pytest.approx(0.81 - 0.705)


def test_a_lead_smaller_than_the_seed_noise_is_reported_not_separable():
    """Planted: two configurations 0.0008 apart whose seed runs spread by about 0.003."""
    rng = np.random.default_rng(0)
    a = spread("a", list(0.8008 + 0.003 * rng.standard_normal(3)))
    b = spread("b", list(0.8000 + 0.003 * rng.standard_normal(3)))
    first, second = ranked([b, a], "max")
    assert not separation(first, second, "max").separable
    text = verdict([a, b], "max", "val_auc")
    assert "are NOT separable" in text and "includes 0" in text
    # the same lead with a spread 100 times smaller is separable
    c, d = spread("c", [0.8008, 0.80081, 0.80079]), spread("d", [0.8000, 0.80001, 0.79999])
    assert "separable" in verdict([c, d], "max", "val_auc")
    assert "NOT" not in verdict([c, d], "max", "val_auc")


SPACE = """
base: debug
overrides: {train.steps: 20, train.seed: 7}
space:
  optim.lr: {loguniform: [0.01, 0.1]}
baselines: [lr, fm]
confirm: {top: 2, seeds: 3}
smoke: {confirm: {top: 1, seeds: 2}}
"""


def frame(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"trial": t, "role": "trial", "arch": "dlrm", "status": s, "best_val_auc": v,
          "params": {"optim.lr": 0.01 * (i + 1)}, "optim.lr": 0.01 * (i + 1), "emb_bytes": 1e6,
          "best_step": 20, "val_log_loss": 0.5, "val_ne": 0.9, "samples_per_s": 1e4,
          "worker_s": 1.0, "pareto": False}
         for i, (t, s, v) in enumerate(rows)]
    )  # fmt: skip


def test_the_best_finished_trials_get_exactly_k_times_n_new_seeds(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SPACE)
    space = spaces.load(str(path))
    assert space.baselines == ["lr", "fm"] and (space.confirm.top, space.confirm.seeds) == (2, 3)
    assert spaces.load(str(path), smoke=True).confirm.trials == 2
    trials = frame([("a", "finished", 0.80), ("b", "error", 0.79), ("c", "stopped", 0.78),
                    ("d", "finished", 0.77)])  # fmt: skip
    points = confirm_points(trials, space)
    assert len(points) == 2 * 3
    assert [(p[CONFIRMS], p["train.seed"]) for p in points] == [
        ("a", 8),
        ("a", 9),
        ("a", 10),
        ("c", 8),
        ("c", 9),
        ("c", 10),
    ]  # the errored trial is skipped; seeds new: the base seed is 7
    assert all(p["optim.lr"] == pytest.approx(0.01 if p[CONFIRMS] == "a" else 0.03) for p in points)


def test_spreads_leave_out_failed_seed_runs_and_name_a_configuration_without_two():
    path_space = spaces.load("default")
    seeds = pd.DataFrame(
        [{"trial": f"s{i}", "confirms": c, "seed": i, "status": st, "best_val_auc": v}
         for i, (c, st, v) in enumerate([("a", "finished", 0.8), ("a", "finished", 0.81),
                                         ("a", "error", math.nan), ("b", "finished", 0.7),
                                         ("b", "diverged", math.nan)])]
    )  # fmt: skip
    found, short = spreads(seeds, path_space)
    assert [(s.trial, s.values) for s in found] == [("a", [0.8, 0.81])]
    assert short == ["  b: 1 seed run(s) finished; no interval"]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("baselines: [lr, xgb]\n", "'xgb' is not a reference model"),
        ("baselines: lr\n", "baselines: a list of"),
        ("baselines: [lr, lr]\n", "lists a model twice"),
        ("confirm: {top: 2}\n", r"confirm: expected \{top: K, seeds: N, references: false\}"),
        ("confirm: {top: 2, seeds: 3, references: 1}\n", "references=1: true or false"),
        ("confirm: {top: 2, seeds: 1}\n", "seeds=1: .* >= 2"),
        ("confirm: {top: 0, seeds: 3}\n", "top=0"),
        ("smoke: {confirms: {top: 1, seeds: 2}}\n", "did you mean 'confirm'"),
        ("overrides: {embeddings.md_alpha: 0.5}\nbaselines: [fm]\n", None),  # dims dropped
        (
            "overrides: {embeddings.qr.threshold: 10, embeddings.qr.operation: concat}\n"
            "baselines: [lr]\n",
            "baselines: lr cannot build from the base: .*use mult or add",
        ),
    ],
)
def test_bad_phase_sections_are_named(tmp_path, body, match):
    path = tmp_path / "s.yaml"
    path.write_text("base: debug\nspace:\n  optim.lr: {uniform: [0.01, 0.1]}\n" + body)
    if match is None:
        space = spaces.load(str(path))
        assert space.base.with_overrides(space.baseline_params("fm")).tables.dims is None
        return
    with pytest.raises(ConfigError, match=match) as err:
        spaces.load(str(path))
    assert "s.yaml" in str(err.value)


def test_the_command_line_replaces_the_spaces_seed_check():
    from recsys.cli.sweep import with_confirm

    space = spaces.load("default")
    assert with_confirm(space, 3, 5).confirm.trials == 15
    assert with_confirm(space, 0, None).confirm.trials == 0
    assert with_confirm(space, None, 4).confirm.top == space.confirm.top
    with pytest.raises(ConfigError, match="seeds=1"):
        with_confirm(space, 2, 1)
    assert not space.confirm.references  # off by default
    checked = with_confirm(space, None, None, references=True).confirm
    assert (checked.top, checked.seeds, checked.references) == (space.confirm.top, 3, True)
    with pytest.raises(ConfigError, match="--confirm-references needs a seed check"):
        with_confirm(space, 0, None, references=True)
    with pytest.raises(ConfigError, match="--confirm-references needs --confirm K"):
        with_confirm(spaces.load("default", smoke=True), None, None, references=True)


def test_baselines_are_marked_in_the_table_and_the_plot(tmp_path):
    space = spaces.load("default")
    trials = frame([("a", "finished", 0.80), ("b", "finished", 0.70)])
    refs = frame([("r1", "finished", 0.75)]).assign(role="baseline", arch="lr", params=[{}])
    both = with_baselines(trials, refs, space)
    assert list(both["trial"]) == ["a", "r1", "b"]
    text = format_table(both, space, top=1)  # the best trial, and every baseline
    lines = text.splitlines()
    assert len(lines) == 3 and "lr (ref)" in lines[2] and " a " in f" {lines[1]} "
    marked = format_table(both, space, top=1, winner="r1").splitlines()  # the best model
    assert "lr (ref) [best]" in marked[2] and "[best]" not in marked[1]
    labels = pareto_plot(both, space, str(tmp_path / "p.png"))
    assert "baselines (references)" in labels and (tmp_path / "p.png").stat().st_size > 0


def test_export_picks_by_confirmed_mean(tmp_path):
    import json

    from recsys.tracking.tracker import Tag, Tracker
    from recsys.tune.publish import best_trial

    t = Tracker(f"sqlite:///{tmp_path}/m.db")
    exp = t.experiment("s", None)
    parent = t.parent_run(exp, "s")
    for name, auc in (("a", 0.81), ("b", 0.80), ("c", 0.79)):
        run = t.trial_run(exp, parent, "s", name, {})
        t.log_report(run, {"step": 10, "best_val_auc": auc})
        t.set_tags(run, {Tag.STATUS: "finished", Tag.BEST_CHECKPOINT: f"/ckpt/{name}"})
        t.log_text(run, "{}\n", "config.yaml")
    base = t.trial_run(exp, parent, "s", "ref", {}, kind="baseline")  # never exported
    t.log_report(base, {"step": 10, "best_val_auc": 0.9})
    t.set_tags(base, {Tag.STATUS: "finished", Tag.BEST_CHECKPOINT: "/ckpt/ref"})
    assert best_trial(t, "s")[1] == "/ckpt/a"  # by its best report
    t.set_tags(parent, {Tag.CONFIRMED_ORDER: json.dumps(["b", "a"])})
    assert best_trial(t, "s")[1] == "/ckpt/b"  # by the confirmed mean


def test_cost_is_an_objective_a_space_may_trade_against(tmp_path):
    path = tmp_path / "s.yaml"
    body = "base: debug\nspace:\n  optim.lr: {uniform: [0.01, 0.1]}\n"
    path.write_text(body + "metric: [val_auc, worker_s]\nmode: [max, min]\n")
    space = spaces.load(str(path))
    keys = [(o.key, o.mode) for o in space.objectives]
    assert keys == [("best_val_auc", "max"), ("worker_s", "min")]
    path.write_text(body + "metric: [val_auc, gpu_hours]\nmode: [max, min]\n")
    with pytest.raises(ConfigError, match="'gpu_hours': further objectives are one of"):
        spaces.load(str(path))
