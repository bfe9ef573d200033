"""The time walk: a log whose tastes drift over periods (``recsys.demo.drift``: new items appear,
old ones fade), and three policies for the model served after the first period's sweep.

- **frozen**: the first period's champion, never trained again;
- **retrained**: each period ``recsys-retrain --refit`` trains the current champion further on
  the new period (prepared ``--like`` the one before, vocabularies grown), warm-started,
  ``--seeds`` times, beside the same configuration from scratch, picks one of the two by the
  validation rows, refits the pick's seed nearest its mean on training + validation, registers
  that refit, and moves ``@champion`` to it only on a real win;
- **new sweep**: each period a full ``recsys-sweep`` of the first one's size over the new period
  prepared on its own (its own vocabularies), its best refitted on training + validation.

Everything runs through the commands a team would run (``recsys-preprocess``, ``recsys-sweep``,
``recsys-export``, ``recsys-retrain``) on a local Ray of this machine. Per period: each policy's
test AUC and GAUC on that period's test rows (the same rows for all: each folder splits the
period by time alike), and its compute: the seconds of its trainings, as each reports its own
cost (``wall_s``: its workers' setup, steps, evaluation and checkpoints, not its process's
start), and apart from that each MLflow run's start to its last report (a sweep's trainings:
every trial, reference and the refit; a retrain's: every seed of both roles, the pick needs
them, and its refit), both ``--concurrent`` at a time. Goals (``benchmarks.goals``): the
retrain's refit within 0.005 test AUC of a new sweep's in every period at no more than a tenth of
its compute (``retrain_keeps_up``), and the pick better than the frozen champion from the third
period on, its seeds' 95% interval above it (``retrain_beats_frozen``).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import table
from benchmarks.goals import Interval, retrain_beats_frozen, retrain_keeps_up

NAME = "walk"  # the registered model
PYTHON = sys.executable


def cli(*args: str, cwd: str) -> str:
    """A ``recsys-*`` command (``python -m recsys.cli.<name>``); its standard output; a failure
    raised with its console's tail."""
    done = subprocess.run([PYTHON, "-m", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=7200)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def write_periods(tmp: str, periods: int, rows: int, seed: int) -> list[str]:
    """The drift log's periods, drawn as one world, each written to a folder of its own."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from recsys.demo import drift

    t = drift.table(seed, drift.Shape(rows_per_period=rows), range(periods))
    out = []
    for p in range(periods):
        folder = os.path.join(tmp, f"raw{p + 1}")
        os.makedirs(folder)
        pq.write_table(
            t.filter(pc.equal(t.column("period"), p)), os.path.join(folder, "log.parquet")
        )
        out.append(folder)
    return out


def space(tmp: str, samples: int) -> str:
    """The drift benchmark's space (the shipped own-data space for one task, the history's
    pooling a choice), with ``samples`` trials and its LR reference."""
    import yaml

    from benchmarks.drift import drift_space

    path = drift_space(os.path.join(tmp, "walk_space.yaml"))
    with open(path) as f:
        raw = yaml.safe_load(f)
    raw.update(num_samples=samples, baselines=["lr"], confirm=None)
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


@dataclass(frozen=True)
class Spent:
    """Trainings' seconds: ``own``, their reports' own cost (the last ``wall_s``: the workers'
    setup, steps, evaluation and checkpoints over all attempts, counted alike wherever a
    training runs); ``span``, their MLflow runs' start to their last report, which also holds
    whatever started after the run opened (a retrain's Ray task process, not a sweep trial's)."""

    own: float = 0.0
    span: float = 0.0
    unreported: int = 0  # trainings with no wall_s (refused, or NaN before their first report)

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.own + other.own, self.span + other.span,
                     self.unreported + other.unreported)  # fmt: skip


@dataclass
class Sweep:
    """A sweep's refitted best on its period's test rows, and the seconds of its trainings."""

    auc: float
    gauc: float
    seconds: Spent


def sweep(period: int, raw: str, tmp: str, space_path: str, workers: int, concurrent: int,
          register: bool = False) -> Sweep:  # fmt: skip
    """Prepare ``raw`` on its own, sweep it, refit its best (``register``: as the model
    ``walk``, version 1 given ``@champion``)."""
    from recsys.data.schema import DatasetSchema
    from recsys.demo import drift
    from recsys.prepare.pipeline import prepare

    where = os.path.join(tmp, f"sweep{period}")
    os.makedirs(where)
    folder = os.path.join(where, "data")
    prepare(DatasetSchema.from_dict(drift.schema_dict()), [raw], folder, workers=0,
            log=lambda s: None)  # fmt: skip
    uri, storage, name = f"sqlite:///{where}/mlflow.db", os.path.join(where, "runs"), f"p{period}"
    common = ["--storage", storage, "--tracking-uri", uri]
    cli("recsys.cli.sweep", "--space", space_path, "--data", folder, "--name", name, *common,
        "--num-workers", str(workers), "--max-concurrent", str(concurrent), "--cpus-per-worker",
        "0.9", "--export", "int8", "--refit", "--address", "local", cwd=where)  # fmt: skip
    if register:
        cli("recsys.cli.export", "--sweep", name, "--refit", "--register", NAME, *common,
            "--address", "local", cwd=where)  # fmt: skip
    return swept(uri, name)


def swept(uri: str, name: str) -> Sweep:
    """The refit's test AUC and GAUC, and every training's seconds, of sweep ``name``."""
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker

    tracker = Tracker(uri)
    runs = tracker.runs(name, f"tags.`{Tag.SWEEP}` = '{name}'")
    trainings = [r for r in runs if not r.data.tags.get(Tag.KIND, "").startswith("sweep:")]
    refit = next(r for r in trainings if r.data.tags.get(Tag.KIND) == "refit")
    m = refit.data.metrics
    spent = sum((seconds(tracker.client, r) for r in trainings), Spent())
    return Sweep(m.get("test_auc", math.nan), m.get("test_gauc", math.nan), spent)


def seconds(client: Any, run: Any) -> Spent:
    """A training's seconds (``Spent``). The span ends at its last report (its ``step``'s last
    logged time; else the run's end): a sweep's refit and a retrain's registered seed log their
    export into their run after training, which the run's end would count."""
    steps = client.get_metric_history(run.info.run_id, "step")
    end = max((m.timestamp for m in steps), default=run.info.end_time or run.info.start_time)
    own = run.data.metrics.get("wall_s")
    return Spent(float(own or 0.0), (end - run.info.start_time) / 1000.0, int(own is None))


