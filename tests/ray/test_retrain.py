"""The champion retrained on a later period (``recsys.lifecycle.retrain``), on a local Ray: a model
trained on week 1 of the drift log and registered as ``@champion``; week 2 prepared ``--like``
week 1 with its vocabularies grown (the item table past the QR threshold it was kept whole at);
the retrain warm-started and from scratch, 2 seeds each, scored by GAUC beside the frozen
champion (read through its own tables, the grown rows mapped to its unseen rows), the model the
validation rows pick (warm or from scratch) registered with its lineage, ``@champion`` moved only
by the decision. Killed after its first training, the retrain run again (two trainings at a
time) trains only the three left; run once more, it trains and registers nothing; with
``--refit``, it trains only the refit of the registered seed, and registers that."""

from __future__ import annotations

import math

import pytest

from recsys.config import ExperimentConfig
from recsys.data.dataset import resolve

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SMALL = {"train.epochs": 1.0, "train.batch_size": 256, "train.reports_per_epoch": 1,
         "train.patience": 0, "model.sequence.pooling": "sum", "embeddings.dim": 8,
         "train.eval_batches": 0}  # fmt: skip


@pytest.fixture(scope="module")
def weeks(tmp_path_factory):
    """Week 1 prepared from its schema, week 2 prepared like it, vocabularies grown."""
    from recsys.data.schema import DatasetSchema
    from recsys.demo import drift
    from recsys.prepare.pipeline import prepare

    tmp = tmp_path_factory.mktemp("weeks")
    shape = drift.Shape(users=200, items_per_period=50, rows_per_period=2500)
    out = {}
    for week in (0, 1):
        raw = str(tmp / f"raw{week}")
        drift.write(raw, 0, shape, range(week, week + 1))
        out[week] = str(tmp / f"week{week + 1}")
        like = {"like": out[0], "grow_vocab": True} if week else {}
        schema = DatasetSchema.from_dict(drift.schema_dict())
        prepare(schema, [raw], out[week], workers=0, log=lambda s: None, **like)
    return out


def champion(uri: str, folder: str, storage: str) -> None:
    """A model trained on ``folder`` whose run is logged as a trial's, registered as
    ``models:/m@champion``."""
    import yaml

    from recsys.runtime.storage import as_uri
    from recsys.tracking.report import MlflowReportCallback
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker, flat_params
    from recsys.train.ray_trainer import Resources, make_trainer

    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}}))
    items = cfg.embeddings.num_embeddings[cfg.embeddings.names().index("item")]
    # its tables' dims and QR split decided by their rows: the item table, kept whole at the
    # threshold, grows past it in week 2, and keeps its dim and form (``same_tables``)
    cfg = cfg.with_overrides({**SMALL, "embeddings.md_alpha": 0.5,
                              "embeddings.qr.threshold": items})  # fmt: skip
    tracker = Tracker(uri)
    exp = tracker.experiment("week1")
    run_id = tracker.trial_run(exp, tracker.parent_run(exp, "week1"), "week1", "t0",
                               flat_params(cfg.to_dict()))  # fmt: skip
    tracker.log_text(run_id, yaml.safe_dump(cfg.to_dict()), "config.yaml")
    result = make_trainer(cfg, Resources(1, False, 0.95), name="week1", storage_path=storage,
                          callbacks=[MlflowReportCallback(uri, run_id)]).fit()  # fmt: skip
    ckpt = as_uri(result.checkpoint.filesystem, result.checkpoint.path)
    tracker.set_tags(run_id, {Tag.BEST_CHECKPOINT: ckpt})
    tracker.finish(run_id)
    client = tracker.client
    client.create_registered_model("m")
    version = client.create_model_version("m", source=ckpt, run_id=run_id)
    client.set_registered_model_alias("m", "champion", version.version)


