"""Sweep DLRM configurations with Ray Tune; every trial is a Ray Train job; MLflow records all.

    python experiments/sweep.py            # the `default` space: local Ray, ./mlflow.db
    python experiments/sweep.py --space criteo --address auto --gpus --num-workers 8 \\
        --storage /shared/sweeps --tracking-uri http://mlflow:5000
    python experiments/sweep.py --name default --resume  # pick a killed sweep up again
    mlflow ui --backend-store-uri sqlite:///mlflow.db    # compare the runs (127.0.0.1:5000)

Re-running with the same --name resumes too: finished trials stay finished, unfinished ones
continue from their last checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recsys.configlib import ConfigError
from recsys.tune import space as spaces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--space", default="default", help="search space name or YAML path")
    p.add_argument("--smoke-test", action="store_true", help="the space's tiny smoke variant")
    p.add_argument("--num-samples", type=int, help="trials to sample (default: from the space)")
    p.add_argument("--max-concurrent", type=int, default=1, help="trials running at once")
    p.add_argument("--scheduler", choices=["fifo", "asha"], default="fifo")
    p.add_argument("--search", choices=["random", "optuna"], default="random")
    p.add_argument("--num-workers", type=int, default=2, help="Ray Train workers per trial")
    p.add_argument("--cpus-per-worker", type=float, default=0.95)
    p.add_argument("--gpus", action="store_true", help="one GPU per worker (NCCL)")
    p.add_argument("--driver-cpus", type=float, default=0.1, help="CPU of each trial's driver")
    p.add_argument("--data", help="override data.paths (a Criteo file or preprocessed folder)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--storage", default=os.path.join(ROOT, "runs"), help="shared on a cluster")
    p.add_argument("--tracking-uri", help="MLflow URI (default: sqlite:///<project>/mlflow.db)")
    p.add_argument("--name", help="sweep name (default: the space's name)")
    p.add_argument("--resume", action="store_true", help="resume the sweep of this --name")
    p.add_argument("--max-failures", type=int, default=1, help="worker restarts per trial")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--export",
        choices=["int8", "int4", "fp16"],
        help="at the end, export the best trial for serving (see experiments/export.py)",
    )
    p.add_argument("--register", help="with --export: register the MLflow model under this name")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run(args)
    except (ConfigError, ConnectionError) as e:
        raise SystemExit(f"error: {e}") from None


def run(args: argparse.Namespace) -> None:
    space = spaces.load(args.space, smoke=args.smoke_test)
    if args.data:
        from recsys.data.loader import source_for

        data = {"data.source": source_for(args.data), "data.paths": [os.path.abspath(args.data)]}
        space = dataclasses.replace(space, base=space.base.with_overrides(data))
    from recsys.cluster import alive_nodes, check_fits, connect
    from recsys.tune.sweep import SweepOptions, check_resume, format_table, run_sweep, sweep_dir
    from recsys.tune.tracking import Tracker, default_tracking_uri

    storage = args.storage if "://" in args.storage else os.path.abspath(args.storage)
    smoke_samples = space.smoke.get("num_samples") if args.smoke_test else None
    opts = SweepOptions(
        name=args.name or space.name,
        storage=storage,
        tracking_uri=args.tracking_uri or default_tracking_uri(ROOT),
        num_samples=args.num_samples or smoke_samples or space.raw.get("num_samples", 8),
        max_concurrent=args.max_concurrent,
        scheduler=args.scheduler,
        search=args.search,
        num_workers=args.num_workers,
        cpus_per_worker=args.cpus_per_worker,
        use_gpu=args.gpus,
        driver_cpus=args.driver_cpus,
        max_failures=args.max_failures,
        seed=args.seed,
        resume=args.resume,
    )
    restore = check_resume(space, opts)
    tracker = Tracker(opts.tracking_uri)
    tracker.check_reachable()
    connect(args.address)
    check_fits(
        opts.num_workers,
        opts.cpus_per_worker,
        1.0 if opts.use_gpu else 0.0,
        alive_nodes(),
        extra_cpus=opts.driver_cpus,
    )
    table = run_sweep(space, opts, tracker, restore)
    print("\nbest trials (validation):")
    print(format_table(table))
    print(f"\nsweep folder: {sweep_dir(opts)}")
    if args.export:
        from recsys.export import export_best

        out = os.path.join(sweep_dir(opts), "export")
        run_id, report, uri = export_best(
            opts.tracking_uri, opts.name, out, args.export, args.register
        )
        print(
            f"exported the best trial ({run_id}) as {args.export}: {report.path}; "
            f"test AUC {report.exported_auc:.4f} (FP32 {report.fp32_auc:.4f}); MLflow model {uri}"
        )
    print(
        f"compare the runs: mlflow ui --backend-store-uri {opts.tracking_uri} "
        "--host 127.0.0.1 --port 5000"
    )


if __name__ == "__main__":
    main()
