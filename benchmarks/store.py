"""MLflow store growth: rows and bytes per trial-step of a sweep's tracking store.

Runs the default space's smoke sweep (1 trial and an lr baseline, SQLite store) and reads the
store back: metric rows per trained run, per report and per training step, and the store's bytes
per trial-step. The cadence
that sets these is ``train.log_every`` (one loss row every that many steps) and
``train.checkpoint_every`` (one report, ~30 metric rows, every that many steps; in a sweep every
report also evaluates)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "mlflow.db")
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
               "--name", "store", "--storage", os.path.join(tmp, "runs"),
               "--tracking-uri", f"sqlite:///{db}", "--num-workers", "1",
               "--cpus-per-worker", "1.5"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, cwd=tmp)
        con = sqlite3.connect(db)
        trials = con.execute(
            "select run_uuid from tags where key = 'recsys.kind' "
            "and value in ('trial', 'baseline', 'confirm')"
        ).fetchall()
        ids = [t[0] for t in trials]
        marks = ",".join("?" * len(ids))

        def count(where: str) -> int:
            sql = f"select count(*) from metrics where {where} run_uuid in ({marks})"
            return int(con.execute(sql, ids).fetchone()[0])

        n_rows, loss, reports = count(""), count("key = 'loss' and"), count("key = 'step' and")
        steps = con.execute(
            f"select sum(m) from (select max(step) m from metrics where run_uuid in ({marks}) "
            "group by run_uuid)",
            ids,
        ).fetchone()[0]
        con.close()
        size = os.path.getsize(db)
    return "\n".join([
        "| trained runs | trial-steps | reports | metric rows | of which loss | rows / report "
        "| rows / trial-step | store bytes / trial-step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {len(ids)} | {steps} | {reports} | {n_rows} | {loss} | "
        f"{(n_rows - loss) / max(reports, 1):.1f} | {n_rows / max(steps, 1):.2f} | "
        f"{size / max(steps, 1):.0f} (whole SQLite file) |",
    ])  # fmt: skip