def champion(uri: str) -> None:
    """``@champion`` on the version the first sweep's export registered (the sweep runs no seed
    check: the benchmark serves its refitted best)."""
    from recsys.tracking.tracker import Tracker

    client = Tracker(uri).client
    version = max(client.search_model_versions(f"name = '{NAME}'"), key=lambda v: int(v.version))
    client.set_registered_model_alias(NAME, "champion", version.version)


@dataclass
class Retrain:
    """One period's retrain: each seed's test AUC and GAUC (retrained, from scratch), the
    role it picked, its refit's test AUC and GAUC, the decision, and the seconds of its
    trainings (retrained, from scratch, the refit)."""

    retrained: list[float] = field(default_factory=list)
    retrained_gauc: list[float] = field(default_factory=list)
    scratch: list[float] = field(default_factory=list)
    scratch_gauc: list[float] = field(default_factory=list)
    seconds: Spent = Spent()
    scratch_seconds: Spent = Spent()
    refit: float = math.nan
    refit_gauc: float = math.nan
    refit_seconds: Spent = Spent()
    picked: str = "retrained"
    decision: str = ""
    frozen: float = math.nan
    frozen_gauc: float = math.nan


def retrain(folder: str, uri: str, storage: str, seeds: int, workers: int, concurrent: int,
            cwd: str) -> Retrain:  # fmt: skip
    """``recsys-retrain --refit`` of ``@champion`` on ``folder`` (``concurrent`` trainings at a
    time, as a sweep's trials), read back from MLflow."""
    from recsys.tracking.tags import Tag
    from recsys.tracking.tracker import Tracker

    console = cli("recsys.cli.retrain", "--model", f"models:/{NAME}@champion", "--data", folder,
                  "--seeds", str(seeds), "--tracking-uri", uri, "--storage", storage,
                  "--num-workers", str(workers), "--max-concurrent", str(concurrent),
                  "--refit", "--address", "local", cwd=cwd)  # fmt: skip
    tracker = Tracker(uri)
    exp = f"retrain-{NAME}"
    parent = tracker.runs(exp, f"tags.`{Tag.DATA}` = '{os.path.abspath(folder)}'")[0]
    runs = tracker.runs(exp, f"tags.`{Tag.PARENT}` = '{parent.info.run_id}'")
    said = [ln for ln in console.splitlines()
            if ln.startswith(("kept @", "retrained test_", "from scratch test_"))]  # fmt: skip
    out = Retrain(decision=said[-1] if said else "(no decision printed)")
    version = tracker.client.get_model_version(NAME, parent.data.tags[Tag.REGISTERED_VERSION])
    out.picked = "scratch" if version.tags.get(Tag.START) == "scratch" else "retrained"
    for r in sorted(runs, key=lambda r: r.data.tags.get(Tag.TRIAL, "")):
        kind, m = r.data.tags.get(Tag.KIND), r.data.metrics
        if kind == "retrained":
            out.retrained.append(m["test_auc"])
            out.retrained_gauc.append(m.get("test_gauc", math.nan))
            out.seconds += seconds(tracker.client, r)
        elif kind == "scratch":
            out.scratch.append(m["test_auc"])
            out.scratch_gauc.append(m.get("test_gauc", math.nan))
            out.scratch_seconds += seconds(tracker.client, r)
        elif kind == "refit":
            out.refit, out.refit_gauc = m["test_auc"], m.get("test_gauc", math.nan)
            out.refit_seconds += seconds(tracker.client, r)
    return out


