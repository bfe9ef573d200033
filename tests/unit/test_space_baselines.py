"""A space's references (``baselines``): the default rules, a grid set in the file, the smoke
variant's one trial each, every mistake named before launch with its key; and the best of each
reference's trials is the one the summary, the table and the leads compare with."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from recsys.configlib import ConfigError
from recsys.tune import references as refs
from recsys.tune import space as spaces
from recsys.tune.baselines import header
from recsys.tune.phases import REFERENCE, Outcome, Winner, chosen_references
from tests.helpers import space_file

SEARCH = "space:\n  optim.lr: {loguniform: [0.01, 0.1]}\n"
BUDGET = "overrides: {train.steps: 40, data.synthetic.num_samples: 4000}\n"


def load(tmp_path, body: str, smoke: bool = False) -> spaces.SearchSpace:
    return spaces.load(space_file(tmp_path, BUDGET + SEARCH + body), smoke=smoke)


# tables of 8 x 3M rows: more values than a reference trains dense (DENSE_TABLE_MAX_VALUES)
BIG = "overrides: {embeddings.num_embeddings: [3000000, 3000000, 3000000, 3000000, 3000000, " \
      "3000000, 3000000, 3000000]}\n"  # fmt: skip


def rules(arch: str, dense: bool) -> tuple[dict, dict]:
    """The default grid and fixed keys of reference ``arch``: its dense recipe or fused one."""
    recipe = refs.RECIPES[arch]["dense" if dense else "fused"]
    extra = refs.DENSE_REFERENCE_RULES if dense else {}
    return recipe.grid, {**refs.REFERENCE_RULES, **extra, **recipe.overrides}


def baseline_points(space: spaces.SearchSpace) -> list[dict]:
    return space.reference_points()


@pytest.mark.parametrize("dense", [True, False], ids=["small-tables", "big-tables"])
def test_a_list_takes_the_default_rules(tmp_path, dense):
    """The default space's tables (8 x 1000 rows) are small: its references train them dense
    (every row decayed at every step, Adam for the FM); tables of 24M rows keep FBGEMM's fused
    optimizer and its grid."""
    body = "baselines: [lr, fm]\n"
    space = (
        load(tmp_path, body) if dense else spaces.load(space_file(tmp_path, BIG + SEARCH + body))
    )
    assert space.baselines == ["lr", "fm"]
    points = baseline_points(space)
    expect = {a: rules(a, dense) for a in ("lr", "fm")}
    assert len(points) == sum(math.prod(len(v) for v in g.values()) for g, _ in expect.values())
    for point in points:
        arch = point["model.arch"]
        grid, fixed = expect[arch]
        assert {k: point[k] for k in fixed} == fixed
        for key, values in grid.items():
            assert point[key] in values
        if dense:  # building the big tables' configs is the fused case's cost alone
            cfg = space.config_for(point)  # every trial builds, trained to convergence
            assert cfg.model.arch == arch and cfg.train.patience > 0
            assert (cfg.train.solver == "lbfgs") == (arch == "lr")  # LR solved, FM by epochs
            assert cfg.train.epochs > 0 or arch == "lr"
            assert cfg.sharding.default.compute_kernels == ["dense"]
    for arch in ("lr", "fm"):  # each grid point once
        grid = expect[arch][0]
        mine = [tuple(p[k] for k in grid) for p in points if p["model.arch"] == arch]
        assert len(set(mine)) == len(mine) <= refs.MAX_REFERENCE_TRIALS
    trials = ("lr (4 trials, dense: L-BFGS to its optimum), fm (6 trials, dense)" if dense
              else "lr (4 trials, fused), fm (4 trials, fused)")  # fmt: skip
    assert header(space, "asha").startswith(f"baselines: {trials}")


def test_the_smoke_variant_trains_each_reference_once_with_its_own_budget(tmp_path):
    body = "baselines: [lr, fm]\nsmoke: {overrides: {train.steps: 7}}\n"
    space = load(tmp_path, body, smoke=True)
    points = baseline_points(space)
    assert [p["model.arch"] for p in points] == ["lr", "fm"]
    for point in points:
        assert not set(point) & set(refs.BUDGET_KEYS)  # the smoke budget governs
        grid, _ = rules(point["model.arch"], dense=True)
        assert all(point[k] == v[0] for k, v in grid.items())  # each key's first value
        cfg = space.config_for(point)
        assert cfg.train.steps == 7 and cfg.train.epochs == 0


def test_a_mapping_sets_an_archs_grid_and_fixed_keys(tmp_path):
    body = (
        "baselines:\n"
        "  fm:\n"
        "    rule: fused\n"
        "    grid: {optim.embedding_lr: [0.02, 0.05, 0.1], embeddings.dim: [8, 16]}\n"
        "    overrides: {train.epochs: 3, train.patience: 1}\n"
        "  lr: {}\n"
    )
    space = load(tmp_path, body)
    assert space.baselines == ["fm", "lr"]
    fm = [p for p in baseline_points(space) if p["model.arch"] == "fm"]
    assert len(fm) == 6 and space.references["fm"].trials == 6
    assert {(p["optim.embedding_lr"], p["embeddings.dim"]) for p in fm} == {
        (lr, d) for lr in (0.02, 0.05, 0.1) for d in (8, 16)
    }
    assert all(p["train.epochs"] == 3 and p["train.patience"] == 1 for p in fm)
    assert space.references["lr"].grid == rules("lr", dense=True)[0]  # {}: the defaults (dense)
    assert "sharding.default.compute_kernels" not in fm[0]  # rule: fused, though small
    assert (space.references["fm"].rule, space.references["lr"].rule) == ("fused", "dense")
    cfg = space.config_for(fm[0])
    assert cfg.tables.dim == fm[0]["embeddings.dim"] + 4  # the FM's factors and its linear part


def test_the_rule_follows_the_tables_the_entry_makes(tmp_path):
    """An entry's own overrides size its tables: 8 x 3M rows there make the fused rule."""
    rows = ", ".join(["3000000"] * 8)
    body = f"baselines:\n  lr: {{overrides: {{embeddings.num_embeddings: [{rows}]}}}}\n  fm: {{}}\n"
    space = load(tmp_path, body)
    assert (space.references["lr"].rule, space.references["fm"].rule) == ("fused", "dense")
    assert space.references["lr"].grid == refs.RECIPES["lr"]["fused"].grid
    big, small = ", ".join(["3000000"] * 8), ", ".join(["1000"] * 8)  # a grid point sizes too
    body = f"baselines:\n  lr: {{grid: {{embeddings.num_embeddings: [[{small}], [{big}]]}}}}\n"
    assert load(tmp_path, body).references["lr"].rule == "fused"


