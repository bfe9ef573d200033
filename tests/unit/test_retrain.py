"""The retrain's pick, decision and refusals (``recsys.lifecycle.retrain``): the warm start or
the models from scratch, by the validation rows; ``@champion`` moves only where the picked
seeds' lead over the frozen champion is outside their noise; a new period whose features or
tables do not match the model's is refused before anything trains."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from recsys.config import ExperimentConfig
from recsys.configlib import ConfigError
from recsys.lifecycle.plan import Plan, check_period, on_period
from recsys.lifecycle.retrain import decide


def plan(metric: str = "auc") -> Plan:
    cfg = ExperimentConfig()
    mode = "min" if metric == "log_loss" else "max"
    return Plan("m", "3", "run", "ckpt", cfg, cfg, "d", 3, metric, mode)


def test_a_lead_inside_the_seed_noise_keeps_the_champion():
    noisy = [0.7010, 0.6950, 0.7090]  # mean 0.7017, its 95% interval about +-0.017
    kept = decide(plan(), noisy, frozen=0.7000, champion="3")
    assert not kept.promote
    assert kept.line.startswith("kept @champion (version 3): lead +0.0017 inside the noise")
    tight = [0.7110, 0.7105, 0.7115]  # the interval [0.710, 0.712] clear of 0.7000
    won = decide(plan(), tight, frozen=0.7000, champion="3")
    assert won.promote and "against the frozen version 3's 0.7000: lead +0.0110, outside the " \
        "noise" in won.line  # fmt: skip
    assert won.seed == 1 and "seed 1 registered (0.7110)" in won.line  # the one nearest the mean
    behind = decide(plan(), [0.69, 0.691, 0.689], frozen=0.7000, champion="3")
    assert not behind.promote and "lead -0.0100 outside the noise, behind it" in behind.line
    same = decide(plan(), [0.71, 0.71, 0.71], frozen=0.7000, champion="3")  # a solved model
    assert same.promote and "the seeds agree exactly: no seed noise measured" in same.line


def test_a_refit_registered_must_beat_the_frozen_champion_too():
    """With ``--refit`` the seeds still decide, and the refit registered in the place of the seed
    nearest their mean must be ahead of the frozen score as well."""
    tight = [0.7110, 0.7105, 0.7115]
    won = decide(plan(), tight, frozen=0.7000, champion="3", refit=0.7200)
    assert won.promote and "seed 1's refit registered (0.7200)" in won.line
    lost = decide(plan(), tight, frozen=0.7000, champion="3", refit=0.6990)
    assert not lost.promote
    assert lost.line.startswith("kept @champion (version 3): lead +0.0110 seed 1's refit not "
                                "ahead (0.6990)")  # fmt: skip
    noisy = decide(plan(), [0.7010, 0.6950, 0.7090], frozen=0.7000, champion="3", refit=0.75)
    assert not noisy.promote and "inside the noise" in noisy.line  # the seeds decide
    lower = decide(plan("log_loss"), [0.401, 0.400, 0.402], frozen=0.45, champion="3", refit=0.44)
    assert lower.promote and "refit registered (0.4400)" in lower.line


def test_a_refit_trains_the_same_epochs_of_the_training_and_validation_rows(monkeypatch):
    """``Plan.refit_of``: a training's configuration on the training and validation rows, the
    same epochs of them (so more steps), its schedule's steps stretched alike, from the same
    start, to the end."""
    import recsys.data.dataset as dataset

    monkeypatch.setattr(dataset, "split_rows", lambda cfg: (800, 200))
    cfg = ExperimentConfig().with_overrides({"train.epochs": 2.0, "optim.warmup_steps": 40,
                                             "optim.decay_start_step": 40,
                                             "optim.decay_steps": 100})  # fmt: skip
    p = Plan("m", "3", "run", "ckpt", cfg, cfg, "d", 3, "auc", "max", refit=True)
    warm, cold = p.refit_of("retrained", 2), p.refit_of("scratch", 2)
    assert warm.data.refit and warm.train.epochs == 2.0 and warm.train.patience == 0
    assert (warm.optim.warmup_steps, warm.optim.decay_start_step, warm.optim.decay_steps) == (
        50, 50, 125)  # x 1000 / 800  # fmt: skip
    assert warm.train.init_from == "ckpt" and cold.train.init_from == ""
    assert warm.train.seed == p.config_of("retrained", 2).train.seed
    # a refit registered and retrained on the next period: its trial's schedule, stretched once
    # by that period's rows, never the refit's stretched again (period after period)
    from recsys.lifecycle.plan import unstretched

    later = unstretched(warm, warm.with_overrides({"data.refit": False}))
    assert (later.optim.warmup_steps, later.optim.decay_start_step,
            later.optim.decay_steps) == (40, 40, 100)  # fmt: skip
    assert unstretched(cfg, cfg) == cfg  # a trial's own: as it is


def test_a_refit_is_registered_in_the_seeds_place(tmp_path, monkeypatch):
    """``--refit``: the pick's seed nearest the mean is refitted (``refit_seed``), the refit
    registered and its score decides beside the seeds; a refit behind the frozen champion keeps
    it."""
    import recsys.lifecycle.retrain as retrain

    refitted: list[tuple[str, int]] = []
    score = {"refit": 0.72}

    def refit_seed(plan, tracker, exp, model, role, seed, *rest):
        refitted.append((role, seed))
        line = f"refitted {role} seed {seed}: test_auc {score['refit']:.4f}"
        return retrain.Model(f"{model.trial}.refit", "ckpt-refit", model.cfg), score["refit"], line

    monkeypatch.setattr(retrain, "refit_seed", refit_seed)
    run, registered = fake_retrain(tmp_path, monkeypatch, lambda r, s: 0.70 + s / 1000)
    outcome = run(concurrent=1, refit=True)
    assert refitted == [("retrained", 2)] and outcome.refit == 0.72
    model, decision = registered[-1]
    assert (model.trial, model.checkpoint) == (f"{plan().key}.retrained-2.refit", "ckpt-refit")
    assert decision.promote and "seed 2's refit registered (0.7200)" in decision.line
    assert "refitted retrained seed 2: test_auc 0.7200" in outcome.lines
    score["refit"] = 0.59  # behind the frozen 0.6
    kept = run(concurrent=1, refit=True)
    assert not kept.decision.promote and "refit not ahead (0.5900)" in kept.decision.line
    run(concurrent=1)  # no refit asked: none trained
    assert len(refitted) == 2


def test_a_killed_refit_is_scored_from_its_checkpoint(tmp_path, monkeypatch):
    """A refit killed after its last report, resumed with nothing left to train, reports no test
    score: the report saved beside its last checkpoint gives it (``recsys.tune.refit.train_into``),
    logged to its run without the validation scores (rows it trained on)."""
    import json

    import recsys.tune.refit as refit_mod
    from recsys.tracking.tracker import Tracker
    from recsys.train.ray_trainer import Resources
    from recsys.tune.refit import Refit, train_into

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "metrics.json").write_text(json.dumps({"step": 9, "test_auc": 0.63, "val_auc": 0.7}))
    monkeypatch.setattr(refit_mod, "train_refit", lambda *a: (str(ckpt), {"step": 9}))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = tracker.client.create_run(tracker.experiment("e")).info.run_id
    refit = Refit("trial-run", "t", ExperimentConfig(), 1.0, 800, 200)
    assert train_into(tracker, run_id, refit, Resources(1), str(tmp_path), "s") == str(ckpt)
    metrics = tracker.client.get_run(run_id).data.metrics
    assert metrics["test_auc"] == 0.63 and "val_auc" not in metrics
    assert tracker.client.get_run(run_id).data.tags["checkpoint.best"] == str(ckpt)


def test_log_loss_decides_downwards():
    lower = decide(plan("log_loss"), [0.401, 0.400, 0.402], frozen=0.45, champion="3")
    assert lower.promote and "lead +0.0490" in lower.line
    higher = decide(plan("log_loss"), [0.46, 0.461, 0.459], frozen=0.45, champion="3")
    assert not higher.promote and "lead -0.0100 outside the noise, behind it" in higher.line
    close = decide(plan("log_loss"), [0.44, 0.46, 0.45], frozen=0.4501, champion="3")
    assert not close.promote and "inside the noise" in close.line


def test_a_period_prepared_otherwise_is_refused(tmp_path):
    """The new period's vocabularies must start with the champion's (``--like``, grown or not):
    its ids then mean what the champion's tables learnt; one with vocabularies of its own, other
    features, the champion's own data again (its folder, or its files prepared again), or no
    test rows, is refused."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.dataset import resolve
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    def write(name: str, seed: int) -> str:
        rng = np.random.default_rng(seed)
        table = pa.table({"y": rng.integers(0, 2, 200).astype(np.int8),
                          "u": [f"u{i}" for i in rng.integers(0, 9, 200)],
                          "i": rng.integers(0, 5, 200)})  # fmt: skip
        pq.write_table(table, tmp_path / f"{name}.parquet")
        return str(tmp_path / f"{name}.parquet")

    schema = DatasetSchema.from_dict({"labels": ["y"], "sparse": {"u": {}, "i": {}}})
    folders = {}
    for name, like, seed in (("week1", None, 0), ("week2", "week1", 1), ("week3", "week2", 2),
                             ("own", None, 3)):  # fmt: skip
        folders[name] = str(tmp_path / name)
        prepare(schema, [write(name, seed)], folders[name], workers=0, like=folders.get(like or ""),
                log=lambda s: None)  # fmt: skip
    data = {"source": "prepared", "paths": [folders["week1"]]}
    frozen = resolve(ExperimentConfig.from_dict({"data": data}))

    def check(name: str) -> None:
        check_period(frozen, on_period(frozen, folders[name]), folders[name], "auc", "version 1")

    check("week2")
    check("week3")  # like week2 like week1
    with pytest.raises(ValueError, match="feature 'u''s vocabulary is not the champion's"):
        check("own")
    with pytest.raises(ValueError, match="version 1 was trained on this folder already"):
        check("week1")
    folders["again"] = str(tmp_path / "again")  # week1's file prepared again, like week1
    prepare(schema, [str(tmp_path / "week1.parquet")], folders["again"], workers=0,
            like=folders["week1"], log=lambda s: None)  # fmt: skip
    with pytest.raises(ValueError, match=r"prepared from files version 1 was trained on \("
                                         + str(tmp_path / "week1.parquet")):  # fmt: skip
        check("again")
    with pytest.raises(ValueError, match="no groups"):
        check_period(frozen, on_period(frozen, folders["week2"]), folders["week2"], "gauc", "v1")
    narrow = str(tmp_path / "narrow")  # one feature of the two
    prepare(DatasetSchema.from_dict({"labels": ["y"], "sparse": {"u": {}}}),
            [str(tmp_path / "week2.parquet")], narrow, workers=0, log=lambda s: None)  # fmt: skip
    pinned = frozen.with_overrides(
        {"embeddings.dims": [8, 16], "embeddings.qr.threshold": 1, "embeddings.qr.whole": ["i"]}
    )  # a retrained champion's
    with pytest.raises(ValueError, match=r"its features \['u'\] are not the model's"):
        check_period(pinned, on_period(pinned, narrow), narrow, "auc", "version 2")
    kept = on_period(pinned, folders["week2"]).embeddings
    assert (kept.dims, kept.qr.whole) == ([8, 16], ["i"])
    other = frozen.with_overrides({"embeddings.feature_names": ["v", "i"],
                                   "embeddings.feature_pooling": {}})  # fmt: skip
    with pytest.raises(ValueError, match=r"its features \['u', 'i'\] are not the model's"):
        check_period(other, on_period(frozen, folders["week2"]), folders["week2"], "auc", "v1")
    grandchild = frozen.with_overrides({"train.init_from": "/old/ckpt"})  # a retrained champion
    period = on_period(grandchild, folders["week2"])
    scratch = Plan("m", "1", "r", "ckpt", grandchild, period, folders["week2"], 2, "auc", "max")
    assert scratch.config_of("scratch", 1).train.init_from == ""  # never the grandparent's
    assert scratch.config_of("retrained", 1).train.init_from == "ckpt"
    assert scratch.cfg.train.eval_batches == 0  # the frozen champion scored on the same rows