def test_a_killed_retrain_resumes_and_registers_by_its_decision(ray_2_cpus, weeks, tmp_path,
                                                                monkeypatch, capsys):  # fmt: skip
    import recsys.cli.retrain as cli
    import recsys.train.launch as launch
    import recsys.tune.refit as refit_mod
    from recsys.lifecycle.frozen import frozen_ids
    from recsys.lifecycle.plan import plan_retrain
    from recsys.lifecycle.retrain import LABELS, run_retrain
    from recsys.tracking.tracker import Tracker
    from recsys.train.ray_trainer import Resources

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    storage = str(tmp_path / "runs")
    champion(uri, weeks[0], storage)
    tracker = Tracker(uri)
    out = str(tmp_path / "export")
    flags = ["--data", weeks[1], "--epochs", "1", "--seeds", "2", "--metric", "gauc",
             "--tracking-uri", uri, "--storage", storage, "--out", out, "--num-workers", "1",
             "--address", "local"]  # fmt: skip
    args = cli.parse_args([*flags, "--model", "models:/m@champion"])
    plan = cli.checked_plan(args, tracker, weeks[1])  # the command's plan
    assert plan.cfg.data.paths == [weeks[1]] and plan.cfg.train.epochs == 1.0
    grown = plan.cfg.embeddings.num_embeddings
    assert grown[1] > plan.frozen.embeddings.num_embeddings[1]  # the item table grew
    assert plan.frozen.embeddings.qr_split("user") and plan.cfg.embeddings.qr.whole == ["item"]
    assert plan.cfg.embeddings.table_dims() == plan.frozen.embeddings.table_dims()
    assert 1 in frozen_ids(weeks[1], plan.frozen.embeddings.num_embeddings)
    calls = []
    real = launch.make_run
    monkeypatch.setattr(launch, "make_run", lambda *a, **k: calls.append(k["name"])
                        or real(*a, **k))  # fmt: skip

    def killed(line: str) -> None:
        if line.startswith("retrained seed 1"):
            raise KeyboardInterrupt("killed after the first training")

    resources = Resources(1, False, 0.95)
    with pytest.raises(KeyboardInterrupt):
        run_retrain(plan, tracker, resources, storage, out, log=killed)
    assert calls == ["retrained-seed1"]
    lines: list[str] = []
    outcome = run_retrain(
        plan, tracker, resources, storage, out, log=lines.append, concurrent=2
    )  # (two Ray tasks at once, a lane's MLflow client each)
    assert calls[0] == "retrained-seed1"  # the killed run's; its finished training not again
    assert sorted(calls[1:]) == ["retrained-seed2", "scratch-seed1", "scratch-seed2"]
    assert {r: len(v) for r, v in outcome.scores.items()} == {"retrained": 2, "scratch": 2}
    exp = tracker.experiment("retrain-m")
    for role in ("retrained", "scratch"):  # each run records its data as its input
        for seed in (1, 2):
            run = tracker.find_trial_run(exp, f"{plan.key}.{role}-{seed}")
            inputs = tracker.client.get_run(run.info.run_id).inputs.dataset_inputs
            assert [d.dataset.source for d in inputs] == [weeks[1]], (role, seed, inputs)
    assert all(0.4 < s < 1.0 for v in outcome.scores.values() for s in v)
    assert not math.isnan(outcome.frozen) and outcome.frozen > 0.4
    assert outcome.decision.line in lines and lines[-1] in outcome.lines
    assert lines[0] == f"frozen m version 1: test_gauc {outcome.frozen:.4f}"  # (by name: not
    # every retrained version is the champion)
    assert any(ln.startswith("warm start against from scratch: lead") for ln in lines)
    val = {r: [tracker.find_trial_run(exp, f"{plan.key}.{r}-{s}").data.metrics["val_gauc"]
               for s in (1, 2)] for r in ("retrained", "scratch")}  # fmt: skip
    better = "scratch" if sum(val["scratch"]) > sum(val["retrained"]) else "retrained"
    assert outcome.picked.role == outcome.decision.role == better  # by the validation rows
    assert outcome.picked.line in lines
    version = tracker.client.get_model_version("m", outcome.version)
    role = outcome.decision.role
    registered = tracker.find_trial_run(exp, f"{plan.key}.{role}-{outcome.decision.seed}")
    assert version.run_id == registered.info.run_id  # the seed of the pick the decision names
    assert version.tags["recsys.start"] == ("warm" if role == "retrained" else "scratch")
    assert outcome.version == "2" and version.tags["recsys.parent_version"] == "1"
    assert version.tags["recsys.data"] == weeks[1]
    assert version.tags["recsys.parent_data"] == weeks[0]
    alias = str(tracker.client.get_model_version_by_alias("m", "champion").version)
    assert alias == ("2" if outcome.decision.promote else "1")
    said = "@champion moved to version 2 (was version 1)"  # (said only where it moved)
    assert (said in lines) == outcome.decision.promote
    assert version.tags["recsys.champion"] == ("yes" if outcome.decision.promote else
                                               f"no: {outcome.decision.line}")  # fmt: skip
    # the command again, by the version's number: every training found done, none registered
    cli.main([*flags, "--model", "models:/m/1", "--max-concurrent", "8"])
    printed = capsys.readouterr().out
    assert len(calls) == 4  # nothing trained again, and said so
    assert printed.count(", trained before: not again)") == 4, printed
    assert "4 at a time" in printed  # (at most its trainings)
    assert outcome.picked.line in printed  # the same pick, from the runs' MLflow metrics
    assert f"registered m version {outcome.version} " in printed  # nor registered again
    assert len(tracker.client.search_model_versions("name = 'm'")) == 2
    with pytest.raises(ValueError, match="version 2 was trained on this folder already"):
        plan_retrain(tracker, "models:/m/2", weeks[1], epochs=1.0, seeds=2)
    # --refit: the same trainings found done; the seed registered above trained again on the
    # training and validation rows, in a run of its own, and registered in its place
    monkeypatch.setattr(refit_mod, "make_run", lambda *a, **k: calls.append(k["name"])
                        or real(*a, **k))  # fmt: skip
    before = str(tracker.client.get_model_version_by_alias("m", "champion").version)
    cli.main([*flags, "--model", "models:/m/1", "--refit"])
    printed = capsys.readouterr().out
    seed = outcome.decision.seed
    assert calls[4:] == [f"{role}-seed{seed}-refit"]
    assert f"refitted {LABELS[role]} seed {seed} on training + validation: " in printed
    refit = tracker.find_trial_run(exp, f"{plan.key}.{role}-{seed}.refit")
    assert refit.data.tags["recsys.kind"] == "refit"
    assert refit.data.params["data.refit"] == "True"
    assert "test_gauc" in refit.data.metrics  # and not the validation rows it trained on:
    assert not [k for k in refit.data.metrics if k.startswith(("val_", "best_"))]
    third = tracker.client.get_model_version("m", "3")
    assert third.run_id == refit.info.run_id and third.tags["recsys.parent_version"] == "1"
    # promoted (the alias may name version 2: this retrain's own, registered without --refit),
    # the alias moves to the refit; else it stays
    won = "outside the noise; seed" in printed and "refit registered" in printed
    alias = str(tracker.client.get_model_version_by_alias("m", "champion").version)
    assert alias == ("3" if won else before)
    assert ("@champion moved to version 3 (was version " in printed) == won
    assert (third.tags["recsys.champion"] == "yes") == won
    cli.main([*flags, "--model", "models:/m/1", "--refit"])  # again: nothing trained or added
    assert len(calls) == 5 and len(tracker.client.search_model_versions("name = 'm'")) == 3
    printed = capsys.readouterr().out  # and said so
    assert "refitting the pick" not in printed and "), trained before: not again" in printed
    assert tracker.client.get_model_version("m", "3").tags == third.tags  # (its verdict kept)
    with pytest.raises(ValueError, match="version 3 was trained on this folder already"):
        plan_retrain(tracker, "models:/m/3", weeks[1], epochs=1.0, seeds=2)  # (its own data)
