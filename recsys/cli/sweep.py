"""Sweep DLRM configurations with Ray Tune; each trial trains on Ray Train; MLflow records all.

    recsys-sweep                           # the `default` space: local Ray, ./mlflow.db, ./runs
    recsys-sweep --space criteo --address auto --gpus --num-workers 8 \\
        --storage /shared/sweeps --tracking-uri http://mlflow:5000
    recsys-sweep --name default --resume   # pick a killed sweep up again
    recsys-sweep --name default --more 8 --search optuna   # 8 more trials, warm-started
    recsys-sweep --name default --restart  # archive the finished sweep `default`, run it anew
    recsys-sweep --confirm 3 --seeds 5     # then re-train the 3 best with 5 new seeds each
    mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1   # compare the runs

(``python experiments/sweep.py`` is the same command.) Re-running an unfinished sweep's --name
resumes it: finished trials stay finished, unfinished ones continue from their last checkpoint, with
the options it started with (another --num-samples, --search, --scheduler, --max-concurrent, --seed,
--confirm or --seeds is refused, naming each). A finished sweep's name is refused: --more N grows it
by N trials (Optuna warm-started with every earlier trial's score; the references are not re-run;
the seed check runs again over all trials), --restart archives it and starts over. The last line
printed is the link to the sweep's runs in the MLflow UI (after the ``mlflow ui`` command that
serves a local store): its trials and baselines, best first, with the score and the searched
parameters as columns.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from recsys.cli import TYPES, add_address, add_options, kind_of, ray_address
from recsys.configlib import ConfigError, nearest

# the options a space's ``run`` section may set, where the command line does not
RUN = ("num_workers", "cpus_per_worker", "max_concurrent", "scheduler", "search")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parser of ``recsys-sweep``: the options declared on ``SweepOptions``' fields
    (``recsys.cli.add_options``), and those of this command alone."""
    from recsys.tune.state import SweepOptions

    p = argparse.ArgumentParser(
        prog="recsys-sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--space", default="default", help="search space name or YAML path")
    p.add_argument("--smoke-test", action="store_true", help="the space's tiny smoke variant")
    p.add_argument(
        "--data", help="a prepared folder (recsys-preprocess; or its s3://... URI) or TorchRec's "
        "Criteo folder: replaces data.paths; features, tables and tasks follow it",
    )  # fmt: skip
    add_address(p)
    p.add_argument(
        "--storage",
        default="runs",
        help="checkpoints and Tune state: a folder shared by the cluster's nodes, or an object "
        "store URI (s3://bucket/prefix; docs/cluster.md)",
    )
    p.add_argument("--tracking-uri", help="MLflow URI (default: sqlite:///<cwd>/mlflow.db)")
    p.add_argument("--name", help="sweep name (default: the space's name)")
    again = add_options(p, SweepOptions)["again"]
    defer_to_space(p)
    again.add_argument(
        "--restart", action="store_true",
        help="archive the sweep of this --name (its folder and MLflow experiment renamed aside) "
        "and start it over",
    )  # fmt: skip
    p.add_argument(
        "--confirm-references", action="store_true",
        help="the seed check re-trains each reference's best too (its --seeds), so that the "
        "verdict against it compares interval with interval (default: the space's confirm)",
    )  # fmt: skip
    p.add_argument(
        "--export",
        choices=["int8", "int4", "fp16"],
        help="at the end, export the best model for serving (see recsys-export)",
    )
    p.add_argument("--register", help="with --export: register the MLflow model under this name")
    p.add_argument(
        "--refit", action="store_true",
        help="with --export: train the best trial again on training + validation rows, for the "
        "epochs where it peaked, and export that model (as recsys-export --refit)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.more and args.num_samples is not None:
        p.error("--more N is the growth's number of trials: leave --num-samples out")
    if args.widen and not args.more:
        p.error("--widen widens the ranges of a growth: it needs --more N")
    if args.refit and not args.export:
        p.error("--refit exports the refitted model: it needs --export DTYPE")
    return args


def defer_to_space(p: argparse.ArgumentParser) -> None:
    """The flags of ``RUN`` untyped are None (the space's ``run`` section says them first:
    ``run_defaults``), their help naming both defaults."""
    from recsys.configlib import options
    from recsys.tune.state import WORKERS, SweepOptions

    for action in p._actions:
        if action.dest in RUN:
            default = options(SweepOptions)[action.dest][1]
            help = (action.help or "").split(" (default")[0]
            resume = "; a resume: its latest run's" if action.dest in WORKERS else ""
            action.help = f"{help} (default: the space's run section, else {default}{resume})"
            action.default = None


def sweep_options(args: argparse.Namespace, space: Any) -> Any:
    """The ``SweepOptions`` of the command line: every option typed, the name, storage and store
    by their rules, the sample count from the smoke variant or the space where not typed, the
    space's ``run`` section where not typed (``run_defaults``), and the dataclass's default
    where none says."""
    from recsys.configlib import options
    from recsys.runtime.storage import resolved
    from recsys.tune.state import SweepOptions, default_tracking_uri

    given = {k: getattr(args, k) for k in options(SweepOptions) if getattr(args, k) is not None}
    smoke = space.smoke.get("num_samples") if args.smoke_test else None
    if "num_samples" not in given and (n := smoke or space.raw.get("num_samples")):
        given["num_samples"] = n
    given = {**run_defaults(space), **given}
    return SweepOptions(
        name=args.name or space.name,
        storage=resolved(args.storage),
        tracking_uri=args.tracking_uri or default_tracking_uri(os.getcwd()),
        **given,
    )


def run_defaults(space: Any) -> dict[str, Any]:
    """The space's ``run`` section (``run: {num_workers: 1, max_concurrent: 2}``): options of
    ``RUN`` by their names, each value checked as its flag checks a typed one; refused naming
    the space's file and the key."""
    from recsys.configlib import options
    from recsys.tune.state import SweepOptions

    declared = options(SweepOptions)
    out: dict[str, Any] = {}
    for key, value in space.run.items():
        if key not in RUN:
            raise ConfigError(f"{space.source}: run.{key}: not an option a space sets"
                              f"{nearest(str(key), RUN)}; it sets {', '.join(RUN)}")  # fmt: skip
        opt, default = declared[key]
        kind = kind_of(opt, default)
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise argparse.ArgumentTypeError(f"{value!r} is not a {kind}")
            out[key] = TYPES[kind](str(value))
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"{space.source}: run.{key}: {e}") from None
        if opt.choices and out[key] not in opt.choices:
            raise ConfigError(f"{space.source}: run.{key}: {value!r} is not one of "
                              f"{', '.join(opt.choices)}")  # fmt: skip
    return out