def test_the_command_refuses_before_ray_starts(tmp_path, capsys):
    """``recsys-retrain``: a model the store lacks, or too few seeds, refused naming it."""
    import numpy as np

    from recsys.cli import retrain
    from tests.helpers import prepared_log

    data = prepared_log(tmp_path, {"click": np.arange(1000) % 2})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = ["--data", data, "--tracking-uri", uri]
    with pytest.raises(SystemExit, match="error: --model 'models:/nope@champion': not in"):
        retrain.main(["--model", "models:/nope@champion", *base])
    from recsys.tracking.tracker import Tracker  # a model whose versions never won: named

    client = Tracker(uri).client
    client.create_registered_model("m")
    for _ in range(2):
        client.create_model_version("m", str(tmp_path), run_id=None)
    with pytest.raises(SystemExit, match=r"m has versions 1, 2; aliases: none; a version gets "
                                         r"@champion only where it won: name one by number, "
                                         r"models:/m/2\)"):  # fmt: skip
        retrain.main(["--model", "models:/m@champion", *base])
    with pytest.raises(SystemExit, match=r"\(registered there: m\)"):
        retrain.main(["--model", "models:/nope@champion", *base])
    with pytest.raises(SystemExit, match=r"\(m has versions 1, 2; aliases: none\)$"):
        retrain.main(["--model", "models:/m/7", *base])  # (named by number: no hint)
    from recsys.serving.mlflow_model import shown

    assert shown([str(k) for k in range(1, 13)]) == "... (2 more), 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"
    with pytest.raises(SystemExit):
        retrain.main(["--model", "nope", *base])
    assert "--model: 'nope': expected models:/NAME@ALIAS or models:/NAME/VERSION" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        retrain.parse_args(["--model", "models:/m@champion", "--data", "d", "--seeds", "0"])
    assert "--seeds: '0'" in capsys.readouterr().err


