"""``python -m recsys.cli.planted``: write the planted log (``recsys.demo.planted``) and its
schema."""

from __future__ import annotations

import argparse
import sys

from recsys.demo import planted


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m recsys.cli.planted", description=planted.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="output folder (log.parquet, schema.yaml)")
    p.add_argument("--rows", type=int, default=75_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tasks", type=int, choices=[1, 2], default=1,
        help="2: a like beside the click, sharing some terms, conflicting on one",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        path = planted.write(args.out, args.rows, args.seed, planted.Shape(tasks=args.tasks))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(
        f"wrote {args.rows:,} rows to {path} (schema: {planted.SCHEMA_FILE} beside it)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
