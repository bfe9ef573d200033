"""``recsys-preprocess``: prepare click logs for training (``recsys.prepare.pipeline``).

    recsys-preprocess --schema schemas/clicklogs.yaml data/clicklogs_raw --out data/clicklogs
    recsys-preprocess --schema criteo_kaggle train.txt --out data/criteo_kaggle
    recsys-preprocess --schema criteo_terabyte day_{0..23}.gz --out /shared/criteo_1tb \\
        --address auto
    recsys-preprocess --like data/week1 logs/week2/ --out data/week2   # a later period

``--schema`` is a schema file (every key: ``recsys/data/schema.py`` and its columns'
``schema_columns.py``) or the name of a shipped one (``schemas/``: ``criteo_kaggle``,
``criteo_terabyte``, ``clicklogs``). Then train with
``--data OUT`` (a sweep) or ``data.source=prepared data.paths=[OUT]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from recsys.cli import add_address
from recsys.configlib import ConfigError
from recsys.data.errors import DataError
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import CHUNK_MB, prepare
from recsys.runtime.cluster import RaySource, check_answers, find_ray


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="recsys-preprocess", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("inputs", nargs="+", help="Parquet or text files (plain or gzip), or folders")
    p.add_argument(
        "--schema", help="a schema file, or a shipped schema's name (with --like: the earlier "
        "folder's by default; another may change only format, csv, split and on_bad_row)",
    )  # fmt: skip
    p.add_argument(
        "--like", metavar="PREPARED",
        help="prepare a later period with this prepared folder's schema, vocabularies, "
        "statistics and transforms: known ids keep their rows, unseen ones go to the unseen "
        "rows (counted in meta.json); a model trained on PREPARED reads the output unchanged "
        "(with --grow-vocab, with tables as large as the output's)",
    )  # fmt: skip
    p.add_argument(
        "--grow-vocab", action="store_true",
        help="with --like: ids seen min_count times in the new training rows that a vocabulary "
        "lacks take new rows at the end of its table, up to max_size (a warm start initialises "
        "them)",
    )  # fmt: skip
    p.add_argument(
        "--out",
        required=True,
        help="output folder (shared storage on a cluster), or an object store URI (s3://...)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--on-bad-row", choices=["error", "skip"],
        help="replace the schema's on_bad_row: stop at the first bad value, or skip and count",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1,
        help="processes of the local Ray (default: every core); 0: no Ray, this process only",
    )  # fmt: skip
    add_address(p)
    p.add_argument("--object-store-mb", type=int, help="cap of the local Ray's object store")
    p.add_argument(
        "--chunk-mb", type=float, default=CHUNK_MB,
        help="a task's share of a file: row groups or a byte range of about this size",
    )  # fmt: skip
    p.add_argument(
        "--no-progress", action="store_true",
        help="no progress bars (there are none when the output is not a terminal)",
    )  # fmt: skip
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> str | None:
    """Flags that cannot apply are refused, naming the flag. Returns the address of the Ray
    cluster the tasks run on (``recsys.runtime.cluster.find_ray``), None for a local Ray or none."""
    if not args.schema and not args.like:
        raise DataError("name the data's schema (--schema) or an earlier folder (--like)")
    if args.grow_vocab and not args.like:
        raise DataError("--grow-vocab grows the vocabularies of --like PREPARED: it needs --like")
    if args.workers < 0:
        raise DataError(f"--workers={args.workers}: must be >= 0 (0: no Ray)")
    source = find_ray(args.address) if args.workers else RaySource(None)
    cluster = not source.local
    if cluster and args.workers != (os.cpu_count() or 1):
        raise DataError(
            f"--workers sizes a local Ray; the cluster at {source.address} ({source.origin}) "
            "has its own (--address local prepares on a local Ray)"
        )
    if args.object_store_mb is not None and (cluster or args.workers == 0):
        raise DataError("--object-store-mb caps a local Ray's object store; none is started here")
    if not args.chunk_mb > 0:
        raise DataError(f"--chunk-mb={args.chunk_mb}: must be > 0")
    if not cluster:
        return None
    check_answers(source)
    return source.address


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        address = check_args(args)
        schema = DatasetSchema.load(args.schema) if args.schema else like_schema(args.like)
        if args.on_bad_row:
            schema.on_bad_row = args.on_bad_row
        meta = prepare(
            schema, args.inputs, args.out, workers=args.workers, address=address,
            object_store_mb=args.object_store_mb, chunk_mb=args.chunk_mb,
            overwrite=args.overwrite, progress=not args.no_progress and sys.stderr.isatty(),
            like=args.like, grow_vocab=args.grow_vocab, log=lambda s: print(s, file=sys.stderr),
        )  # fmt: skip
        for line in unseen_lines(meta):
            print(line, file=sys.stderr)
    except (DataError, ConfigError, ConnectionError) as e:
        raise SystemExit(f"error: {e}") from None
    rows = sum(meta["rows"].values())
    print(f"wrote {rows:,} rows to {args.out} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)


def like_schema(folder: str) -> DatasetSchema:
    """The schema of the prepared folder ``--like`` names (its ``meta.json``)."""
    from recsys.data.prepared.meta import read_meta

    return DatasetSchema.from_dict(read_meta(folder)["schema"], f"{folder}/meta.json")


def unseen_lines(meta: dict) -> list[str]:
    """``--like``: per feature, the share of the new period's ids its vocabulary lacked, and
    the rows each table grew by."""
    if "like" not in meta:
        return []
    lines = []
    for name in meta["unseen"]["train"]:
        ids = sum(meta["ids"][s][name] for s in meta["ids"])
        total = sum(meta["unseen"][s][name] for s in meta["unseen"])
        grew = meta["like"]["grown"].get(name)
        share = f"{total:,} of {ids:,} ids ({total / max(ids, 1):.1%})"
        if grew:
            lines.append(f"prepare: {name}: its table grew by {grew:,} rows for new ids; "
                         f"{share} still read its unseen rows")  # fmt: skip
        else:
            lines.append(f"prepare: {name}: {share} not in the vocabulary of "
                         f"{meta['like']['folder']}: they read its unseen rows")  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