def test_a_retrain_trains_on_as_many_workers_as_the_champion_by_default(tmp_path, monkeypatch):
    """A batch size is each worker's: by default a retrain's trainings have the workers that
    wrote the champion's checkpoint (its global batch and steps as its trial's), else the
    usual default; ``--num-workers`` overrides it."""
    import torch

    from recsys.cli import retrain
    from recsys.runtime.cluster import WorkerOptions

    torch.save({"world_size": 1}, tmp_path / "worker_0.pt")  # (rank 0's record of the run)
    assert retrain.champion_workers(str(tmp_path)) == 1
    fallback = WorkerOptions().num_workers
    assert retrain.champion_workers(str(tmp_path / "none")) == fallback  # unreadable
    import pyarrow.fs

    from recsys.runtime import storage

    def local(uri: str) -> tuple:  # a store, read as one: s3://bucket/... is under tmp_path
        return pyarrow.fs.LocalFileSystem(), uri.replace("s3://bucket", str(tmp_path))

    monkeypatch.setattr(storage, "filesystem", local)
    (tmp_path / "ckpt").mkdir()
    torch.save({"world_size": 1}, tmp_path / "ckpt" / "worker_0.pt")
    assert retrain.champion_workers("s3://bucket/ckpt") == 1  # its rank 0's file alone read
    assert retrain.champion_workers("s3://bucket/none") == fallback
    base = ["--model", "models:/m@champion", "--data", "d"]
    assert retrain.parse_args(base).num_workers is None  # (then the champion's)
    assert retrain.parse_args([*base, "--num-workers", "3"]).num_workers == 3


