"""Refused before launch: impossible resources, bad resume requests, bad CLI input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from recsys.configlib import ConfigError
from recsys.runtime.cluster import check_fits
from recsys.tune import space as spaces
from recsys.tune.space import Dimension
from recsys.tune.state import SweepOptions, check_resume, restored_options, save_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODES = [{"CPU": 2.0}, {"CPU": 2.0}]


def test_resources_that_cannot_be_placed():
    check_fits(4, 0.9, 0, NODES, extra_cpus=0.1)
    with pytest.raises(ConfigError, match=r"5 workers x \(0.9 CPU, 0 GPU\).*can place 4"):
        check_fits(5, 0.9, 0, NODES)
    with pytest.raises(ConfigError, match=r"0 GPU on 2 node\(s\)"):
        check_fits(1, 1, 1, NODES)
    with pytest.raises(ConfigError, match="num_workers=0"):
        check_fits(0, 1, 0, NODES)
    with pytest.raises(ConfigError, match=r"= 2.1 CPU.*the cluster has 2 CPU"):
        check_fits(2, 1, 0, [{"CPU": 2.0}], extra_cpus=0.1)  # the driver does not fit beside


def test_resume_checks(tmp_path):
    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x", resume=True)
    with pytest.raises(ConfigError, match="--resume: no sweep named 's'"):
        check_resume(space, opts)
    save_state(space, opts)
    assert check_resume(space, opts)
    other = spaces.load("default")  # the full variant: another base config
    with pytest.raises(ConfigError, match="was started with another search space"):
        check_resume(other, opts)
    import dataclasses  # a run section changed is how it runs, as flags are: it resumes

    ran = {**space.raw, "run": {"num_workers": 2, "max_concurrent": 1}}
    assert check_resume(dataclasses.replace(space, raw=ran, run=ran["run"]), opts)
    changed = {**space.raw, "num_samples": 99}
    with pytest.raises(ConfigError, match="was started with another search space"):
        check_resume(dataclasses.replace(space, raw=changed), opts)


def test_a_resume_on_another_worker_count_is_announced(tmp_path):
    import dataclasses

    from recsys.tune.state import worker_change

    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x")
    save_state(space, opts)
    assert worker_change(opts) == ""
    more = dataclasses.replace(opts, num_workers=8, use_gpu=True)
    assert "started with 2 CPU workers per trial, it resumes with 8 GPU" in worker_change(more)
    from recsys.tune.state import record_workers

    record_workers(more)  # that resume ran on 8 GPU workers: the next is compared with it
    assert worker_change(more) == ""
    back = dataclasses.replace(opts, num_workers=2)
    assert "last ran with 8 GPU workers per trial, it resumes with 2 CPU" in worker_change(back)


def test_a_resume_between_cpu_and_gpu_is_refused_only_where_adam_trains_tables(tmp_path):
    """CPU workers hold Adam's tables dense (torch's Adam), GPU workers fuse it (FBGEMM): the
    optimizer state of one does not load into the other, so the driver refuses the move."""
    import dataclasses

    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x")
    save_state(space, opts)
    assert check_resume(space, dataclasses.replace(opts, use_gpu=True))  # no Adam tables
    adam = dataclasses.replace(space, base=space.base.with_overrides(
        {"optim.embedding_optimizer": "adam"}))  # fmt: skip
    opts = dataclasses.replace(opts, name="adam")
    save_state(adam, opts)
    assert check_resume(adam, opts)  # on the device it ran on
    with pytest.raises(ConfigError, match="ran on CPU workers .*embedding_optimizer='adam'.*"
                       "resume it without --gpus"):  # fmt: skip
        check_resume(adam, dataclasses.replace(opts, use_gpu=True))
    key = "optim.embedding_optimizer"
    for values, refused in ((["exact_rowwise_adagrad"], False), (["adam", "exact_sgd"], True)):
        # a searched choice decides for every trial, whatever the base says
        dims = [*adam.dimensions, Dimension(key, "choice", values)]
        searched = dataclasses.replace(adam, dimensions=dims)
        gpu = dataclasses.replace(opts, name=f"s{len(values)}", use_gpu=True)
        save_state(searched, gpu)  # started on GPUs: resumed without --gpus is the move
        back = dataclasses.replace(gpu, use_gpu=False)
        if not refused:
            assert check_resume(searched, back)
            continue
        with pytest.raises(ConfigError, match="ran on GPU workers .*resume it with --gpus"):
            check_resume(searched, back)


def test_a_refit_runs_on_the_workers_its_sweeps_trials_ran_on(tmp_path):
    """``recsys-export --sweep NAME --refit`` without ``--num-workers``: the sweep's own."""
    from recsys.train.ray_trainer import Resources
    from recsys.tune.refit import saved_workers

    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x",
                        num_workers=3, cpus_per_worker=0.5)  # fmt: skip
    assert saved_workers(str(tmp_path), "s") is None  # no sweep of that name yet
    save_state(space, opts)
    assert saved_workers(str(tmp_path), "s") == Resources(3, False, 0.5)