def test_a_dense_reference_ignores_the_bases_fused_decay(tmp_path):
    """The base's fused embedding decay (fp16 tables, as on CPU workers) is not the dense
    rule's: its fp32 replicas would be refused on CPU with it (``check_fused_decay``)."""
    from recsys.distributed.sharding import check_fused_decay

    base = (
        "overrides: {train.steps: 40, optim.embedding_weight_decay: 1.0e-4, "
        "embeddings.dtype: fp16}\n"
    )
    space = spaces.load(space_file(tmp_path, base + SEARCH + "baselines: [lr]\n"))
    for point in baseline_points(space):
        cfg = space.config_for(point)
        assert cfg.embeddings.dtype == "fp32" and cfg.optim.embedding_weight_decay == 0.0
        check_fused_decay(cfg.optim, "cpu", half=False)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("baselines: {lr: {grd: {}}}\n", r"baselines.lr: unknown 'grd'.*did you mean 'grid'"),
        (
            "baselines: {lr: {grid: {optim.embeding_lr: [0.1]}}}\n",
            r"baselines.lr.grid: unknown config key 'optim.embeding_lr'.*optim.embedding_lr",
        ),
        (
            "baselines: {fm: {overrides: {train.epoch: 3}}}\n",
            r"baselines.fm.overrides: unknown config key 'train.epoch'.*train.epochs",
        ),
        ("baselines: {lr: {grid: {optim.lr: []}}}\n", r"grid.optim.lr: a non"),
        ("baselines: {lr: {grid: {optim.lr: 0.1}}}\n", r"grid.optim.lr: a non"),
        ("baselines: {lr: {grid: {}}}\n", r"baselines.lr.grid: a non-empty mapping"),
        ("baselines: {lr: {grid: {model.arch: [fm]}}}\n", r"model.arch is the reference's own"),
        ("baselines: {xgb: {}}\n", r"'xgb' is not a reference model"),
        ("baselines: {lr: [0.1]}\n", r"baselines.lr: expected \{grid: ..., overrides: ...\}"),
        (
            "baselines:\n  lr: {grid: {optim.weight_decay: [1, 2, 3], optim.lr: [1, 2, 3]}}\n",
            r"baselines.lr.grid: 3 x 3 = 9 trials; a reference's grid has at most 8",
        ),
        (
            "baselines: {fm: {rule: fused, grid: {optim.embedding_lr: [0.1, -1.0]}}}\n",
            r"baselines.fm: the trial with \{'optim.embedding_lr': -1.0\} cannot build: "
            r"optim.embedding_lr=-1.0",
        ),
        (
            "baselines: {lr: {grid: {optim.embedding_lr: [0.01, 0.03]}}}\n",
            r"baselines.lr.grid: optim.embedding_lr does nothing here: .*dense.*rule: fused",
        ),
        ("baselines: {lr: {rule: sparse}}\n", r"baselines.lr.rule: 'sparse', one of \['auto'"),
        (
            "baselines: {lr: {overrides: {optim.embedding_weight_decay: 0.1}}}\n",
            r"baselines.lr.overrides: optim.embedding_weight_decay does nothing here",
        ),
        (
            "baselines: {lr: {overrides: {train.reports_per_epoch: 0}}}\n",
            r"baselines.lr: the trial with .* cannot build: train.reports_per_epoch=0",
        ),
        ("smoke: {baselines: {lr: {grid: {optim.lr: []}}}}\n", r"grid.optim.lr: a non-empty"),
        ("baselines: {lr: {overrides: [1]}}\n", r"baselines.lr.overrides: a mapping of config"),
        (
            "baselines: {lr: {overrides: {embeddings.dtype: fp16}}}\n",
            r"baselines.lr.overrides: embeddings.dtype is the dense rule's own.*rule: fused",
        ),
        (
            "baselines: {fm: {grid: {sharding.default.sharding_types: [[table_wise]]}}}\n",
            r"baselines.fm.grid: sharding.default.sharding_types is the dense rule's own",
        ),
        (
            "baselines: {lr: {rule: fused, grid: {optim.lr: [0.01, 0.1]}}}\n",
            r"baselines.lr.grid: \['optim.lr'\] under the fused rule .* tunes only the weights "
            r"outside the tables.*rule: dense",
        ),
    ],
)
def test_a_bad_reference_is_named_with_its_key(tmp_path, body, match):
    with pytest.raises(ConfigError, match=match) as err:
        load(tmp_path, body, smoke="smoke:" in body)
    assert "s.yaml" in str(err.value)