def test_a_grown_table_keeps_the_champions_dims_and_qr_split():
    """Mixed dims and the QR split are decided by a table's rows: a table grown by a new period
    (``--grow-vocab``) keeps the name, kind and dim its champion saved it with, only longer, so
    the warm start finds it, also where a table kept whole grew past a split one."""
    from recsys.lifecycle.plan import same_tables
    from recsys.models.embeddings import table_specs

    frozen = ExperimentConfig().with_overrides({
        "embeddings.num_embeddings": [100, 1900, 5000, 1900], "embeddings.dim": 16,
        "embeddings.md_alpha": 0.5, "embeddings.qr.threshold": 2000,
        "embeddings.feature_names": ["a", "b", "c", "d"], "embeddings.shared": {"d": "b"},
    })  # fmt: skip
    grown = [400, 5400, 5300, 5400]  # a's dim and b's split would change; b past c
    naive = frozen.with_overrides({"embeddings.num_embeddings": grown})
    kept = naive.with_overrides(same_tables(frozen, grown))

    def shapes(cfg: ExperimentConfig) -> list[tuple[str, tuple[str, ...], int, str]]:
        return [(t.name, t.features, t.dim, t.role) for t in table_specs(cfg.embeddings)]

    assert shapes(naive) != shapes(frozen)  # (the hazard: t_b_q, other dims)
    assert shapes(kept) == shapes(frozen)
    assert [t.rows for t in table_specs(kept.embeddings)] == [400, 5400, 1325, 4]
    assert kept.embeddings.qr.whole == ["b"] and kept.embeddings.layout().qr == {"c": 4}
    assert same_tables(kept, [400, 6000, 6000, 6000]) == {}  # a retrained champion: as it is
    assert same_tables(ExperimentConfig(), [10] * 8) == {}  # nothing decided by rows
    with pytest.raises(ConfigError, match="embeddings.qr.whole.*'e'.*not a feature name"):
        frozen.with_overrides({"embeddings.qr.whole": ["e"]})
    with pytest.raises(ConfigError, match="'d' reads the table of 'b': name 'b'"):
        frozen.with_overrides({"embeddings.qr.whole": ["d"]})
    with pytest.raises(ConfigError, match="embeddings.qr.whole.*duplicates"):
        frozen.with_overrides({"embeddings.qr.whole": ["b", "b"]})