def cli(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_bad_inputs_fail_fast_with_a_message(tmp_path):
    r = cli("sweep.py", "--space", "nope")
    assert r.returncode != 0 and "error: search space 'nope' not found" in r.stderr
    r = cli("train.py", "--set", "model.interactoin=dot")
    assert r.returncode != 0 and "did you mean 'model.interaction'" in r.stderr
    r = cli("sweep.py", "--name", "missing", "--resume", "--storage", str(tmp_path))
    assert r.returncode != 0 and "no sweep named 'missing'" in r.stderr


def test_a_command_that_reads_a_store_refuses_a_folder_without_one(tmp_path, monkeypatch):
    """``recsys-export --sweep/--model`` and ``recsys-retrain`` read the runs and models a sweep
    left: in a folder without ``mlflow.db`` (and no ``--tracking-uri``) they say so, and leave
    no empty store behind (``recsys-retrain`` given a prepared ``--data``: it refuses one that is
    not before it looks for the store)."""
    import numpy as np

    from recsys.cli import export, retrain
    from tests.helpers import prepared_log

    data = prepared_log(tmp_path / "week2", {"click": np.arange(1000) % 2})
    monkeypatch.chdir(tmp_path)
    said = f"no MLflow store here ({tmp_path / 'mlflow.db'} does not exist)"
    for main, argv in [(export.main, ["--sweep", "s"]),
                       (export.main, ["--model", "models:/m@champion"]),
                       (export.main, ["--sweep", "s", "--refit"]),
                       (retrain.main, ["--model", "models:/m@c", "--data", data])]:  # fmt: skip
        with pytest.raises(SystemExit, match=re.escape(said)):
            main(argv)
    assert os.listdir(tmp_path) == ["week2"]


def test_a_refit_needs_a_sweep_to_refit_and_an_export_to_make(capsys):
    from recsys.cli import export, sweep

    for parse, argv, message in [
        (export.parse_args, ["--checkpoint", "c", "--refit"], "--refit refits a sweep's best"),
        (sweep.parse_args, ["--refit"], "--refit exports the refitted model: it needs --export"),
        (export.parse_args, ["--sweep", "s", "--refit", "--num-workers", "0"], "at least 1"),
    ]:
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err
    args = export.parse_args(["--sweep", "s", "--refit", "--num-workers", "4", "--gpus"])
    assert (args.refit, args.num_workers, args.use_gpu, args.address) == (True, 4, True, None)
    assert sweep.parse_args(["--export", "int8", "--refit"]).refit


def test_an_option_a_source_would_ignore_is_refused(capsys):
    """Every option ``recsys-export`` takes is used by the source it goes with, or refused."""
    from recsys.cli import export

    for argv, message in [
        (["--checkpoint", "c", "--register", "m"], "--register registers a sweep's"),
        (["--model", "models:/m@a", "--max-emb-mb", "9"], "--max-emb-mb chooses among a sweep"),
        (["--checkpoint", "c", "--storage", "s"], "--storage chooses among a sweep's trials"),
        (["--sweep", "s", "--experiment", "debug"], "--experiment names a checkpoint's config"),
        (["--model", "models:/m@a", "--config", "c.yaml"], "--config names a checkpoint's"),
        (["--sweep", "s", "--num-workers", "4"], "--num-workers says where the refit runs"),
        (["--sweep", "s", "--wait-for-nodes", "30"], "--wait-for-nodes says where the refit"),
        (["--sweep", "s", "--gpus"], "--gpus says where the refit runs"),
    ]:
        with pytest.raises(SystemExit):
            export.parse_args(argv)
        assert message in capsys.readouterr().err, argv
    args = export.parse_args(["--sweep", "s", "--refit", "--wait-for-nodes", "30"])
    assert (args.wait_for_nodes, args.storage, args.cpus_per_worker) == (30.0, "runs", None)


def test_each_option_is_declared_once_and_every_command_reads_it_so(capsys):
    """The worker options of every training command, and the sweep's, come from the one
    declaration on their dataclass: flag, default and help alike."""
    import dataclasses

    from recsys.cli import retrain, sweep, train
    from recsys.configlib import options
    from recsys.runtime.cluster import WorkerOptions
    from recsys.tune.state import KEPT, RESTORED

    base = ["--model", "models:/m@champion", "--data", "d"]
    for parse, argv in [(train.parse_args, []), (retrain.parse_args, base)]:
        args = parse(argv)
        for name, (_, default) in options(WorkerOptions).items():
            if parse is retrain.parse_args and name == "num_workers":
                default = None  # untyped: the champion's workers (retrain.champion_workers)
            assert getattr(args, name) == default, (parse.__module__, name)
    args = sweep.parse_args([])  # untyped, a space's run section may say them first
    bare = sweep.sweep_options(args, dataclasses.replace(spaces.load("default"), run={}))
    for name, (_, default) in options(WorkerOptions).items():
        assert getattr(args, name) == (None if name in sweep.RUN else default), name
        assert getattr(bare, name) == default, name
    args = train.parse_args(["--gpus", "--cpus-per-worker", "3", "--wait-for-nodes", "5"])
    assert (args.use_gpu, args.cpus_per_worker, args.wait_for_nodes) == (True, 3.0, 5.0)
    assert set(RESTORED) == {"num_samples", "max_concurrent", "scheduler", "search", "seed",
                             "confirm", "seeds"}  # fmt: skip
    assert RESTORED["num_samples"] == "--num-samples" and KEPT == (
        "max_concurrent",
        "scheduler",
        "search",
    )
    args = sweep.parse_args([])  # a restored option untyped is None: a resume tells it apart
    assert all(getattr(args, name) is None for name in RESTORED)
    for argv, message in [
        (["--resume", "--more", "2"], "not allowed with argument"),
        (["--more", "2", "--restart"], "argument --restart: not allowed with argument --more"),
        (["--more", "2", "--num-samples", "4"], "leave --num-samples out"),
        (["--cpus-per-worker", "0"], "must be > 0"),
        (["--seed", "x"], "'x' is not a whole number"),
    ]:
        with pytest.raises(SystemExit):
            sweep.parse_args(argv)
        assert message in capsys.readouterr().err, argv


def test_a_spaces_run_section_sets_the_options_the_command_line_does_not(tmp_path):
    """``run:`` in a space: the options of ``RUN`` where not typed, checked as their flags."""
    import dataclasses

    from recsys.cli import sweep

    space = spaces.load("default", smoke=True)
    run = {"num_workers": 1, "max_concurrent": 2, "scheduler": "asha", "cpus_per_worker": 0.5}
    runs = dataclasses.replace(space, run=run)
    opts = sweep.sweep_options(sweep.parse_args([]), runs)
    assert (opts.num_workers, opts.max_concurrent, opts.scheduler, opts.cpus_per_worker) == (
        1, 2, "asha", 0.5)  # fmt: skip
    typed = sweep.parse_args(["--num-workers", "2", "--scheduler", "fifo"])
    opts = sweep.sweep_options(typed, runs)
    assert (opts.num_workers, opts.max_concurrent, opts.scheduler) == (2, 2, "fifo")
    for run, message in [
        (
            {"num_worker": 1},
            "run.num_worker: not an option a space sets (did you mean 'num_workers'?)",
        ),
        ({"num_workers": 0}, "run.num_workers: '0': must be at least 1"),
        ({"num_workers": 1.5}, "run.num_workers: '1.5' is not a whole number"),
        ({"max_concurrent": True}, "run.max_concurrent: True is not a count"),
        ({"scheduler": "ashaa"}, "run.scheduler: 'ashaa' is not one of fifo, asha, hyperband"),
        ({"cpus_per_worker": -1}, "run.cpus_per_worker: '-1': must be > 0"),
    ]:
        with pytest.raises(ConfigError) as e:
            sweep.sweep_options(sweep.parse_args([]), dataclasses.replace(space, run=run))
        assert str(e.value).startswith(f"{space.source}: {message}"), e.value
    bad = tmp_path / "s.yaml"
    with open(space.source) as f:
        bad.write_text(f.read() + "run: [num_workers]\n")
    with pytest.raises(ConfigError, match="run: expected a mapping of options"):
        spaces.load(str(bad))


def test_a_resume_restores_the_seed_check_it_started_with(tmp_path):
    """``--confirm``/``--seeds`` on a resume: the values it started with, another refused."""
    import dataclasses

    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x", confirm=2,
                        seeds=4)  # fmt: skip
    save_state(space, opts)
    again = dataclasses.replace(opts, resume=True, confirm=None, seeds=None)
    assert check_resume(space, again)
    assert (restored_options(again).confirm, restored_options(again).seeds) == (2, 4)
    with pytest.raises(ConfigError, match="--confirm 2 when it started, 3 now"):
        check_resume(space, dataclasses.replace(again, confirm=3), frozenset({"confirm"}))