def test_the_keys_every_trial_of_a_reference_sets_go_in_its_specs_base(tmp_path):
    """A reference's trials carry the arch and their grid values as params (the console line,
    ``recsys.searched``); the rules' fixed keys are in their spec's base (``Run.spec_of``)."""
    from recsys.config import ExperimentConfig
    from recsys.tune.baselines import Run
    from recsys.tune.state import SweepOptions
    from recsys.tune.trial import TrialSpec

    space = load(tmp_path, "baselines: [lr, fm]\n")
    spec = TrialSpec(sweep="s", base=space.base.to_dict(), storage="runs", tracking_uri="x",
                     experiment_id="1", parent_run_id="p", num_workers=1, use_gpu=False,
                     cpus_per_worker=1.0, max_failures=0)  # fmt: skip
    run = Run(space, SweepOptions(name="s", storage="runs", tracking_uri="x"), spec, False)
    for arch in ("lr", "fm"):
        ref = space.references[arch]
        base = ExperimentConfig.from_dict(run.spec_of(ref).base)
        for point in ref.points(space.base):  # nothing lost: the base with the grid's values
            grid = {k: point[k] for k in ref.grid}
            assert base.with_overrides(grid) == space.config_for(point)
        assert (
            run.spec_of(ref).role == "baseline" and run.trainable(ref) == f"recsys-baseline-{arch}"
        )


