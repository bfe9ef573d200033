"""Retrain a registered model on a later period and promote it only on a real win
(``recsys.lifecycle.retrain``).

    recsys-preprocess --like data/week1 logs/week2/ --out data/week2
    recsys-retrain --model models:/clicklogs-dlrm@champion --data data/week2
    recsys-retrain --model models:/clicklogs-dlrm/3 --data data/week2 --epochs 2 --seeds 5
    recsys-retrain --model models:/clicklogs-dlrm@champion --data data/week2 --max-concurrent 6
    recsys-retrain --model models:/clicklogs-dlrm@champion --data data/week2 --refit

Trains the model's configuration on ``--data`` warm-started from its checkpoint, and the same
configuration from scratch, ``--seeds`` times each, ``--max-concurrent`` at once (runs on Ray:
``--address`` and the worker flags as recsys-train's; re-running the command resumes what a
killed one left); picks the warm start, or the models from scratch where they score better on
the new period's validation rows; scores the pick and the frozen model on its test rows;
registers the pick as a new version and moves ``@champion`` to it only where its lead over the
frozen model is outside the seed noise. With ``--refit``, the pick's registered seed is trained
again on the new period's training and validation rows first, and that refit is registered.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from recsys.cli import add_address, add_options, count, model_uri, positive, ray_address
from recsys.configlib import ConfigError
from recsys.runtime.cluster import WorkerOptions

if TYPE_CHECKING:
    from recsys.lifecycle.plan import Plan
    from recsys.runtime.cluster import RaySource
    from recsys.tracking.tracker import Tracker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parser of ``recsys-retrain``: the retrain's own options and the worker options every
    training command shares (``WorkerOptions``)."""
    p = argparse.ArgumentParser(
        prog="recsys-retrain", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--model",
        required=True,
        type=model_uri,
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
        "--max-concurrent",
        type=count,
        default=1,
        metavar="N",
        help="trainings at once (default 1), each with --num-workers workers; those the "
        "cluster cannot hold yet wait for room",
    )  # fmt: skip
    p.add_argument(
        "--metric",
        choices=["auc", "gauc", "log_loss"],
        default="auc",
        help="the metric that picks (validation rows) and decides (test rows); gauc: the "
        "data's schema names group_by",
    )
    p.add_argument(
        "--refit",
        action="store_true",
        help="register the pick's seed trained again on the new period's training and "
        "validation rows (as recsys-export --refit does a sweep's best): what serves learns "
        "from recent rows too; the seeds still decide, and the refit, in the registered seed's "
        "place, must beat the frozen model",
    )
    p.add_argument(
        "--tracking-uri", help="MLflow URI (default: sqlite:///<cwd>/mlflow.db, which must exist)"
    )
    p.add_argument("--storage", default="runs", help="where the trainings' checkpoints go")
    p.add_argument(
        "--out", help="the picked model's export (default exports/<the retrain's key>: "
        "<name>-v<version>-<digest of the data and configuration>, with -refit after it for "
        "--refit)",
    )  # fmt: skip
    p.add_argument("--dtype", choices=["int8", "int4", "fp16"], default="int8",
                   help="the export's table precision")  # fmt: skip
    add_address(p)
    add_options(p, WorkerOptions)
    # the champion's own workers by default: a batch size is each worker's, so other workers
    # would train other global batches and steps than its configuration did
    p.set_defaults(num_workers=None)
    for action in p._actions:
        if action.dest == "num_workers":
            action.help = ("workers per training (default: as many as wrote the model's "
                           f"checkpoint, else {WorkerOptions().num_workers}): each trains "
                           "train.batch_size rows a step, as the model's trial did")  # fmt: skip
    return p.parse_args(argv)