def test_sizes_and_budgets_on_the_command_line_must_be_positive(tmp_path):
    r = cli("sweep.py", "--device-memory-gb", "0")
    assert r.returncode != 0 and "--device-memory-gb: '0': must be > 0" in r.stderr
    r = cli("export.py", "--sweep", "x", "--max-emb-mb", "-1")
    assert r.returncode != 0 and "--max-emb-mb: '-1': must be > 0" in r.stderr
    tsv = tmp_path / "d.tsv"
    tsv.write_text("0" + "\t" * 39 + "\n")
    for flags, message in [
        (["--chunk-mb", "0"], "--chunk-mb=0.0: must be > 0"),
        (["--workers", "-1"], "--workers=-1: must be >= 0"),
        (["--workers", "0", "--object-store-mb", "100"], "--object-store-mb caps a local Ray"),
        (["--address", "127.0.0.1:6379", "--workers", "99"], "--workers sizes a local Ray"),
        (["--schema", "critoe_kaggle"], "no such schema file (or a shipped one: ['clicklogs'"),
    ]:
        schema = [] if "--schema" in flags else ["--schema", "criteo_kaggle"]
        r = subprocess.run(
            [sys.executable, "-m", "recsys.cli.preprocess", str(tsv), "--out",
             str(tmp_path / "o"), *schema, *flags],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode != 0 and message in r.stderr, r.stderr
        assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_a_staging_folder_without_room_is_refused_naming_it(tmp_path):
    from recsys.distributed.checkpoint import CheckpointError
    from recsys.train.worker import check_space

    check_space(str(tmp_path / "staging"), 1024)  # made, and room enough
    with pytest.raises(CheckpointError, match=r"train.checkpoint_staging=.*staging: .* GiB free"):
        check_space(str(tmp_path / "staging"), 1 << 60)


def test_a_sweep_whose_metric_the_data_cannot_give_stops_before_launch(tmp_path):
    import numpy as np

    from tests.helpers import metric_space, prepared_log

    click = (np.random.default_rng(0).random(1000) < 0.3).astype(np.int8)
    click[600:800] = 0  # the validation rows (split by order)
    folder = prepared_log(tmp_path, {"click": click})
    db = tmp_path / "mlflow.db"
    r = cli("sweep.py", "--space", metric_space(tmp_path, "val_auc"), "--data", folder,
            "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{db}")  # fmt: skip
    assert r.returncode != 0, r.stderr
    assert (f"val_auc cannot be computed: the validation split of {folder} has 200 rows, all "
            "with click=0 (meta.json label_counts)") in r.stderr  # fmt: skip
    assert not (tmp_path / "runs").exists() and not db.exists()  # nothing started


def test_export_by_checkpoint_resolves_its_config_against_the_prepared_folder(
    demo_prepared, tmp_path, monkeypatch
):
    """``recsys-export --checkpoint --config``: the model it builds has the data's features and
    tasks (the config file names only the folder), as the trained one had."""
    import recsys.serving.export
    from recsys.cli import export as cli

    seen = []
    monkeypatch.setattr(recsys.serving.export, "export", lambda cfg, *a: seen.append(cfg) or 1 / 0)
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{source: prepared, paths: [{demo_prepared}]}}\n")
    with pytest.raises(ZeroDivisionError):
        cli.main(["--checkpoint", str(tmp_path), "--config", str(config)])
    (cfg,) = seen
    assert cfg.model.num_dense == 2 and cfg.loss.names() == ["click", "like"]
    assert cfg.embeddings.names() == [
        "user_id",
        "item_id",
        "country",
        "history",
        "tags",
        "event_hour",
        "event_weekday",
        "item_age",
    ]


