"""The README's first command as a new user meets it: the default sweep (``experiments/sweep.py``
with no arguments, as ``./run.sh sweep`` runs it after its setup check) in a folder of its own
(its ``runs/`` and ``mlflow.db``, a local Ray started for it), timed from the command's start to
its exit, on an idle machine. The setup check that ``./run.sh`` makes first is timed apart.

Reported: the wall seconds, when each part of its output first appeared (the references' start
and ends, the seed check's start, then the summary: the search's table, the seed check's
intervals, the verdicts against the references, the MLflow link), and the trainings it ran
(MLflow's runs of the sweep by kind: search trials, reference trainings, seed-check runs; their
seconds). A run that lacks one of those parts of its output is refused as a figure.

Goal (``benchmarks.goals.quickstart``, issue 59): at most 5 minutes of wall time on 2 cores.

    .venv/bin/python -m benchmarks quickstart
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import table
from benchmarks.goals import QUICKSTART_S, quickstart

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# each part of the default sweep's output, by a line that starts it: the phases as they start
# and end (the first of each), then the summary the README shows, printed at the end
PARTS = {
    "the references start": "baselines: ",
    "the LR reference ends": "reference lr: ",
    "the FM reference ends": "reference fm: ",
    "the seed check starts": "seed check: ",
    "the seed check's intervals": "seed check (",
    "the search's table": "best trials (each by its best",
    "the verdicts against the references": "against the baselines (",
    "the MLflow link": "http://127.0.0.1:5000/#/experiments/",
}


def timed_lines(argv: list[str], cwd: str) -> tuple[float, list[tuple[float, str]], int]:
    """``argv`` run in ``cwd``: its wall seconds, each output line with the seconds since the
    start when it came, and its exit code."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local"}  # a Ray of its own
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
    code = proc.wait()
    return time.perf_counter() - start, lines, code


def trainings(tracking_uri: str) -> dict[str, list[float]]:
    """The seconds of the sweep's MLflow runs (start to end), by kind (``Tag.KIND``; its parent
    left out): search trials (``trial``), references (``baseline``), seed-check runs
    (``confirm``)."""
    from mlflow.tracking import MlflowClient

    from recsys.tracking.tags import Tag

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("default")
    if exp is None:
        raise SystemExit(f"the default sweep left no MLflow experiment 'default' in {tracking_uri}")
    out: dict[str, list[float]] = {}
    for run in client.search_runs([exp.experiment_id], max_results=10_000):
        if Tag.PARENT in run.data.tags:
            kind = run.data.tags.get(Tag.KIND, "?")
            seconds = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
            out.setdefault(kind, []).append(seconds)
    return out


def run() -> str:
    setup_s, _, code = timed_lines(["bash", "scripts/setup.sh"], ROOT)
    if code:
        raise SystemExit(f"scripts/setup.sh exited {code}")
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        sweep = os.path.join(ROOT, "experiments", "sweep.py")
        wall, lines, code = timed_lines([sys.executable, sweep], tmp)
        output = "\n".join(text for _, text in lines)
        if code:
            raise SystemExit(f"the default sweep exited {code}:\n{output[-4000:]}")
        seen = {part: next((t for t, text in lines if marker in text), None)
                for part, marker in PARTS.items()}  # fmt: skip
        missing = [part for part, t in seen.items() if t is None]
        if missing:
            raise SystemExit(f"the default sweep's output lacks {', '.join(missing)}:\n{output}")
        runs = trainings(f"sqlite:///{os.path.join(tmp, 'mlflow.db')}")
    rows = [["the setup check (`scripts/setup.sh`, done before)", f"{setup_s:.1f}"]]
    rows += [[f"{part} printed", f"{t:.0f}"] for part, t in seen.items()]
    rows += [["**the default sweep, start to exit**", f"**{wall:.0f}**"]]
    kinds = [[kind, len(t), f"{sum(t) / len(t):.0f}", f"{max(t):.0f}", f"{sum(t):.0f}"]
             for kind, t in sorted(runs.items())]  # fmt: skip
    return "\n".join([
        table(["part", "seconds"], rows),
        "",
        "Its trainings (MLflow runs under the sweep, start to end, by kind):",
        "",
        table(["kind", "runs", "mean s", "max s", "total s"], kinds),
        "",
        f"Goal: at most {QUICKSTART_S:.0f} s: **{quickstart(wall)}**.",
    ])  # fmt: skip