def fake_retrain(tmp_path, monkeypatch, train):
    """``run_retrain`` of a 3-seed plan with its trainings, frozen score and registration faked
    (``train(role, seed) -> score``), on a real MLflow store."""
    import recsys.lifecycle.frozen as frozen_mod
    import recsys.lifecycle.retrain as retrain
    from recsys.tracking.tracker import Tracker
    from recsys.train.ray_trainer import Resources

    def train_one(plan, role, seed, tracker, *rest):
        score = train(role, seed)  # a test score, or a training's whole metrics
        metrics = score if isinstance(score, dict) else {"test_auc": score}
        return metrics, f"ckpt-{role}-{seed}", f"run-{role}-{seed}"

    monkeypatch.setattr(frozen_mod, "score_frozen", lambda *a: {"test_auc": 0.6})
    monkeypatch.setattr(retrain, "train_one", train_one)
    monkeypatch.setattr(retrain, "current_champion", lambda *a: "3")
    registered = []
    monkeypatch.setattr(retrain, "register", lambda plan, tr, exp, model, out, decision, *a:
                        registered.append((model, decision)) or ("4", ""))  # fmt: skip
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")

    def run(concurrent: int, refit: bool = False):
        return retrain.run_retrain(replace(plan(), refit=refit), tracker, Resources(1),
                                   str(tmp_path / "runs"), str(tmp_path / "out"),
                                   log=lambda s: None, concurrent=concurrent)  # fmt: skip

    return run, registered


def test_a_retrains_trainings_run_at_once_and_keep_their_seeds(tmp_path, monkeypatch):
    """``--max-concurrent 2``: two trainings at once (the first two wait for each other), and
    each score and checkpoint lands under its own role and seed, whatever order they end in."""
    import threading
    import time

    both_in = threading.Barrier(2, timeout=30)  # passed only with two trainings at once
    started: list[tuple[str, int]] = []

    def train(role: str, seed: int) -> float:
        started.append((role, seed))
        if seed == 1:
            both_in.wait()
        if role == "retrained":
            time.sleep(0.05)  # the scratch one beside it ends first
        return 0.70 + seed / 1000 + (0.01 if role == "retrained" else 0.0)

    run, registered = fake_retrain(tmp_path, monkeypatch, train)
    outcome = run(concurrent=2)
    assert outcome.scores == {"retrained": [0.711, 0.712, 0.713], "scratch": [0.701, 0.702, 0.703]}
    model = registered[0][0]  # the seed nearest the mean, its own checkpoint and seed
    assert (model.trial, model.checkpoint) == (f"{plan().key}.retrained-2", "ckpt-retrained-2")
    assert model.cfg.train.seed == plan().cfg.train.seed + 2
    assert registered[0][1].role == "retrained"  # (no validation scores: the warm start)
    assert started[:2] in ([("retrained", 1), ("scratch", 1)], [("scratch", 1), ("retrained", 1)])
    assert outcome.decision.promote and outcome.decision.seed == 2


def test_after_a_failed_training_none_starts_and_the_running_one_ends(tmp_path, monkeypatch):
    import threading

    failed, beside, lane = threading.Event(), True, []
    trained: list[tuple[str, int]] = []

    def train(role: str, seed: int) -> float:
        if (role, seed) == ("scratch", 1):
            lane.append(threading.current_thread())
            failed.set()
            raise ValueError("the scratch training of seed 1 failed")
        if (role, seed) == ("retrained", 1) and beside:  # running when its neighbour fails:
            assert failed.wait(30)  # it ends all the same, once the failed one's lane has
            lane[0].join(30)
        trained.append((role, seed))
        return 0.7

    run, registered = fake_retrain(tmp_path, monkeypatch, train)
    with pytest.raises(ValueError, match="scratch training of seed 1 failed"):
        run(concurrent=2)
    assert trained == [("retrained", 1)]  # (all 5 others, had the lanes gone on)
    assert not registered  # nothing registered without every training
    trained.clear()
    beside = False
    with pytest.raises(ValueError, match="scratch training of seed 1 failed"):
        run(concurrent=1)
    assert trained == [("retrained", 1)]  # one at a time: the first error ends it