def saved_sweep(tmp_path, **options) -> tuple:
    """A sweep `s` of the smoke space saved in ``tmp_path`` as it started with ``options``."""
    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x", **options)
    save_state(space, opts)
    return space, opts


def test_a_resume_keeps_its_options_and_refuses_other_typed_ones_naming_each(tmp_path):
    import dataclasses

    from recsys.tune.state import restored_options

    space, started = saved_sweep(tmp_path, num_samples=16, search="optuna", scheduler="asha")
    typed_default = dataclasses.replace(started, num_samples=8, search="random")
    assert check_resume(space, typed_default)  # nothing typed: resumes, as it started
    restored = restored_options(typed_default)
    assert (restored.num_samples, restored.search, restored.scheduler) == (16, "optuna", "asha")
    with pytest.raises(ConfigError) as e:
        check_resume(space, typed_default, frozenset({"num_samples", "search", "scheduler"}))
    message = str(e.value)
    assert "--num-samples 16 when it started, 8 now" in message
    assert "--search 'optuna' when it started, 'random' now" in message
    assert "--scheduler" not in message  # typed, but the same as saved
    assert "--restart" in message


def test_a_finished_sweep_is_refused_and_restart_archives_it(tmp_path, capsys):
    import dataclasses

    from mlflow import MlflowClient

    from recsys.cli.sweep import restart
    from recsys.tracking.tracker import Tracker
    from recsys.tune.state import mark_finished

    space, opts = saved_sweep(tmp_path)
    mark_finished(opts, 8)
    with pytest.raises(ConfigError, match=r"sweep 's' in .* has finished \(8 trials, .*--restart"):
        check_resume(space, opts)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old = Tracker(uri).experiment("s")
    r = cli("sweep.py", "--smoke-test", "--name", "s", "--storage", str(tmp_path),
            "--tracking-uri", uri)  # fmt: skip
    assert r.returncode != 0 and "has finished (8 trials" in r.stderr  # before Ray starts
    r = cli("sweep.py", "--smoke-test", "--name", "s", "--storage", str(tmp_path),
            "--tracking-uri", uri, "--restart", "--address", "127.0.0.1:1")  # fmt: skip
    assert "no Ray cluster answers at 127.0.0.1:1" in r.stderr  # checked first: nothing moved
    assert (tmp_path / "s" / "sweep.json").exists()
    restart(dataclasses.replace(opts, tracking_uri=uri))  # what --restart does, then launches
    archived = [p.name for p in tmp_path.iterdir() if p.name.startswith("s.archived-")]
    assert len(archived) == 1 and not (tmp_path / "s").exists()
    assert (tmp_path / archived[0] / "sweep.json").exists()  # kept, aside
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("s") is None
    assert client.get_experiment(old).name.startswith("s (archived ")
    assert not check_resume(space, opts)  # the name starts over
    save_state(space, opts)
    mark_finished(opts, 8, errored=2)  # finished, two trials errored: --resume retries them
    with pytest.raises(ConfigError, match=r"has finished \(8 trials, 2 errored \(--resume"):
        check_resume(space, opts)
    assert check_resume(space, dataclasses.replace(opts, resume=True))
    assert "archived sweep 's': folder " in capsys.readouterr().out


