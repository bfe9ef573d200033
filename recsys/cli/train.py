"""Train one DLRM configuration on Ray (Ray Train; one CPU worker: a Ray task); print its metrics.

    recsys-train                           # the `debug` experiment on 2 CPU workers of a local Ray
    recsys-train --experiment debug --set model.interaction=cat --set train.steps=100
    recsys-train --config my.yaml --address auto --num-workers 8 --gpus

(``python experiments/train.py`` is the same command.) Re-running with the same --name and
--storage resumes from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from recsys.cli import add_address, add_options, ray_address
from recsys.config_registry import EXPERIMENTS, from_file, named, parse_overrides
from recsys.configlib import ConfigError
from recsys.data.columns import DataError
from recsys.runtime.cluster import WorkerOptions
from recsys.runtime.storage import resolved

RESULT_KEYS = [
    "step",
    "epochs_done",
    "loss",
    "val_auc",
    "val_log_loss",
    "val_ne",
    "val_calibration",
    "test_auc",
    "test_log_loss",
    "test_ne",
    "samples_per_s",
    "emb_bytes",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="recsys-train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--experiment", default="debug", help=f"one of {sorted(EXPERIMENTS)}")
    src.add_argument("--config", help="YAML file of overrides on the defaults")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    add_address(p)
    add_options(p, WorkerOptions)
    p.add_argument("--storage", default="runs", help="checkpoint storage (shared on a cluster)")
    p.add_argument("--name", help="run name (default: the experiment name)")
    p.add_argument(
        "--max-failures",
        type=int,
        default=2,
        help="restarts from the last checkpoint after a failure (a worker group's, or a "
        "one-worker task's; negative: no limit)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from recsys.data.dataset import run_paths, with_data
    from recsys.distributed import preflight

    try:
        cfg = from_file(args.config) if args.config else named(args.experiment)
        cfg = with_data(cfg, parse_overrides(args.set))
        device = "cuda" if args.use_gpu else "cpu"
        cfg = preflight.check(cfg, device, args.num_workers)  # every refusal, before Ray starts
        address = ray_address(args.address)
    except (ConfigError, ConnectionError) as e:
        raise SystemExit(f"error: {e}") from None
    from recsys.runtime.cluster import connect, wait_for_fit
    from recsys.runtime.shared_storage import check_nodes_see
    from recsys.train.launch import make_run
    from recsys.train.ray_trainer import Resources

    resources = Resources(args.num_workers, args.use_gpu, args.cpus_per_worker)
    connect(address)
    storage = resolved(args.storage)
    try:
        gpus = 1.0 if args.use_gpu else 0.0
        wait_for_fit(args.num_workers, args.cpus_per_worker, gpus, 0.0, args.wait_for_nodes)
        check_nodes_see(*run_paths(storage, cfg.data, "data.paths"))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    trainer = make_run(
        cfg,
        resources,
        name=args.name or cfg.name,
        storage_path=storage,
        max_failures=args.max_failures,
    )
    t0 = time.time()
    try:
        result = trainer.fit()
    except (ConfigError, DataError) as e:
        raise SystemExit(f"error: {e}") from None
    print_result(result.metrics or {}, result.checkpoint, time.time() - t0)


def print_result(metrics: dict[str, Any], checkpoint: Any, seconds: float) -> None:
    print(f"\nfinished in {seconds:.1f}s")
    if "step" not in metrics:
        print("  nothing was trained: this run name already reached its steps (use a new --name)")
    per_task = [k for k in metrics if "/" in k and k.split("/")[0] in ("val_auc", "test_auc")]
    for k in RESULT_KEYS + sorted(per_task):
        if k in metrics:
            v = metrics[k]
            print(f"  {k:16s} {v:.5g}" if isinstance(v, float) else f"  {k:16s} {v}")
    if checkpoint is not None:
        print(f"  checkpoint       {checkpoint.path}")


if __name__ == "__main__":
    main()