def test_the_models_from_scratch_are_picked_where_they_validate_better(tmp_path, monkeypatch):
    """The retrain offers the warm start unless the models from scratch have the better
    validation mean; the test rows only decide against the frozen champion, so a warm start
    ahead on test but behind on validation is not picked, and the line says which was."""
    val = {"retrained": 0.70, "scratch": 0.71}

    def train(role: str, seed: int) -> dict[str, float]:
        test = 0.75 if role == "retrained" else 0.70 + seed / 1000
        return {"test_auc": test, "val_auc": val[role] + seed / 10000}

    run, registered = fake_retrain(tmp_path, monkeypatch, train)
    outcome = run(concurrent=1)
    assert outcome.picked.role == "scratch" and registered[-1][1].role == "scratch"
    assert outcome.picked.line == (
        "picked the model from scratch: the warm start trails it "
        "(val_auc seed means: warm start 0.7002, from scratch 0.7102)"
    )
    assert outcome.decision.line.startswith("from scratch test_auc 0.7020")
    assert outcome.decision.seed == 2 and outcome.decision.promote  # (frozen 0.6)
    assert outcome.picked.line in outcome.lines
    val["scratch"] = 0.70  # a tie: the warm start
    again = run(concurrent=1)  # (a re-run of the fake trains again)
    assert again.picked.role == "retrained" and registered[-1][1].role == "retrained"
    assert again.decision.line.startswith("retrained test_auc 0.7500")


def test_the_pick_goes_downwards_for_log_loss_and_wants_every_validation_score():
    from recsys.lifecycle.retrain import pick

    lower = {"retrained": [0.45, 0.46], "scratch": [0.44, 0.44]}
    assert pick(plan("log_loss"), lower).role == "scratch"
    assert pick(plan("auc"), lower).role == "retrained"
    missing = {"retrained": [0.70, 0.71], "scratch": [0.80, float("nan")]}
    chosen = pick(plan("auc"), missing)
    assert chosen.role == "retrained" and "not every training has a val_auc" in chosen.line


def test_seeds_that_agree_exactly_are_said_so_and_a_lead_is_shown_in_the_digits_it_has():
    """A solved champion (the LR reference) scores every seed alike: the lines say the seeds
    agree, not that a lead of -0.0000 is outside the noise, and a pick shows the digits that
    tell the means apart."""
    from recsys.lifecycle.retrain import pick, scratch_line

    same = {"retrained": [0.58921, 0.58921], "scratch": [0.58924, 0.58924]}
    line = scratch_line(plan("auc"), same)
    assert line == ("warm start against from scratch: lead -0.00003 (the seeds agree exactly: "
                    "no seed noise measured; from scratch 0.58924)")  # fmt: skip
    chosen = pick(plan("auc"), same)
    assert chosen.role == "scratch" and chosen.line.endswith(
        "(val_auc seed means: warm start 0.58921, from scratch 0.58924)")  # fmt: skip
    noisy = {"retrained": [0.70, 0.72], "scratch": [0.60, 0.61]}
    assert "outside the noise; from scratch 0.6050)" in scratch_line(plan("auc"), noisy)
    decision = decide(plan("auc"), [0.58924] * 3, 0.58921, "3")
    assert "frozen version 3's 0.58921: lead +0.00003, outside the noise" in decision.line
    assert decision.line.endswith("the seeds agree exactly: no seed noise measured")
    from recsys.tune.confirm import spread

    low = spread("retrained", [0.7105, 0.7104, 0.7103]).low
    for frozen in (low - 1e-6, low + 1e-6):  # promoted, kept: the interval shows which
        line = decide(plan("auc"), [0.7105, 0.7104, 0.7103], frozen, "3").line
        shown = re.search(r"CI \[([0-9.]+),", line).group(1)
        assert shown != f"{frozen:.{len(shown) - 2}f}", line


