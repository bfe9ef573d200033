"""Export a trained model for serving: INT8 (or INT4 / FP16) TorchRec tables, left unsharded (a
serving host that wants them on several GPUs shards the loaded model itself), traced and scripted;
checked against FP32 on the test split; logged as an MLflow model.

    recsys-export --sweep default --register dlrm-default
    recsys-export --sweep default --refit --register dlrm-default   # refitted on train + val
    recsys-export --model models:/dlrm-default@champion --dtype int4   # the champion again
    recsys-export --checkpoint runs/debug/step_00000200 --experiment debug

(``python experiments/export.py`` is the same command.)
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from recsys.cli import add_address, add_options, model_uri, positive, ray_address
from recsys.config_registry import EXPERIMENTS, from_file, named
from recsys.configlib import ConfigError, flag_of, options
from recsys.runtime.cluster import WorkerOptions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="recsys-export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep", help="export the best trial (by the sweep's metric) of a sweep")
    src.add_argument(
        "--checkpoint", help="a checkpoint folder or URI (with --experiment or --config)"
    )
    src.add_argument(
        "--model", type=model_uri, metavar="models:/NAME@ALIAS",
        help="a registered model (models:/NAME@ALIAS or models:/NAME/VERSION): export its trial "
        "again from its best checkpoint, e.g. in another --dtype",
    )  # fmt: skip
    p.add_argument("--experiment", help=f"with --checkpoint: one of {sorted(EXPERIMENTS)} "
                   "(default debug)")  # fmt: skip
    p.add_argument("--config", help="with --checkpoint: the YAML config of its run")
    p.add_argument("--dtype", choices=["int8", "int4", "fp16"], default="int8")
    p.add_argument(
        "--out", help="output folder (default: with --sweep <storage>/<sweep>/export, as "
        "recsys-sweep --export writes, exports/<sweep> for an object store; with --model "
        "exports/<name>-<alias or version>; with --checkpoint <checkpoint>/export, for a URI "
        "exports/<its folder name>)",
    )  # fmt: skip
    p.add_argument(
        "--register", help="with --sweep or --model: register the MLflow model under this name"
    )
    p.add_argument(
        "--storage", help="with --sweep: the sweep's --storage (default runs), which decides "
        "the default --out and holds the trials' workers for --refit",
    )  # fmt: skip
    p.add_argument(
        "--max-emb-mb",
        type=positive,
        help="with --sweep: the best trial whose tables fit this budget",
    )
    p.add_argument(
        "--tracking-uri", help="MLflow URI (default: sqlite:///<cwd>/mlflow.db, which must exist)"
    )
    refit = p.add_argument_group(
        "refit (with --sweep)",
        "train the best trial's configuration again on the training and validation rows "
        "together, for the epochs at which its own run peaked, and export that model: its own "
        "MLflow run in the sweep, its test split its only held-out score (docs/results.md); "
        "its workers as the sweep's trials ran (its sweep.json under --storage) unless given",
    )
    refit.add_argument("--refit", action="store_true", help="refit the best trial, then export it")
    add_address(refit)
    add_options(refit, WorkerOptions, undefaulted=True)
    args = p.parse_args(argv)
    if error := misplaced(args):
        p.error(error)
    args.storage = args.storage or "runs"
    return args


REFIT_ONLY = ("address", "num_workers", "cpus_per_worker", "use_gpu", "wait_for_nodes")
WORKER = options(WorkerOptions)


def misplaced(args: argparse.Namespace) -> str | None:
    """An option the chosen source would ignore, named with the source it needs; None if all
    typed options are used."""
    if args.checkpoint is None and (args.experiment or args.config):
        flag = "--experiment" if args.experiment else "--config"
        return f"{flag} names a checkpoint's config: it needs --checkpoint"
    if args.checkpoint and args.experiment and args.config:
        return "--experiment and --config exclude each other: one config for the checkpoint"
    if args.checkpoint and args.register:
        return "--register registers a sweep's or a registered model's export (a trial's run): " \
            "not with --checkpoint"  # fmt: skip
    for flag, value in (("--storage", args.storage), ("--max-emb-mb", args.max_emb_mb)):
        if value is not None and not args.sweep:
            return f"{flag} chooses among a sweep's trials: it needs --sweep NAME"
    if args.refit and not args.sweep:
        return "--refit refits a sweep's best trial: it needs --sweep NAME"
    typed = [k for k in REFIT_ONLY if getattr(args, k, None) not in (None, False)]
    if typed and not args.refit:
        flag = "--address" if typed[0] == "address" else flag_of(typed[0], WORKER[typed[0]][0])
        return f"{flag} says where the refit runs: it needs --refit"
    return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from recsys.runtime.storage import is_uri
    from recsys.serving.export import export
    from recsys.serving.mlflow_model import quiet_libraries
    from recsys.tune.publish import export_best
    from recsys.tune.state import export_dir, reading_uri

    quiet_libraries()

    try:
        if args.refit:
            out = args.out or export_dir(args.storage, args.sweep)
            run_id, report, model_uri = refit(args, out)
            print(f"refit run {run_id}; MLflow model {model_uri}")
        elif args.sweep:
            out = args.out or export_dir(args.storage, args.sweep)
            uri = reading_uri(args.tracking_uri, os.getcwd())
            run_id, report, model_uri = export_best(
                uri, args.sweep, out, args.dtype, args.register, args.max_emb_mb
            )
            print(f"best trial run {run_id}; MLflow model {model_uri}")
        elif args.model:
            from recsys.serving.mlflow_model import export_registered

            tail = args.model.removeprefix("models:/").replace("@", "-").replace("/", "-")
            out = args.out or os.path.abspath(os.path.join("exports", tail))
            uri = reading_uri(args.tracking_uri, os.getcwd())
            run_id, report, model_uri = export_registered(
                uri, args.model, out, args.dtype, args.register
            )
            print(f"{args.model}: trial run {run_id}; MLflow model {model_uri}")
        else:
            from recsys.data.dataset import resolve

            config = from_file(args.config) if args.config else named(args.experiment or "debug")
            cfg = resolve(config)
            out = args.out or os.path.join(args.checkpoint, "export")
            if is_uri(args.checkpoint) and not args.out:  # written locally, never into the store
                name = os.path.basename(args.checkpoint.rstrip("/"))
                out = os.path.abspath(os.path.join("exports", name))
            report = export(cfg, args.checkpoint, out, args.dtype)
    except (ConfigError, ConnectionError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"exported {report.dtype} model: {report.path}")
    print(f"  on the first {report.rows:,} test rows:")
    print(f"  test AUC {report.exported_auc:.4f} (FP32 {report.fp32_auc:.4f})")
    print(f"  log loss {report.exported_log_loss:.4f} (FP32 {report.fp32_log_loss:.4f})")
    print(f"  largest probability difference {report.max_prob_diff:.2e}")
    tables, fp32 = report.exported_table_bytes / 2**20, report.fp32_table_bytes / 2**20
    print(f"  tables {tables:.2f} MB (FP32 {fp32:.2f} MB)")


def refit(args: argparse.Namespace, out: str) -> tuple[str, Any, str]:
    """``--refit``: on the Ray ``--address`` finds, with the workers asked for."""
    from recsys.runtime.cluster import connect, wait_for_fit
    from recsys.runtime.storage import check_storage, resolved
    from recsys.train.ray_trainer import Resources
    from recsys.tune.refit import checked_refit, refit_best, saved_workers
    from recsys.tune.state import reading_uri

    uri = reading_uri(args.tracking_uri, os.getcwd())
    storage = resolved(args.storage)
    check_storage(storage)
    default = WorkerOptions()
    saved = saved_workers(storage, args.sweep) or Resources(
        default.num_workers, default.use_gpu, default.cpus_per_worker
    )
    resources = Resources(
        args.num_workers or saved.num_workers,
        saved.use_gpu if args.use_gpu is None else args.use_gpu,
        args.cpus_per_worker or saved.cpus_per_worker,
    )
    address = ray_address(args.address)
    planned = checked_refit(uri, args.sweep, resources, args.max_emb_mb)  # before Ray starts
    connect(address)
    gpus = 1.0 if resources.use_gpu else 0.0
    wait = args.wait_for_nodes or 0.0
    wait_for_fit(resources.num_workers, resources.cpus_per_worker, gpus, 0.0, wait)
    return refit_best(
        uri, args.sweep, storage, resources, out, args.dtype, args.register,
        args.max_emb_mb, refit=planned,
    )  # fmt: skip


if __name__ == "__main__":
    main()