def frame(space, rows):
    """Ranked rows of ``(trial, role, arch, score, params)``, as ``trial_frame`` gives them."""
    out = pd.DataFrame(
        [{"trial": t, "role": role, "arch": arch, "status": "finished", "best_val_auc": v,
          "params": params, "emb_bytes": 1e5, "best_step": 10, "pareto": False}
         for t, role, arch, v, params in rows]
    )  # fmt: skip
    return out.sort_values("best_val_auc", ascending=False).reset_index(drop=True)


def test_each_reference_is_the_best_of_its_trials(tmp_path):
    space = load(tmp_path, "baselines: [lr, fm]\n")
    lr_a = {"model.arch": "lr", "optim.lr": 0.01, "optim.weight_decay": 0.001}
    lr_b = {**lr_a, "optim.lr": 0.03}
    fm_a = {"model.arch": "fm", "optim.lr": 0.003, "optim.weight_decay": 1e-5}
    fm_b = {**fm_a, "optim.weight_decay": 0.0}
    rows = [
        ("t1", "trial", "dlrm", 0.80, {"optim.lr": 0.02}),
        ("b1", "baseline", "lr", 0.70, lr_a),
        ("b2", "baseline", "lr", 0.65, lr_b),
        ("b3", "baseline", "fm", 0.82, fm_a),
        ("b4", "baseline", "fm", math.nan, fm_b),
    ]
    kept, every = chosen_references(frame(space, rows), space)
    assert list(kept["trial"]) == ["b3", "t1", "b1"]  # ranked; one reference per arch
    assert len(every) == 4 and list(every.loc[every["chosen"], "trial"]) == ["b3", "b1"]
    lr_row = kept[kept["trial"] == "b1"].iloc[0]
    assert lr_row[REFERENCE] == "best of 2: weight_decay=0.001"
    result = Outcome(frame(space, rows), pd.DataFrame(), space)
    assert result.leads() == pytest.approx({"lr": 0.10, "fm": -0.02})
    text = result.lines()
    assert "beats lr (trial b1, best of 2: weight_decay=0.001)" in text
    assert "does NOT beat fm (trial b3, best of 2: lr=0.003, " in text
    # a reference beats every trial of the search: said first
    headline = (
        "the best model here is fm (the reference, trial b3): no trial of the search beats fm "
        "(best trial t1, its best report: val_auc 0.8000; trails fm by 0.0200, by single "
        "reports, no seed check); --export and recsys-export --sweep take it"
    )
    assert text.lstrip().startswith(headline), text
    assert result.winner() == Winner("reference", "fm", "b3")
    assert result.winner().tag() == "fm (a reference, trial b3)"
    assert len(result.references) == 4
    won = Outcome(frame(space, rows[:3]), pd.DataFrame(), space)  # lr only, beaten
    assert "the best model here" not in won.lines()
    assert won.winner() == Winner("search", "dlrm", "t1")


def test_without_references_the_outcome_is_the_search_alone(tmp_path):
    space = load(tmp_path, "")
    kept, every = chosen_references(frame(space, [("t1", "trial", "dlrm", 0.8, {})]), space)
    assert list(kept["trial"]) == ["t1"] and every.empty