def test_a_sweep_whose_trials_all_failed_exits_non_zero():
    from recsys.cli.sweep import nothing_finished

    failed = [{"role": "trial", "status": "error"}, {"role": "trial", "status": "diverged"},
              {"role": "baseline", "status": "finished"}]  # fmt: skip
    assert nothing_finished(failed) == (
        "no trial finished (1 error, 1 diverged): the errors are above and in MLflow"
    )
    assert nothing_finished([*failed, {"role": "trial", "status": "early_stopped"}]) == ""
    assert "no trials" in nothing_finished([])


def test_more_grows_only_a_finished_sweep_with_the_options_it_last_ran(tmp_path):
    import dataclasses

    from recsys.tune.state import (
        grown_options,
        growths,
        mark_finished,
        restored_options,
        start_growth,
    )

    space = spaces.load("default", smoke=True)
    opts = SweepOptions(name="s", storage=str(tmp_path), tracking_uri="sqlite:///x", more=4)
    with pytest.raises(ConfigError, match="--more: no sweep named 's'"):
        check_resume(space, opts)
    space, started = saved_sweep(tmp_path, num_samples=8, scheduler="asha", seed=7)
    grow = dataclasses.replace(started, more=4)
    with pytest.raises(ConfigError, match=r"--more: sweep 's' in .* is unfinished: resume it"):
        check_resume(space, grow)
    mark_finished(started, 8)
    with pytest.raises(ConfigError, match=r"has finished \(8 trials.*--more N adds N trials"):
        check_resume(space, started)  # a plain re-run still says what it can do
    assert check_resume(space, grow)
    grown = grown_options(grow, frozenset({"search"}))
    assert (grown.num_samples, grown.scheduler, grown.seed) == (4, "asha", 8)  # kept; seed + 1
    assert grown.search == "random"  # typed (here: the default it parsed to)
    grown = dataclasses.replace(grown, search="optuna")
    assert start_growth(grown) == 1
    assert growths(grown) == [
        {
            "num_samples": 4,
            "max_concurrent": 1,
            "scheduler": "asha",
            "search": "optuna",
            "seed": 8,
            "confirm": None,
            "seeds": None,
        }
    ]
    again = dataclasses.replace(grown, more=0, resume=True)  # killed while growing: resumes
    assert check_resume(space, again)
    assert (restored_options(again).search, restored_options(again).num_samples) == ("optuna", 4)
    with pytest.raises(ConfigError, match="--search 'optuna' when it started, 'random' now"):
        check_resume(space, dataclasses.replace(again, search="random"), frozenset({"search"}))
    mark_finished(grown, 12)
    assert grown_options(grow, frozenset()).seed == 9  # the second growth: start's seed + 2


