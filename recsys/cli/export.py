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

from recsys.cli import add_address, count, positive, ray_address
from recsys.config_registry import EXPERIMENTS, from_file, named
from recsys.configlib import ConfigError


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
        "--model", metavar="models:/NAME@ALIAS",
        help="a registered model (models:/NAME@ALIAS or models:/NAME/VERSION): export its trial "
        "again from its best checkpoint, e.g. in another --dtype",
    )  # fmt: skip
    p.add_argument("--experiment", default="debug", help=f"one of {sorted(EXPERIMENTS)}")
    p.add_argument("--config", help="YAML config of the checkpoint's run")
    p.add_argument("--dtype", choices=["int8", "int4", "fp16"], default="int8")
    p.add_argument(
        "--out", help="output folder (default: with --sweep <storage>/<sweep>/export, as "
        "recsys-sweep --export writes, exports/<sweep> for an object store; with --model "
        "exports/<name>-<alias or version>; with --checkpoint <checkpoint>/export, for a URI "
        "exports/<its folder name>)",
    )  # fmt: skip
    p.add_argument("--register", help="register the MLflow model under this name")
    p.add_argument(
        "--storage", default="runs",
        help="with --sweep: the sweep's --storage, which decides the default --out",
    )  # fmt: skip
    p.add_argument(
        "--max-emb-mb",
        type=positive,
        help="with --sweep: the best trial whose tables fit this budget",
    )
    p.add_argument("--tracking-uri", help="MLflow URI (default: sqlite:///<cwd>/mlflow.db)")
    refit = p.add_argument_group(
        "refit (with --sweep)",
        "train the best trial's configuration again on the training and validation rows "
        "together, for the epochs at which its own run peaked, and export that model: its own "
        "MLflow run in the sweep, its test split its only held-out score (docs/results.md)",
    )
    refit.add_argument("--refit", action="store_true", help="refit the best trial, then export it")
    add_address(refit)
    refit.add_argument(
        "--num-workers", type=count,
        help="the refit's workers (default: those of the sweep's trials, from its sweep.json "
        "under --storage; else 2)",
    )  # fmt: skip
    refit.add_argument("--cpus-per-worker", type=positive, help="(default: the trials')")
    refit.add_argument(
        "--gpus", action="store_true", default=None,
        help="one GPU per worker, NCCL (default: as the trials ran)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.refit and not args.sweep:
        p.error("--refit refits a sweep's best trial: it needs --sweep NAME")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from recsys.runtime.storage import is_uri
    from recsys.serving.export import export
    from recsys.tune.publish import export_best, quiet_libraries
    from recsys.tune.state import default_tracking_uri, export_dir

    quiet_libraries()

    try:
        if args.refit:
            out = args.out or export_dir(args.storage, args.sweep)
            run_id, report, model_uri = refit(args, out)
            print(f"refit run {run_id}; MLflow model {model_uri}")
        elif args.sweep:
            out = args.out or export_dir(args.storage, args.sweep)
            uri = args.tracking_uri or default_tracking_uri(os.getcwd())
            run_id, report, model_uri = export_best(
                uri, args.sweep, out, args.dtype, args.register, args.max_emb_mb
            )
            print(f"best trial run {run_id}; MLflow model {model_uri}")
        elif args.model:
            from recsys.tune.publish import export_registered

            tail = args.model.removeprefix("models:/").replace("@", "-").replace("/", "-")
            out = args.out or os.path.abspath(os.path.join("exports", tail))
            uri = args.tracking_uri or default_tracking_uri(os.getcwd())
            run_id, report, model_uri = export_registered(
                uri, args.model, out, args.dtype, args.register
            )
            print(f"{args.model}: trial run {run_id}; MLflow model {model_uri}")
        else:
            from recsys.data.dataset import resolve

            cfg = resolve(from_file(args.config) if args.config else named(args.experiment))
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
    from recsys.runtime.cluster import connect, start_train_coordinator, wait_for_fit
    from recsys.runtime.storage import check_storage, resolved
    from recsys.train.ray_trainer import Resources
    from recsys.tune.refit import checked_refit, refit_best, saved_workers
    from recsys.tune.state import default_tracking_uri

    storage = resolved(args.storage)
    check_storage(storage)
    saved = saved_workers(storage, args.sweep) or Resources(2, False, 1.0)
    resources = Resources(
        args.num_workers or saved.num_workers,
        saved.use_gpu if args.gpus is None else args.gpus,
        args.cpus_per_worker or saved.cpus_per_worker,
    )
    address = ray_address(args.address)
    uri = args.tracking_uri or default_tracking_uri(os.getcwd())
    planned = checked_refit(uri, args.sweep, resources, args.max_emb_mb)  # before Ray starts
    connect(address)
    start_train_coordinator()
    gpus = 1.0 if resources.use_gpu else 0.0
    wait_for_fit(resources.num_workers, resources.cpus_per_worker, gpus, 0.0, 0.0)
    return refit_best(
        uri, args.sweep, storage, resources, out, args.dtype, args.register,
        args.max_emb_mb, refit=planned,
    )  # fmt: skip


if __name__ == "__main__":
    main()
