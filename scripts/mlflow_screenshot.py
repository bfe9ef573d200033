"""The picture of the MLflow UI in docs/results.md (docs/mlflow_compare.png): a sweep's runs as
the link the sweep prints opens them, in its saved view's charts (the score against the searched
parameters: parallel coordinates, and a scatter against each of two numeric ones), taken by
headless Chromium from an MLflow server over the sweep's store, on 127.0.0.1.

    ./run.sh sweep                                   # the default sweep into ./mlflow.db (~5 min)
    .venv/bin/python scripts/mlflow_screenshot.py    # -> docs/mlflow_compare.png
    .venv/bin/python scripts/mlflow_screenshot.py --table --out /tmp/table.png   # the table

It first refreshes the sweep's saved view and description (``Tracker.show_sweep``), so a store
of an older sweep works too. Needs Chromium: Debian's ``chromium`` (``./run.sh test`` installs it
where it can, with ``fonts-liberation``), or the program named by ``RECSYS_CHROMIUM``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the tests' browser and server helpers (tests/browser.py, servers.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tracking-uri", help="the sweep's store (default: sqlite:///<cwd>/mlflow.db)")
    p.add_argument("--name", default="default", help="the sweep (default: default)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "mlflow_compare.png"))
    p.add_argument("--table", action="store_true", help="the runs table instead of the charts")
    p.add_argument("--width", type=int, default=1600)
    p.add_argument("--height", type=int, default=1250)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from recsys.tracking.tracker import Tag, Tracker
    from recsys.tracking.view import runs_link
    from recsys.tune.state import default_tracking_uri
    from tests.browser import Chromium, close_panels, missing, runs_table
    from tests.servers import MlflowServer

    if why := missing():
        raise SystemExit(f"error: {why}")
    uri = args.tracking_uri or default_tracking_uri(os.getcwd())
    tracker = Tracker(uri)
    try:
        tracker.show_sweep(args.name)
    except ValueError as e:
        raise SystemExit(f"error: {e}; run the sweep first (./run.sh sweep)") from None
    experiment_id = tracker.experiment(args.name)
    view = tracker.client.get_experiment(experiment_id).tags.get(Tag.VIEW + "recsys", "")
    scatters = view.count("SCATTER")
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        if uri.startswith(("http://", "https://")):
            address = uri.rstrip("/")
        else:
            server = MlflowServer(uri, Path(tmp) / "artifacts").start()
            address = server.uri
        try:
            url = runs_link(address, experiment_id, charts=not args.table)
            with Chromium(args.width, args.height) as page:
                page.open(url)
                if args.table:
                    runs_table(page, "attributes.`Run Name`")
                else:  # the parallel coordinates and the scatters drawn
                    drawn = "!!document.querySelector('.parcoords')"
                    if scatters:
                        drawn += " && !!document.querySelector('.scatterlayer .point')"
                    page.wait_for(drawn, what="the sweep's charts")
                close_panels(page)
                time.sleep(3)  # the charts redraw at the width the closed panel left them
                page.screenshot(args.out)
        finally:
            if server is not None:
                server.stop()
    print(f"{args.out}: {url}")


if __name__ == "__main__":
    main()