def test_a_bare_resume_keeps_the_workers_its_latest_run_used_and_a_typed_count_wins(tmp_path):
    import dataclasses

    from recsys.tune.state import record_workers, resumed_workers

    space, started = saved_sweep(tmp_path, num_workers=2, cpus_per_worker=0.5)
    bare = dataclasses.replace(started, num_workers=1, cpus_per_worker=0.9)  # the space's run
    assert check_resume(space, bare)
    kept = resumed_workers(bare, frozenset())
    assert (kept.num_workers, kept.cpus_per_worker) == (2, 0.5)  # as it started
    typed = resumed_workers(bare, frozenset({"num_workers"}))
    assert (typed.num_workers, typed.cpus_per_worker) == (1, 0.5)
    record_workers(typed)  # that resume ran on 1 worker: the next bare one goes on with it
    again = resumed_workers(bare, frozenset())
    assert (again.num_workers, again.cpus_per_worker) == (1, 0.5)


def test_the_command_resumes_on_the_started_workers_unless_a_count_is_typed(tmp_path, monkeypatch):
    """``recsys-sweep`` itself: an untyped ``--num-workers`` is None in the parser (the space's
    run section fills it), so a bare re-run takes the sweep's own; a typed one is kept."""
    from recsys.cli import sweep
    from recsys.tune import sweep as driver

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    saved_sweep(tmp_path, num_workers=2, cpus_per_worker=0.5)  # the smoke space, unfinished
    launched = []

    def launch(space, opts, **kw):
        launched.append(opts)
        return [{"status": "finished"}]

    monkeypatch.setattr(driver, "launch", launch)
    monkeypatch.setattr(sweep, "nothing_finished", lambda table: "")
    common = ["--smoke-test", "--name", "s", "--storage", str(tmp_path), "--address", "local"]
    sweep.main(common)
    sweep.main([*common, "--num-workers", "1"])
    assert [(o.num_workers, o.cpus_per_worker) for o in launched] == [(2, 0.5), (1, 0.5)]