def test_a_lead_inside_the_best_trials_seed_noise_is_a_tie(tmp_path):
    """The confirmed best (mean 0.8133, 95% CI about [0.809, 0.817]) leads lr (0.8123) by +0.0010,
    inside its own interval: a tie, said with the interval; fm (0.7998) is beaten outright."""
    space = load(tmp_path, "baselines: [lr, fm]\nconfirm: {top: 1, seeds: 3}\n")
    rows = [
        ("t1", "trial", "dlrm", 0.8140, {"optim.lr": 0.02}),
        ("b1", "baseline", "lr", 0.8123, {"model.arch": "lr"}),
        ("b2", "baseline", "fm", 0.7998, {"model.arch": "fm"}),
    ]
    seeds = pd.DataFrame(
        [{"trial": f"s{i}", "confirms": "t1", "seed": i, "status": "finished", "best_val_auc": v}
         for i, v in enumerate([0.8117, 0.8133, 0.8149])]
    )  # fmt: skip
    result = Outcome(frame(space, rows), seeds, space)
    assert result.verdicts() == {"lr": "ties", "fm": "beats"}
    text = result.lines()
    assert "ties lr (trial b1" in text and "lead +0.0010 is inside the seed noise" in text
    low, high = result.spreads[0].low, result.spreads[0].high
    assert f"95% CI [{low:.4f}, {high:.4f}] includes 0.8123" in text
    assert "beats fm (trial b2" in text
    assert (
        result.verdict_text("lr")
        == f"ties: lead +0.0010, the best's 95% CI [{low:.4f}, {high:.4f}]"
    )
    unchecked = Outcome(frame(space, rows), pd.DataFrame(), space)  # no seed check: by the lead
    assert unchecked.verdicts() == {"lr": "beats", "fm": "beats"}


def test_seed_checked_references_are_judged_interval_with_interval(tmp_path):
    """``confirm: {references: true}``: lr and fm are re-trained with the best's seeds too. The
    best (mean 0.8133) against lr (mean 0.8100, tight): Welch's interval of the difference is
    above 0, a win, where lr's single best report (0.8140) would have beaten the best; against
    fm (mean 0.8128, noisy) the interval includes 0: a tie."""
    from recsys.tune.confirm import separation, spread
    from recsys.tune.phases import REFERENCE_OF, reference_points
    from recsys.tune.trial import CONFIRMS

    space = load(tmp_path, "baselines: [lr, fm]\nconfirm: {top: 1, seeds: 3, references: true}\n")
    assert space.confirm.references
    rows = [
        ("t1", "trial", "dlrm", 0.8139, {"optim.lr": 0.02}),
        ("b1", "baseline", "lr", 0.8140, {"model.arch": "lr", "optim.lr": 0.01}),
        ("b2", "baseline", "lr", 0.8000, {"model.arch": "lr", "optim.lr": 0.03}),
        ("b3", "baseline", "fm", 0.8120, {"model.arch": "fm"}),
    ]
    points = reference_points(frame(space, [r for r in rows if r[1] == "baseline"]), space)
    assert [(p[CONFIRMS], p[REFERENCE_OF], p["train.seed"]) for p in points] == [
        ("b1", "lr", 1), ("b1", "lr", 2), ("b1", "lr", 3),
        ("b3", "fm", 1), ("b3", "fm", 2), ("b3", "fm", 3),
    ]  # fmt: skip
    assert points[0]["optim.lr"] == 0.01  # the reference's own params, and its rules
    assert points[0]["model.arch"] == "lr" and "train.epochs" in points[0]
    runs = {"t1": [0.8130, 0.8133, 0.8136], "b1": [0.8099, 0.8100, 0.8101],
            "b3": [0.8090, 0.8128, 0.8166]}  # fmt: skip
    seeds = pd.DataFrame(
        [{"trial": f"{t}-{i}", "confirms": t, "seed": i + 1, "status": "finished",
          "best_val_auc": v} for t, vs in runs.items() for i, v in enumerate(vs)]
    )  # fmt: skip
    result = Outcome(frame(space, rows), seeds, space)
    assert [s.trial for s in result.spreads] == ["t1"]  # the references are no search trial
    assert set(result.reference_spreads) == {"lr", "fm"}
    assert result.verdicts() == {"lr": "beats", "fm": "ties"}
    assert result.leads() == pytest.approx({"lr": 0.0033, "fm": 0.0005})  # mean against mean
    sep = separation(spread("t1", runs["t1"]), spread("b1", runs["b1"]), "max")
    assert result.verdict_text("lr") == (
        f"beats: lead +0.0033, 95% CI [{sep.low:+.4f}, {sep.high:+.4f}] (both checked)"
    )
    text = result.lines()
    assert "beats lr (trial b1, best of 2: weight_decay=" in text
    assert "val_auc confirmed mean 0.8100 of 3 seeds: lead +0.0033, 95% CI [+0" in text
    assert "ties fm (trial b3" in text and "of the difference" in text
