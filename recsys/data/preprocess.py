"""Turn raw Criteo TSV files into the binary form once, so trials never re-parse text.

    python -m recsys.data.preprocess day_0.gz day_1.gz ... --out data/criteo_npy
    python -m recsys.data.preprocess dac_sample.txt --out data/dac_npy --on-bad-row skip

Input files are taken in the given (time) order as days 0, 1, ...; the output folder holds
``day_{k}_{dense,sparse,labels}.npy`` and ``meta.json``. Then train with
``data.source=criteo_binary`` and ``data.paths=[<out>]``.
"""

from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm

from recsys.data.binary import convert_file, count_lines, write_meta
from recsys.data.columns import DataError
from recsys.data.criteo import ReadStats


def preprocess(inputs: list[str], out_dir: str, on_bad_row: str, progress: bool = True) -> None:
    """Convert every input file; all inputs are checked to exist before any work starts."""
    missing = [p for p in inputs if not os.path.isfile(p)]
    if missing:
        raise DataError(f"{missing[0]}: no such file")
    os.makedirs(out_dir, exist_ok=True)
    stats: list[ReadStats] = []
    for k, path in enumerate(inputs):
        total = count_lines(path)  # sizes the output arrays and the progress bar
        with tqdm(
            total=total, desc=os.path.basename(path), unit="rows", disable=not progress
        ) as bar:
            stats.append(convert_file(path, out_dir, k, on_bad_row, bar.update, total))
        st = stats[-1]
        if st.skipped:
            print(
                f"{path}: skipped {st.skipped} malformed rows, e.g. {st.examples[0]}",
                file=sys.stderr,
            )
    write_meta(out_dir, inputs, stats)
    print(f"wrote {sum(s.rows for s in stats)} rows to {out_dir}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("inputs", nargs="+", help="Criteo TSV files (plain or gzip), in time order")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--on-bad-row", choices=["error", "skip"], default="error")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        preprocess(args.inputs, args.out, args.on_bad_row, progress=not args.no_progress)
    except DataError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