def with_confirm(space: Any, top: int | None, seeds: int | None, references: bool = False) -> Any:
    """The space with ``--confirm K --seeds N --confirm-references`` applied (``--confirm 0``:
    no seed check)."""
    import dataclasses

    from recsys.tune.space import Confirm, confirm_of

    if top is None and seeds is None and not references:
        return space
    if top == 0:
        if references:
            raise ConfigError("--confirm-references needs a seed check (not --confirm 0)")
        return dataclasses.replace(space, confirm=Confirm(0, 0))
    top = top if top is not None else space.confirm.top
    if not top:
        flag = "--seeds" if seeds is not None else "--confirm-references"
        raise ConfigError(f"{flag} needs --confirm K (the space has no confirm section)")
    seeds = seeds if seeds is not None else (space.confirm.seeds or 3)
    refs = references or space.confirm.references
    return dataclasses.replace(space, confirm=confirm_of(top, seeds, "--confirm/--seeds", refs))


def restart(opts: Any) -> None:
    """``--restart``: the sweep's MLflow experiment, then its folder, renamed aside (archived,
    kept), so that old and new never mix in the results, the export or the MLflow UI. The
    tracking store is checked first: nothing moves if it cannot be reached."""
    from recsys.tracking.tracker import Tracker
    from recsys.tune.state import archive

    tracker = Tracker(opts.tracking_uri)
    tracker.check_reachable()
    renamed = tracker.archive_experiment(opts.name)
    folder = archive(opts)
    where = [
        f"folder {folder}" if folder else "",
        f"MLflow experiment {renamed!r}" if renamed else "",
    ]
    if any(where):
        print(f"archived sweep {opts.name!r}: " + ", ".join(w for w in where if w))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no INFO lines of table creation
    from recsys.tune import space as spaces

    try:  # the space first: a mistake in it is reported before Ray, torch and MLflow load
        space = spaces.load(args.space, smoke=args.smoke_test, data=args.data)
        with_confirm(space, args.confirm, args.seeds, args.confirm_references)  # (checked)
        from recsys.runtime.storage import check_storage
        from recsys.tune.state import (
            RESTORED,
            WORKERS,
            check_resume,
            grown_options,
            restored_options,
            resumed_workers,
        )

        opts = sweep_options(args, space)
        check_storage(opts.storage)  # before Ray, torch and MLflow load
        address = ray_address(args.address)
        if args.restart:
            restart(opts)
        typed = frozenset(k for k in RESTORED if getattr(args, k) is not None)
        if restore := check_resume(space, opts, typed):
            opts = grown_options(opts, typed) if opts.more else restored_options(opts)
            typed_workers = frozenset(k for k in WORKERS if getattr(args, k) is not None)
            opts = resumed_workers(opts, typed_workers)
        space = with_confirm(space, opts.confirm, opts.seeds, args.confirm_references)
        from recsys.tune.sweep import launch

        table = launch(
            space, opts, address=address, export=args.export, register=args.register,
            refit=args.refit, restore=restore,
        )  # fmt: skip
    except (ConfigError, ConnectionError) as e:
        raise SystemExit(f"error: {e}") from None
    if why := nothing_finished(table):
        raise SystemExit(f"error: sweep {opts.name!r}: {why}")


def nothing_finished(table: list[dict[str, Any]]) -> str:
    """Why the sweep failed, where none of its search trials has a score to stand on (every one
    errored, diverged or was infeasible): the command then exits non-zero, as a Ray job or a
    script needs to see; '' when one trial finished."""
    from collections import Counter

    from recsys.tune.results import any_scored

    if any_scored(table):
        return ""
    trials = [r for r in table if r.get("role", "trial") == "trial"]
    counts = ", ".join(f"{n} {s}" for s, n in Counter(r.get("status") for r in trials).items())
    return f"no trial finished ({counts or 'no trials'}): the errors are above and in MLflow"


if __name__ == "__main__":
    main()
