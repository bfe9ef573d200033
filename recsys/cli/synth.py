"""``recsys-synth``: write the demo click log (``recsys.demo.clicklogs``) as Parquet."""

from __future__ import annotations

import argparse
import sys

from recsys.demo import clicklogs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="recsys-synth", description=clicklogs.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="output folder (Parquet files)")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        paths = clicklogs.write(args.out, args.rows, args.files, args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {args.rows:,} rows to {len(paths)} files in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
