"""Retrain a registered model on a later period and promote it only on a real win
(``recsys.lifecycle.retrain``).

    recsys-preprocess --like data/week1 logs/week2/ --out data/week2
    recsys-retrain --model models:/clicklogs-dlrm@champion --data data/week2
    recsys-retrain --model models:/clicklogs-dlrm/3 --data data/week2 --epochs 2 --seeds 5

Trains the model's configuration on ``--data`` warm-started from its checkpoint, and the same
configuration from scratch, ``--seeds`` times each (Ray Train runs: ``--address`` and the worker
flags as recsys-train's; re-running the command resumes what a killed one left); scores them and
the frozen model on the new period's test rows; registers the retrained model as a new version
and moves ``@champion`` to it only where its lead over the frozen model is outside the seed noise.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from recsys.cli import add_address, add_options, count, positive, ray_address
from recsys.configlib import ConfigError
from recsys.runtime.cluster import WorkerOptions

if TYPE_CHECKING:
    from recsys.lifecycle.retrain import Plan
    from recsys.runtime.cluster import RaySource
    from recsys.tracking.tracker import Tracker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="recsys-retrain", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--model",
        required=True,
        metavar="models:/NAME@ALIAS",
        help="the registered model to retrain (models:/NAME@ALIAS or /VERSION)",
    )
    p.add_argument("--data", required=True,
                   help="the new period, prepared with recsys-preprocess --like")  # fmt: skip
    p.add_argument(
        "--epochs",
        type=positive,
        help="epochs of the new period (default: where the model's trial peaked)",
    )
    p.add_argument("--seeds", type=count, default=3, help="seeds of each training (default 3)")
    p.add_argument(
        "--metric",
        choices=["auc", "gauc", "log_loss"],
        default="auc",
        help="the test metric that decides (gauc: the data's schema names group_by)",
    )
    p.add_argument("--tracking-uri", help="MLflow URI (default: sqlite:///<cwd>/mlflow.db)")
    p.add_argument("--storage", default="runs", help="where the trainings' checkpoints go")
    p.add_argument("--out", help="the retrained model's export (default exports/<name>-retrain)")
    add_address(p)
    add_options(p, WorkerOptions)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from recsys.distributed import preflight
    from recsys.lifecycle.retrain import plan_retrain
    from recsys.runtime.storage import check_storage, resolved
    from recsys.tracking.tracker import Tracker
    from recsys.tune.state import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri(os.getcwd())
    tracker = Tracker(uri)
    device = "cuda" if args.use_gpu else "cpu"
    try:  # everything refused before Ray starts
        plan = plan_retrain(tracker, args.model, resolved(args.data), args.epochs, args.seeds,
                            args.metric)  # fmt: skip
        for role in ("retrained", "scratch"):
            preflight.check(plan.config_of(role, 1), device, args.num_workers)
        storage = resolved(args.storage)
        check_storage(storage)
        address = ray_address(args.address)
    except (ConfigError, ConnectionError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    run(args, plan, tracker, storage, address)


def run(args: argparse.Namespace, plan: Plan, tracker: Tracker, storage: str,
        address: RaySource) -> None:  # fmt: skip
    """On the Ray ``address`` names: the retrain's trainings, scores and decision."""
    from recsys.data.dataset import run_paths
    from recsys.lifecycle.retrain import run_retrain
    from recsys.runtime.cluster import connect, start_train_coordinator, wait_for_fit
    from recsys.runtime.shared_storage import check_nodes_see
    from recsys.train.ray_trainer import Resources

    connect(address)
    start_train_coordinator()
    gpus = 1.0 if args.use_gpu else 0.0
    try:
        wait_for_fit(args.num_workers, args.cpus_per_worker, gpus, 0.0, args.wait_for_nodes)
        check_nodes_see(*run_paths(storage, plan.cfg.data))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    resources = Resources(args.num_workers, args.use_gpu, args.cpus_per_worker)
    out = args.out or os.path.abspath(os.path.join("exports", f"{plan.name}-retrain"))
    print(f"retraining {args.model} (version {plan.version}) on {args.data}: {plan.seeds} seeds, "
          f"warm-started and from scratch, by test_{plan.metric}")  # fmt: skip
    outcome = run_retrain(plan, tracker, resources, storage, out)
    print(f"registered {plan.name} version {outcome.version}")


if __name__ == "__main__":
    main()