def test_a_grown_optuna_search_starts_from_the_earlier_trials(tmp_path):
    import pandas as pd
    from optuna.trial import TrialState

    from recsys.tune.search import CONSTRAINT, ConstrainedOptunaSearch
    from recsys.tune.sweep import warm_points, worst

    space = spaces.load("default", smoke=True)
    params = [{d.key: d.tune().sample() for d in space.dimensions} for _ in range(4)]
    trials = pd.DataFrame({
        "trial": ["a", "b", "c", "d"], "role": "trial", "params": params,
        "status": ["finished", "infeasible", "error", "stopped"],  # d: by the scheduler
        "best_val_auc": [0.71, float("nan"), float("nan"), 0.69],
        "last_step": [20, 0, 0, 10],  # (int64, as a frame of trials that all reported has)
    })  # fmt: skip
    points = warm_points(trials, space, worst(space))
    assert [p.values for p in points] == [[0.71], [-1.0e30], [0.69]]  # the errored one: left out
    assert [(p.infeasible, p.pruned_at) for p in points] == [(False, None), (True, None),
                                                             (False, 10)]  # fmt: skip
    with warnings.catch_warnings():  # none on the sweep's console (the space's list choice)
        warnings.simplefilter("error")
        searcher = ConstrainedOptunaSearch(
            metric="best_val_auc", mode="max", worst=worst(space), seed=0, warm=points
        )
        searcher.set_search_properties("best_val_auc", "max", {"params": space.param_space()})
    told = searcher._ot_study.trials
    assert [t.state for t in told] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert [t.value for t in told[:2]] == [0.71, -1.0e30]
    assert told[2].intermediate_values == {10: 0.69}
    assert [t.user_attrs[CONSTRAINT] for t in told] == [[0.0], [1.0], [0.0]]
    assert [t.constraints for t in told] == [{"infeasible": v} for v in (0.0, 1.0, 0.0)]  # TPE's
    assert told[0].params == {f"params/{k}": v for k, v in params[0].items()}
    for trial in ("e", "f"):  # and it samples on from there; a trial the scheduler stopped:
        assert set(searcher.suggest(trial)["params"]) == set(space.param_space())
        report = {"best_val_auc": 0.7, "training_iteration": 1, "step": 10}
        searcher.on_trial_result(trial, report)
    searcher.on_trial_complete("e", {**report, "train_steps": 40})
    searcher.on_trial_complete("f", {**report, "train_steps": 10})
    searcher.suggest("g")  # refused on the driver: told as a violation, at the worst score
    searcher.on_trial_complete("g", {"infeasible": 1.0, "step": 0, "best_val_auc": float("nan")})
    e, f, g = searcher._ot_study.trials[3:]
    assert e.intermediate_values == {10: 0.7}  # at its training step, as the warm ones
    assert (e.state, e.value, f.state, f.value) == (
        TrialState.PRUNED,
        0.7,
        TrialState.COMPLETE,
        0.7,
    )
    assert (g.state, g.value) == (TrialState.COMPLETE, -1.0e30)
    assert [t.constraints for t in (e, f, g)] == [{"infeasible": v} for v in (0.0, 0.0, 1.0)]