def test_a_trainings_scores_are_its_last_reports(tmp_path):
    """What a re-run (a finished training, or one killed after its last report) reads back from
    MLflow: the test score and the validation score of the same report, as the report itself
    gave them; a validation score of an earlier report is not taken for the last one's."""
    from mlflow.entities import Metric

    from recsys.lifecycle.retrain import end_scores, finished
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("retrain-m")
    client = tracker.client

    def run(trial: str, metrics: list[tuple[str, float, int]]) -> str:
        run_id = str(client.create_run(exp, tags={Tag.TRIAL: trial}).info.run_id)
        client.log_batch(run_id, [Metric(k, v, 0, s) for k, v, s in metrics])
        return run_id

    both = run("k.retrained-1", [("val_auc", 0.61, 5), ("val_auc", 0.63, 10),
                                 ("test_auc", 0.62, 10)])  # fmt: skip
    assert end_scores(tracker, both, "auc") == {"test_auc": 0.62, "val_auc": 0.63}
    stale = run("k.scratch-1", [("val_auc", 0.61, 5), ("test_auc", 0.60, 10)])
    assert end_scores(tracker, stale, "auc") == {"test_auc": 0.60}  # (its last had none)
    assert end_scores(tracker, run("k.scratch-2", [("val_auc", 0.6, 5)]), "auc") == {}
    assert finished(tracker, exp, "k.retrained-1", "auc") is None  # not FINISHED
    client.set_tag(both, Tag.BEST_CHECKPOINT, "/ckpt")
    client.set_terminated(both)
    assert finished(tracker, exp, "k.retrained-1", "auc") == (
        {"test_auc": 0.62, "val_auc": 0.63},
        "/ckpt",
        both,
    )


def test_a_promotion_moves_the_alias_only_from_the_version_it_started_from_or_none():
    """``@champion`` moves where it still names the version the retrain started from, or where
    the model has none yet (a version retrained by number starts the loop); not where it moved
    to another version meanwhile."""
    from recsys.lifecycle.retrain import Decision, blocked, promoted

    win, loss = Decision(True, 1, "won"), Decision(False, 1, "kept")
    assert blocked(win, "3", "3") == "" and blocked(win, "none", "3") == ""
    assert blocked(win, "5", "3") == ("not promoted: @champion names version 5, not version 3 "
                                      "this retrain started from")  # fmt: skip
    assert blocked(loss, "5", "3") == ""  # (nothing to move: the decision's line says why)
    assert blocked(win, "5", "3", own=True) == ""  # version 5: this retrain's (a re-run's)
    assert promoted("4", "3") == "@champion moved to version 4 (was version 3)"
    assert promoted("4", "none") == "@champion moved to version 4 (none before)"
    assert promoted("4", "4") == "@champion names version 4 (as before)"


def test_a_training_killed_after_its_last_report_is_scored_from_its_run(tmp_path, monkeypatch):
    """Run again, a training killed after its last report but before its run was closed
    resumes with nothing left to train, and that report has no scores: they are read from the
    report its run logged before the kill."""
    from types import SimpleNamespace

    import pyarrow.fs
    from mlflow.entities import Metric

    import recsys.train.launch as launch
    from recsys.lifecycle.retrain import train_one
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker
    from recsys.train.ray_trainer import Resources

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("retrain-m")
    p = plan()
    left = tracker.client.create_run(exp, tags={Tag.TRIAL: f"{p.key}.scratch-1"}).info.run_id
    tracker.client.log_batch(left, [Metric("val_auc", 0.64, 0, 9), Metric("test_auc", 0.63, 0, 9)])
    done = SimpleNamespace(metrics={"step": 9}, checkpoint=SimpleNamespace(
        filesystem=pyarrow.fs.LocalFileSystem(), path=str(tmp_path / "ckpt")))  # fmt: skip
    monkeypatch.setattr(launch, "make_run", lambda *a, **k: SimpleNamespace(fit=lambda: done))
    metrics, ckpt, run_id = train_one(p, "scratch", 1, tracker, exp, "parent", Resources(1),
                                      str(tmp_path / "runs"))  # fmt: skip
    assert run_id == left and ckpt == str(tmp_path / "ckpt")
    assert metrics == {"test_auc": 0.63, "val_auc": 0.64}  # (the resumed report: none)


