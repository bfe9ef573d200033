"""``recsys-synth``: write the demo click log (``recsys.demo.clicklogs``) as Parquet, or, with
``--drift``, a log over periods whose tastes drift (``recsys.demo.drift``): one folder a period
and the schema to prepare them with, to try the loop of each new period (docs/results.md)."""

from __future__ import annotations

import argparse
import os
import sys

from recsys.demo import clicklogs

# each kind of log's own flags and their defaults (untyped flags are None: the other kind's,
# typed, are refused, as recsys-export refuses an option its source would ignore)
CLICKS = {"rows": 200_000, "files": 4}
DRIFT = {"periods": 3, "rows_per_period": 20_000}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="recsys-synth", description=clicklogs.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="output folder (Parquet files)")
    p.add_argument("--rows", type=int, help=f"rows of the click log (default {CLICKS['rows']})")
    p.add_argument("--files", type=int, help="Parquet files, in time order, of as many rows each "
                   f"as can be (default {CLICKS['files']})")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same rows")
    p.add_argument(
        "--drift", action="store_true",
        help="the drifting log instead (recsys.demo.drift): --periods folders OUT/period-<k>/ "
        "of --rows-per-period rows each, and OUT/schema.yaml to prepare them with",
    )  # fmt: skip
    p.add_argument("--periods", type=int, help=f"--drift: its periods (default {DRIFT['periods']})")
    p.add_argument("--rows-per-period", type=int, help="--drift: the rows of each period "
                   f"(default {DRIFT['rows_per_period']})")  # fmt: skip
    args = p.parse_args(argv)
    mine, other = (DRIFT, CLICKS) if args.drift else (CLICKS, DRIFT)
    if typed := [k for k in other if getattr(args, k) is not None]:
        flag, where = f"--{typed[0].replace('_', '-')}", "with" if args.drift else "without"
        p.error(f"{flag} is not read {where} --drift"
                f"{' (--rows-per-period sets its rows)' if args.drift else ''}")  # fmt: skip
    for k, default in mine.items():
        setattr(args, k, default if getattr(args, k) is None else getattr(args, k))
    try:
        if args.drift:
            write_drift(args.out, args.periods, args.rows_per_period, args.seed)
            return
        paths = clicklogs.write(args.out, args.rows, args.files, args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {args.rows:,} rows to {len(paths)} files in {args.out}", file=sys.stderr)


def write_drift(out: str, periods: int, rows: int, seed: int) -> list[str]:
    """The drift log's ``periods`` periods of ``rows`` rows, drawn as one world, each in a folder
    ``out/period-<k>`` (k from 1), and ``out/schema.yaml``; the period folders."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import yaml

    from recsys.demo import drift

    if periods < 1 or rows < 1:
        raise ValueError(f"--periods {periods} and --rows-per-period {rows} must be >= 1")
    table = drift.table(seed, drift.Shape(rows_per_period=rows), range(periods))
    folders = []
    for k in range(periods):
        folder = os.path.join(out, f"period-{k + 1}")
        os.makedirs(folder, exist_ok=True)
        part = table.filter(pc.equal(table.column("period"), k)).drop_columns(["p_click"])
        pq.write_table(part, os.path.join(folder, "log.parquet"))
        folders.append(folder)
    with open(os.path.join(out, "schema.yaml"), "w") as f:
        yaml.safe_dump(drift.schema_dict(), f, sort_keys=False)
    print(f"wrote {periods} periods of {rows:,} rows to {out}/period-1 ... period-{periods}, "
          f"and {out}/schema.yaml", file=sys.stderr)  # fmt: skip
    return folders


if __name__ == "__main__":
    main()