def test_a_searcher_saved_by_an_earlier_version_still_loads():
    """Sweeps saved before Optuna 5's ``set_constraint`` pickled a TPE sampler holding our
    ``constraints_func``: the name must still resolve, or those sweeps cannot resume."""
    import pickle

    from optuna.samplers import TPESampler

    from recsys.tune import search

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # constraints_func: deprecated
        saved = pickle.dumps(TPESampler(seed=0, constraints_func=search._violation))
    assert pickle.loads(saved)._constraints_func is search._violation


def test_a_sweeps_export_has_one_folder_whoever_writes_it(tmp_path):
    """``recsys-sweep --export`` and ``recsys-export --sweep`` (given the sweep's --storage) both
    write to ``export_dir``: in the sweep's folder, or ``exports/<sweep>`` for an object store."""
    from recsys.tune.state import export_dir

    assert export_dir(str(tmp_path), "s") == str(tmp_path / "s" / "export")
    assert export_dir(f"file://{tmp_path}", "s") == str(tmp_path / "s" / "export")
    assert export_dir("s3://b/sweeps", "s") == os.path.abspath(os.path.join("exports", "s"))


def test_the_storage_check_reads_a_prepared_folder_by_the_file_its_data_layer_names(tmp_path):
    """``run_paths`` (the data layer) names the file whose digest stands for a prepared folder,
    its ``meta.json``; the runtime's check reads the file it is given, else a folder's listing,
    and knows nothing of prepared folders itself."""
    from recsys.config import DataConfig
    from recsys.data.dataset import run_paths
    from recsys.runtime.shared_storage import probe

    prepared, days = tmp_path / "prepared", tmp_path / "days"
    prepared.mkdir()
    days.mkdir()
    (prepared / "meta.json").write_text("{}")
    paths, files = run_paths("runs", DataConfig(source="prepared", paths=[str(prepared)]))
    assert paths == {"--storage": "runs", "--data": str(prepared)}
    assert files == {"--data": str(prepared / "meta.json")}
    assert run_paths("runs", DataConfig(source="torchrec", paths=[str(days)]))[1] == {}
    assert run_paths("runs", DataConfig(source="synthetic")) == ({"--storage": "runs"}, {})
    seen = probe("--data", str(prepared), [], files["--data"])
    assert (seen.target, seen.what, seen.listing) == (files["--data"], "meta.json", False)
    assert probe("--data", str(prepared), []).listing  # no file named: the folder's listing