def champion_workers(checkpoint: str) -> int:
    """The workers that wrote the champion's ``checkpoint`` (a folder or an object store URI:
    its rank 0's record), else, where it cannot be read, ``WorkerOptions``' default."""
    from recsys.distributed.checkpoint import CheckpointError, saved_world_size

    try:
        return saved_world_size(checkpoint) or WorkerOptions().num_workers
    except CheckpointError:
        return WorkerOptions().num_workers


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from recsys.lifecycle.plan import check_request
    from recsys.runtime.storage import check_storage, resolved

    try:  # what the command line alone refuses, before MLflow is imported (seconds)
        check_request(args.model, resolved(args.data), args.seeds, args.metric, args.refit)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    from recsys.serving.mlflow_model import quiet_libraries
    from recsys.tracking.tracker import Tracker
    from recsys.tune.state import reading_uri

    quiet_libraries()  # the console the frozen model's scoring and the pick's export print
    try:  # everything refused before Ray starts
        tracker = Tracker(reading_uri(args.tracking_uri, os.getcwd()))
        plan = checked_plan(args, tracker, resolved(args.data))
        storage = resolved(args.storage)
        check_storage(storage)
        address = ray_address(args.address)
    except (ConfigError, ConnectionError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    run(args, plan, tracker, storage, address)


def checked_plan(args: argparse.Namespace, tracker: Tracker, data: str) -> Plan:
    """The retrain's plan, its configuration as the workers' device trains it
    (``recsys.distributed.preflight.check``: what the workers train is what MLflow records)."""
    import dataclasses

    from recsys.distributed import preflight
    from recsys.lifecycle.plan import plan_retrain

    plan = plan_retrain(tracker, args.model, data, args.epochs, args.seeds, args.metric,
                        args.refit)  # fmt: skip
    if args.num_workers is None:
        args.num_workers = champion_workers(plan.checkpoint)
    device = "cuda" if args.use_gpu else "cpu"
    plan = dataclasses.replace(plan, cfg=preflight.check(plan.cfg, device, args.num_workers))
    preflight.check(plan.config_of("retrained", 1), device, args.num_workers)
    if plan.refit:
        preflight.check(plan.refit_of("retrained", 1), device, args.num_workers)
    return plan


def run(args: argparse.Namespace, plan: Plan, tracker: Tracker, storage: str,
        address: RaySource) -> None:  # fmt: skip
    """On the Ray ``address`` names: the retrain's trainings, scores and decision."""
    from recsys.data.dataset import run_paths
    from recsys.lifecycle.plan import ROLES
    from recsys.lifecycle.retrain import run_retrain
    from recsys.runtime.cluster import alive_nodes, connect, node_share, wait_for_fit
    from recsys.runtime.shared_storage import check_nodes_see
    from recsys.runtime.storage import is_uri
    from recsys.train.ray_trainer import Resources

    connect(address)
    gpus = 1.0 if args.use_gpu else 0.0
    paths, files = run_paths(storage, plan.cfg.data)
    if not is_uri(plan.checkpoint):  # the workers warm-start from it
        paths["--model's checkpoint"] = plan.checkpoint
    try:
        wait_for_fit(args.num_workers, args.cpus_per_worker, gpus, 0.0, args.wait_for_nodes)
        check_nodes_see(paths, files)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    concurrent = min(args.max_concurrent, len(ROLES) * plan.seeds)  # (trainings at most)
    _, share = node_share(alive_nodes(), args.num_workers, args.cpus_per_worker, gpus,
                          concurrent)  # fmt: skip
    resources = Resources(args.num_workers, args.use_gpu, args.cpus_per_worker, share)
    out = args.out or os.path.abspath(os.path.join("exports", plan.key + ("-refit" if plan.refit
                                                                          else "")))  # fmt: skip
    print(f"retraining {args.model} (version {plan.version}) on {args.data}: {plan.seeds} seeds, "
          f"warm-started and from scratch, {concurrent} at a time of {args.num_workers} "
          f"worker{'s' if args.num_workers > 1 else ''}; picked by "
          f"val_{plan.metric}, decided by test_{plan.metric}"
          f"{'; the pick refitted on training + validation' if plan.refit else ''}")  # fmt: skip
    outcome = run_retrain(plan, tracker, resources, storage, out, dtype=args.dtype,
                          concurrent=concurrent)  # fmt: skip
    print(f"registered {plan.name} version {outcome.version} (export in {out})")


if __name__ == "__main__":
    main()