def test_a_training_killed_before_ray_train_recorded_its_last_checkpoint_resumes(
    tmp_path, monkeypatch
):
    """Killed after its workers wrote their last checkpoint in place, before Ray Train recorded
    it, a training resumes from that checkpoint with nothing left to train, and its ``fit()``
    names no checkpoint: the newest checkpoint with its report in the run's folder is taken,
    its scores read from that report and logged to its run where the kill lost them. Where the
    folder has none either, the training is named."""
    import json
    from types import SimpleNamespace

    from mlflow.entities import Metric

    import recsys.train.launch as launch
    from recsys.lifecycle.retrain import train_one
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker
    from recsys.train.ray_trainer import Resources

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("retrain-m")
    p = plan()
    step = tmp_path / "runs" / "retrained-seed2" / "step_00000016"
    step.mkdir(parents=True)
    (step / ".metadata").write_text("")  # (DCP's, written last)
    (step / "metrics.json").write_text(json.dumps({"step": 16, "val_auc": 0.64, "test_auc": 0.63}))
    nothing_left = SimpleNamespace(metrics={"step": 16}, checkpoint=None)

    def fit() -> SimpleNamespace:  # its report, without scores, logged by Ray Train's controller
        other = Tracker(tracker.uri)  # (another process's client)
        run = other.find_trial_run(exp, f"{p.key}.retrained-2")
        other.client.log_batch(run.info.run_id, [Metric("step", 16, 0, 16)])
        return nothing_left

    monkeypatch.setattr(launch, "make_run", lambda *a, **k: SimpleNamespace(fit=fit))
    metrics, ckpt, run_id = train_one(p, "retrained", 2, tracker, exp, "parent", Resources(2),
                                      str(tmp_path / "runs"))  # fmt: skip
    assert ckpt == str(step) and metrics["test_auc"] == 0.63 and metrics["val_auc"] == 0.64
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[Tag.BEST_CHECKPOINT] == str(step)
    assert run.data.metrics["test_auc"] == 0.63 and run.data.metrics["step"] == 16
    with pytest.raises(ValueError, match="the scratch training of seed 1 left no checkpoint"):
        train_one(p, "scratch", 1, tracker, exp, "parent", Resources(2), str(tmp_path / "runs"))


def test_a_checkpoint_uploaded_to_a_store_carries_its_report(tmp_path, monkeypatch):
    """On an object store each rank's staged folder is uploaded by ``ray.train.report``: rank
    0's carries the report (``metrics.json``), as a checkpoint written in place does, so a refit
    killed after its last report is scored from it there too."""
    import os
    from types import SimpleNamespace

    import ray.train

    from recsys.train import worker
    from recsys.train.reporting import read_report

    store = SimpleNamespace(storage_filesystem=object())  # not a local file system
    context = SimpleNamespace(get_world_rank=lambda: 0, get_storage=lambda: store)
    monkeypatch.setattr(ray.train, "get_context", lambda: context)
    uploaded = {}

    def report(metrics, checkpoint=None, checkpoint_dir_name=None):
        uploaded.update(files=os.listdir(checkpoint.path), report=read_report(checkpoint.path))

    monkeypatch.setattr(ray.train, "report", report)
    reporter = worker.RayReporter(staging=str(tmp_path))
    assert not reporter.direct
    reporter.report({"step": 7, "test_auc": 0.6}, reporter.checkpoint_dir(7), 7)
    assert "metrics.json" in uploaded["files"] and uploaded["report"]["test_auc"] == 0.6


def test_what_the_command_line_alone_refuses_is_refused_before_mlflow_is_imported(tmp_path):
    """A malformed ``--model`` (``recsys-retrain``, ``recsys-export``) or a ``--data`` that is no
    local prepared folder is named in the time it takes to parse the command line: MLflow
    (seconds of imports) is not loaded yet."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from recsys.cli import {0}\n"
            "try:\n"
            "    {0}.main(sys.argv[1:])\n"
            "except SystemExit as e:\n"
            "    print(e, 'mlflow' in sys.modules)\n")  # fmt: skip
    missing = str(tmp_path / "week2")
    for command, argv, said in (
        ("retrain", ["--model", "nope", "--data", missing], "'nope': expected models:/NAME@ALIAS"),
        ("retrain", ["--model", "models:/m@champion", "--data", missing],
         f"{missing}: not a prepared folder"),
        ("retrain", ["--model", "models:/m/2", "--data", "s3://b/week2"],
         "a retrain reads a local prepared folder"),
        ("export", ["--model", "models:/m"], "'models:/m': expected models:/NAME@ALIAS"),
    ):  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code.format(command), *argv],
                              capture_output=True, text=True, cwd=tmp_path, check=True)  # fmt: skip
        assert said in done.stdout + done.stderr, done
        assert done.stdout.rstrip().endswith("False"), done.stdout