def offered(rt: Retrain) -> tuple[list[float], list[float]]:
    """The test AUC and GAUC of each seed of the role the retrain picked."""
    if rt.picked == "scratch":
        return rt.scratch, rt.scratch_gauc
    return rt.retrained, rt.retrained_gauc


def frozen(uri: str, folder: str) -> tuple[float, float]:
    """The first champion (version 1) as it is, on ``folder``'s test rows: AUC and GAUC."""
    from recsys.lifecycle.frozen import score_frozen
    from recsys.lifecycle.plan import plan_retrain
    from recsys.tracking.tracker import Tracker

    plan = plan_retrain(Tracker(uri), f"models:/{NAME}/1", folder, epochs=1.0, seeds=2)
    scores = score_frozen(plan.frozen, plan.checkpoint, plan.cfg)
    return scores["test_auc"], scores.get("test_gauc", math.nan)


def like(raw: str, out: str, earlier: str) -> str:
    """``raw`` prepared like ``earlier``, its vocabularies grown."""
    cli("recsys.cli.preprocess", raw, "--like", earlier, "--grow-vocab", "--out", out,
        "--workers", "0", cwd=os.path.dirname(out))  # fmt: skip
    return out


def mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else math.nan


def run(periods: int, rows: int, samples: int, seeds: int, workers: int, concurrent: int,
        seed: int, tmp: str) -> str:  # fmt: skip
    """The walk's Markdown: per period the three policies' test AUC and GAUC, the retrain's
    decision, each policy's seconds; the goals."""
    t0 = time.perf_counter()
    raws = write_periods(tmp, periods, rows, seed)
    space_path = space(tmp, samples)
    first = sweep(1, raws[0], tmp, space_path, workers, concurrent, register=True)
    uri = f"sqlite:///{tmp}/sweep1/mlflow.db"
    champion(uri)
    storage, earlier = os.path.join(tmp, "retrain_runs"), os.path.join(tmp, "sweep1", "data")
    rows_out, walk = [], []
    for p in range(2, periods + 1):
        folder = like(raws[p - 1], os.path.join(tmp, f"like{p}"), earlier)
        earlier = folder
        fz, fz_g = frozen(uri, folder)
        rt = retrain(folder, uri, storage, seeds, workers, concurrent, tmp)
        new = sweep(p, raws[p - 1], tmp, space_path, workers, concurrent)
        walk.append((p, fz, rt, new))
        rows_out.append([p, f"{fz:.4f} / {fz_g:.4f}",
                         f"{mean(rt.retrained):.4f} / {mean(rt.retrained_gauc):.4f}",
                         f"{mean(rt.scratch):.4f} / {mean(rt.scratch_gauc):.4f}",
                         "warm" if rt.picked == "retrained" else "scratch",
                         f"{rt.refit:.4f} / {rt.refit_gauc:.4f}",
                         f"{new.auc:.4f} / {new.gauc:.4f}", rt.decision,
                         f"{rt.seconds.own:.0f} + {rt.scratch_seconds.own:.0f} + "
                         f"{rt.refit_seconds.own:.0f}",
                         f"{new.seconds.own:.0f}"])  # fmt: skip
        print(f"timewalk: period {p} done ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
    gaps = [rt.refit - new.auc for _, _, rt, new in walk]
    spent = sum((rt.seconds + rt.scratch_seconds + rt.refit_seconds for _, _, rt, _ in walk),
                Spent())  # fmt: skip
    swept_s = sum((new.seconds for *_, new in walk), Spent())
    cost, span_cost = spent.own / swept_s.own, spent.span / swept_s.span
    above = {p: (Interval.of(offered(rt)[0]), fz) for p, fz, rt, _ in walk if p >= 3}
    head = (f"**time walk** (`recsys.demo.drift`, {periods} periods of {rows:,} rows, seed "
            f"{seed}): period 1 swept ({samples} trials, the LR reference, refitted: test AUC "
            f"{first.auc:.4f}, GAUC {first.gauc:.4f}, {first.seconds.own:.0f} s of trainings); "
            f"retrains of {seeds} seeds warm-started and {seeds} from scratch and the pick's "
            f"refit, {workers} worker(s) each; the retrains' compute "
            f"{cost:.3f}x the new sweeps' in the trainings' own seconds, {span_cost:.3f}x in "
            f"their runs' spans ({spent.span:.0f} s against {swept_s.span:.0f} s; trainings "
            f"without a wall_s: {spent.unreported} and {swept_s.unreported}); "
            f"{(time.perf_counter() - t0) / 60:.0f} min in all.\n\n")  # fmt: skip
    models = table(["period", "frozen AUC / GAUC", "warm start AUC / GAUC (seed mean)",
                    "from scratch AUC / GAUC", "picked", "the pick's refit AUC / GAUC",
                    "new sweep AUC / GAUC", "the retrain's decision",
                    "retrain s (warm + scratch + refit)", "new sweep s"],
                   rows_out)  # fmt: skip
    goals = table(["goal", "figure", "verdict"], [
        ["the retrain's refit within 0.005 test AUC of a new sweep's every period (ahead counts "
         "as within), at <= 0.1x its compute",
         "gaps " + ", ".join(f"{g:+.4f}" for g in gaps) + f"; compute {cost:.3f}x",
         retrain_keeps_up(gaps, cost)],
        ["the retrain's pick better than the frozen champion from period 3 on (95% CI above it)",
         "; ".join(f"p{p}: {i.mean:.4f} [{i.low:.4f}, {i.high:.4f}] vs {f:.4f}"
                   for p, (i, f) in above.items()),
         retrain_beats_frozen(above)],
    ])  # fmt: skip
    return head + models + "\n\n" + goals


def main(args: Any) -> str:
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("RECSYS_BENCH_DIR")) as tmp:
        return run(args.periods, args.rows, args.samples, args.seeds, args.workers,
                   args.concurrent, args.seed, tmp)  # fmt: skip
