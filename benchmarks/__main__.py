"""Benchmarks, run from the project folder. Each prints a Markdown table; --append adds it to
BENCHMARKS.md with the machine, versions, date, command and the commit it ran on. --append
refuses, before the run, a checkout whose tracked files differ from the commit (untracked files
and BENCHMARKS.md itself aside), naming them; --allow-dirty runs anyway and writes "(uncommitted
changes: FILES)" next to the commit. Outside a git checkout it writes "commit unknown".

    .venv/bin/python -m benchmarks step [--quick]      # our DMP step vs a plain-PyTorch DLRM
    .venv/bin/python -m benchmarks overhead            # per-trial orchestration overhead of a sweep
    .venv/bin/python -m benchmarks qr [--data FILE]    # QR memory / accuracy trade-off
    .venv/bin/python -m benchmarks data                # reader samples/s vs the training step
    .venv/bin/python -m benchmarks scale memory        # worker memory, 2 vs 8 Terabyte-shaped days
    .venv/bin/python -m benchmarks scale big --gib 32  # a folder larger than RAM (deleted after)
    .venv/bin/python -m benchmarks scale preprocess    # Criteo text: rows/s, 0 / 1 / 2 workers
    .venv/bin/python -m benchmarks scale collisions    # hash mod rows vs vocabularies (Kaggle)
    .venv/bin/python -m benchmarks sweeps              # time to a FIFO sweep's best: ASHA, Optuna
    .venv/bin/python -m benchmarks store               # MLflow rows and bytes per trial-step
    .venv/bin/python -m benchmarks soak                # 200 trials, a PostgreSQL-backed server,
                                                       # driver/server/worker faults mid-flight
    .venv/bin/python -m benchmarks export --gib 2      # INT8 export of 2 GiB of FP32 tables:
                                                       # peak memory and time
    .venv/bin/python -m benchmarks checkpoint --gib 1  # checkpoint save/restore: S3 vs local disk
    .venv/bin/python -m benchmarks serving             # the served endpoint: requests/s, p50/p99
    .venv/bin/python -m benchmarks quality             # the sweep's best against a plain MLP,
                                                       # its references against scikit-learn's LR
                                                       # and a plain FM, and the oracle
    .venv/bin/python -m benchmarks quickstart          # the README's default sweep, timed
    .venv/bin/python -m benchmarks timewalk            # a drifting log over 6 periods: frozen
                                                       # champion, retrained, a new sweep each
    .venv/bin/python -m benchmarks refcost             # the references under halving against
                                                       # their full grids: score, trial-seconds

They live outside the installed ``recsys`` package: the plain-PyTorch baseline model and the
Ray/MLflow drivers here are measuring tools, not part of the library.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.common import Revision, revision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ["dot", "cat", "sum", "dcn"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="append the result to BENCHMARKS.md with the machine, the date and the commit; "
        "refused where tracked files have uncommitted changes",
    )
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="with --append: run on uncommitted changes and write them next to the commit",
    )
    sub = p.add_subparsers(dest="bench", required=True)
    s = sub.add_parser("step", help="training-step throughput vs a plain-PyTorch DLRM")
    s.add_argument("--config", choices=["small", "criteo", "both"], default="both")
    s.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    s.add_argument("--steps", type=int, default=0, help="steps per run (default by config)")
    s.add_argument("--reps", type=int, default=3, help="alternating A/B runs")
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--quick", action="store_true", help="dot only, fewer steps")
    s.add_argument("--workers", type=int, choices=[1, 2], default=1, help="2: through Ray Train")
    o = sub.add_parser("overhead", help="per-trial orchestration overhead of a sweep")
    o.add_argument("--trials", type=int, default=3)
    o.add_argument("--steps", type=int, default=100)
    o.add_argument("--workers", type=int, choices=[1, 2], default=2,
                   help="per trial (1: ours trains in its Tune trial)")  # fmt: skip
    q = sub.add_parser("qr", help="QR memory / accuracy trade-off")
    q.add_argument("--data", help="a prepared Criteo folder (default: synthetic)")
    q.add_argument("--steps", type=int, default=300)
    q.add_argument("--collisions", nargs="+", type=int, default=[2, 4, 8, 16])
    q.add_argument("--ops", nargs="+", default=["mult", "add", "concat"])
    d = sub.add_parser("data", help="reader samples/s vs the training step")
    d.add_argument("--rows", type=int, default=200_000)
    d.add_argument("--file", help="a Criteo text file to prepare instead of generated rows")
    w = sub.add_parser("sweeps", help="sweep efficiency against a random FIFO sweep")
    w.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    w.add_argument("--trials", type=int, default=16)
    w.add_argument("--steps", type=int, default=300)
    c = sub.add_parser("scale", help="Criteo-scale data: memory, big folders, preprocessing")
    c.add_argument("what", choices=["memory", "big", "preprocess", "collisions"])
    c.add_argument("--rows-per-day", type=int, default=2_000_000, help="memory")
    c.add_argument("--steps", type=int, default=0, help="default: 300 (memory), 1000 (big)")
    c.add_argument("--gib", type=float, default=32.0, help="big: size of the folder")
    c.add_argument("--rows", type=int, default=400_000, help="preprocess: rows generated")
    c.add_argument("--copies", type=int, default=8, help="preprocess: the rows repeated")
    c.add_argument("--chunk-mb", type=float, default=48.0, help="preprocess: bytes per task")
    o = sub.add_parser("own-data", help="your own data: preparation on Ray, multi-hot step")
    o.add_argument("what", choices=["prepare", "memory", "multihot", "prefetch"])
    o.add_argument("--batch", type=int, default=2048, help="prefetch: batch size")
    o.add_argument("--rows", type=int, default=5_000_000)
    o.add_argument("--files", type=int, default=8)
    o.add_argument("--workers", type=int, default=2)
    o.add_argument("--object-store-mb", type=int, default=256)
    o.add_argument("--cap-mb", type=int, default=1536, help="memory: the cap the run is given")
    o.add_argument("--steps", type=int, default=50, help="multihot: timed steps")
    o.add_argument("--mean-len", type=float, default=20.0, help="multihot: mean bag length")
    sub.add_parser("store", help="MLflow rows and bytes per trial-step of a smoke sweep")
    k = sub.add_parser("soak", help="hundreds of trials against a tracking server, with faults")
    k.add_argument("--trials", type=int, default=200)
    k.add_argument("--small", type=int, default=16, help="trials of the reference sweep")
    k.add_argument("--seed", type=int, default=0, help="where the faults fall")
    x = sub.add_parser("export", help="INT8 export of a large checkpoint: peak memory, time")
    x.add_argument("--gib", type=float, default=2.0, help="FP32 bytes of the tables, in GiB")
    c = sub.add_parser("checkpoint", help="checkpoint save and restore: S3 vs local disk")
    c.add_argument("--gib", type=float, default=1.0, help="FP32 bytes of the tables, in GiB")
    c.add_argument("--reps", type=int, default=3)
    v = sub.add_parser("serving", help="mlflow models serve: requests/s and latency vs in-process")
    v.add_argument("--requests", type=int, default=200, help="requests per size")
    u = sub.add_parser(
        "quality", help="the sweep's best against hand-written models and the oracle"
    )
    u.add_argument("--rows", type=int, default=75_000, help="planted log: rows (80%% training)")
    u.add_argument("--demo-rows", type=int, default=100_000, help="demo log: rows")
    u.add_argument("--samples", type=int, default=6, help="search trials per log")
    u.add_argument("--drift-rows", type=int, default=40_000, help="drift log: rows a period")
    u.add_argument("--logs", nargs="+",
                   choices=["planted", "demo", "drift", "two-tasks", "sequences"],
                   default=["planted", "demo", "drift", "two-tasks", "sequences"])  # fmt: skip
    u.add_argument("--workers", type=int, default=1, help="Ray Train workers per trial")
    u.add_argument("--concurrent", type=int, default=2, help="trials at a time")
    u.add_argument("--search", choices=["random", "optuna"], default="random",
                   help="the sweeps' search algorithm (recsys-sweep --search)")  # fmt: skip
    u.add_argument("--smoke", action="store_true", help="the space's smoke variant (a dry run)")
    sub.add_parser("quickstart", help="the README's default sweep from start to exit, timed")
    w = sub.add_parser("timewalk", help="a drifting log over periods: frozen, retrained, new sweep")
    w.add_argument("--periods", type=int, default=6)
    w.add_argument("--rows", type=int, default=20_000, help="rows a period")
    w.add_argument("--samples", type=int, default=6, help="trials of each period's sweep")
    w.add_argument("--seeds", type=int, default=3, help="seeds of each retrain")
    w.add_argument("--workers", type=int, default=1, help="Ray Train workers per training")
    w.add_argument(
        "--concurrent",
        type=int,
        default=2,
        help="a sweep's trials and a retrain's trainings at a time",
    )
    w.add_argument("--seed", type=int, default=0, help="the log's seed")
    r = sub.add_parser("refcost", help="the references under halving against their full grids")
    r.add_argument("--rows", type=int, default=75_000, help="planted log: rows (80%% training)")
    r.add_argument("--demo-rows", type=int, default=100_000, help="demo log: rows")
    r.add_argument("--logs", nargs="+", choices=["planted", "demo"], default=["planted", "demo"])
    r.add_argument("--workers", type=int, default=1, help="Ray Train workers per trial")
    r.add_argument("--concurrent", type=int, default=2, help="trials at a time")
    r.add_argument("--smoke", action="store_true", help="3,000 rows a log (a dry run)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> str:
    if args.bench == "serving":
        from benchmarks import serving

        return serving.run(args.requests)
    if args.bench == "checkpoint":
        from benchmarks import checkpoint

        return checkpoint.run(args.gib, args.reps)
    if args.bench == "export":
        from benchmarks import export

        return export.run(args.gib)
    if args.bench == "quickstart":
        from benchmarks import quickstart

        return quickstart.run()
    if args.bench == "timewalk":
        from benchmarks import timewalk

        return timewalk.main(args)
    if args.bench == "refcost":
        from benchmarks import refcost

        return refcost.run(
            args.rows, args.demo_rows, args.logs, args.workers, args.concurrent, args.smoke
        )
    if args.bench == "quality":
        from benchmarks import quality

        return quality.run(
            args.rows,
            args.demo_rows,
            args.samples,
            args.logs,
            args.workers,
            args.concurrent,
            args.smoke,
            args.search,
            args.drift_rows,
        )
    if args.bench == "own-data":
        from benchmarks import own_data

        if args.what == "prepare":
            return own_data.prepare_throughput(args.rows, args.files, args.workers)
        if args.what == "memory":
            return own_data.prepare_memory(
                args.rows, args.files, args.workers, args.object_store_mb, args.cap_mb
            )
        if args.what == "prefetch":
            return own_data.prefetch_step(args.rows, args.batch, args.steps)
        return own_data.multihot_step(args.steps, args.mean_len)
    if args.bench == "soak":
        from benchmarks import soak

        return soak.run(args.trials, args.small, args.seed)
    if args.bench == "store":
        from benchmarks import store

        return store.run()
    if args.bench == "step":
        from benchmarks import step

        cases = {"small": [step.SMALL], "criteo": [step.CRITEO], "both": [step.SMALL, step.CRITEO]}
        ops = ["dot"] if args.quick else args.ops
        if args.workers == 2:
            return step.two_workers(cases[args.config], ops, args.steps or 20)
        return step.run(cases[args.config], ops, args.steps or None, args.reps, args.threads)
    if args.bench == "overhead":
        from benchmarks import overhead

        return overhead.run(args.trials, args.steps, workers=args.workers)
    if args.bench == "qr":
        from benchmarks import qr

        return qr.sweep(args.data, args.steps, args.collisions, args.ops)
    if args.bench == "sweeps":
        from benchmarks import sweeps

        return sweeps.run(args.seeds, args.trials, args.steps)
    if args.bench == "scale":
        from benchmarks import scale

        if args.what == "memory":
            return scale.memory_vs_days(args.rows_per_day, args.steps or 300)
        if args.what == "big":
            return scale.larger_than_memory(args.gib, args.steps or 1000)
        if args.what == "preprocess":
            return scale.preprocessing(args.rows, args.copies, args.chunk_mb)
        return scale.collisions()
    from benchmarks import data

    return data.run(args.rows, path=args.file)


def refusal(rev: Revision) -> str:
    return (
        f"--append refused: tracked files differ from commit {rev.commit}: "
        f"{', '.join(rev.changed)}. Figures are recorded with the commit they ran on: commit "
        "these changes first, or pass --allow-dirty to write them next to the commit."
    )


def main(argv: list[str] | None = None, root: str = ROOT) -> None:
    args = parse_args(argv)
    rev = revision(root) if args.append else Revision(None)
    if rev.changed and not args.allow_dirty:
        sys.exit(refusal(rev))  # before the run, not after an hour of it
    if rev.changed:
        print(f"recorded as {rev.text()}", file=sys.stderr)
    result = run(args)
    print(result)
    if args.append:
        from benchmarks import common

        command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
        with open(os.path.join(root, "BENCHMARKS.md"), "a") as f:
            f.write(
                f"\n### `{args.bench}`: {common.machine()}, {rev.text()}\n\n"
                f"`{command}`\n\n{result}\n"
            )


if __name__ == "__main__":
    main()
