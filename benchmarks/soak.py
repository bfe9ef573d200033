"""Soak: a sweep of hundreds of tiny trials against a real tracking server, with faults mid-flight.

A PostgreSQL cluster and ``mlflow server`` over it on loopback (``tests/servers.py``, artifacts
served from a local folder). First a 16-trial sweep without faults, the reference. Then the soak:
``--trials`` trials (2 at a time), during which the benchmark

- SIGKILLs the sweep's driver twice at random points (its local Ray goes with it; whatever of its
  session is left is killed 5 s later, as with a lost host) and resumes the sweep with
  ``--resume``;
- stops the tracking server once for 30 s, then starts it again on the same port;
- SIGKILLs the training process of a running trial: its one-worker trials train in their Tune
  trial's process (``recsys.train.inline``), which Tune starts again from its last checkpoint (a
  Ray Train worker, where a trial has one, is restarted by Ray Train likewise).

At the end it checks, from MLflow alone: exactly one run per trial; each run's whole metric
history at unique steps (``loss`` every ``log_every`` steps, the reports every
``checkpoint_every``: no gap, no repeat); a final status for every trial; the parent's
``trials.csv`` equal to Tune's own results (``ExperimentAnalysis`` of the sweep's folder). It
measures the driver's memory over time (VmRSS of the driver process, sampled every second), the
latency of an MLflow write (a probe client's one-metric ``log_batch`` every second, beside the
sweep's own writes; the outage's failed writes counted apart), trials per hour, the overhead per
trial against the 16-trial sweep's, and the PostgreSQL store's rows and bytes.

Overhead per trial = (wall time x 2 slots - the trials' own ``wall_s``) / trials: the slot-seconds
a trial costs beyond its workers' own time (Ray's worker start, Tune, the driver, MLflow). The
wall per 50 finished trials shows whether anything grows with the count. The benchmark follows the
count (when to inject a fault, memory by count) with one SQL count in the store's database every
2 s, not MLflow searches, whose cost grows with the runs and would load the trials' cores.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, CHECKPOINT_EVERY, LOG_EVERY = 20, 10, 5
RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
DATABASE = "soak"  # the PostgreSQL database of the soak's MLflow server
LOGS = Path(tempfile.gettempdir(), "recsys-soak-logs")  # the drivers' consoles, kept after
FINAL = {"finished", "early_stopped", "stopped", "diverged", "infeasible"}
SPACE = f"""
base: debug
overrides:
  embeddings.num_embeddings: [50, 200, 1000, 3000]
  embeddings.dim: 8
  model.bottom_mlp: [8]
  model.top_mlp: [8]
  data.synthetic.num_samples: 4000
  train.steps: {STEPS}
  train.batch_size: 64
  train.checkpoint_every: {CHECKPOINT_EVERY}
  train.log_every: {LOG_EVERY}
space:
  model.interaction: {{choice: [dot, cat]}}
  embeddings.qr.threshold: {{choice: [null, 500]}}
  optim.lr: {{loguniform: [0.02, 0.1]}}
"""


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float | None:
    """A process's resident memory (VmRSS), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# the titles of the processes that train: a Ray Train worker, and a Tune trial's actor while it
# runs its trial (``ImplicitFunc.train``; it trains there when the trial trains inline; an idle
# actor, kept for the next trial, is ``ray::ImplicitFunc``)
TRAINING = (b"ray::RayTrainWorker", b"ray::ImplicitFunc.train")


def train_workers() -> list[int]:
    """Pids of the processes that train (their title starts with one of ``TRAINING``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(TRAINING):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def kill_a_worker(rng: random.Random, timeout: float = 120.0) -> int:
    """SIGKILL one process that trains (waiting for one while trials are between starts)."""
    deadline = time.time() + timeout
    while not (workers := train_workers()):
        if time.time() > deadline:
            raise RuntimeError("no training process ran for 2 minutes")
        time.sleep(0.5)
    time.sleep(3.0)  # into its training, past the worker group's start
    workers = train_workers() or workers
    victim = rng.choice(workers)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)
    return victim


class Probe(threading.Thread):
    """One ``log_batch`` of one metric every second to a run of its own; each write's latency."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)
        exp = self.client.create_experiment("latency-probe")
        self.run_id = self.client.create_run(exp).info.run_id
        self.ok: list[float] = []
        self.failed = 0
        self.halt = threading.Event()

    def run(self) -> None:
        from mlflow.entities import Metric

        step = 0
        while not self.halt.wait(1.0):
            step += 1
            metric = Metric("probe", float(step), int(time.time() * 1000), step)
            start = time.perf_counter()
            try:
                self.client.log_batch(self.run_id, metrics=[metric])
                self.ok.append(time.perf_counter() - start)
            except Exception:
                self.failed += 1


@dataclass
class Driver:
    """One sweep driver process and what was seen of it."""

    proc: subprocess.Popen
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (time, MB)

    def first_start_after(self, when: float) -> float | None:
        return next((t for t, line in self.lines if t >= when and "started:" in line), None)


class Sweep:
    """A sweep run as ``experiments/sweep.py`` subprocesses (a first run, then resumes)."""

    def __init__(self, tmp: Path, space: Path, uri: str, name: str, trials: int) -> None:
        self.tmp, self.space, self.uri, self.name, self.trials = tmp, space, uri, name, trials
        self.drivers: list[Driver] = []
        self.storage = tmp / "runs"

    def start(self) -> Driver:
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
               "--space", str(self.space), "--name", self.name, "--storage", str(self.storage),
               "--tracking-uri", self.uri, "--num-samples", str(self.trials),
               "--max-concurrent", "2", "--num-workers", "1", "--cpus-per-worker", "0.9",
               "--driver-cpus", "0.1", "--seed", "0"]  # fmt: skip
        if self.drivers:
            cmd.append("--resume")
        env = {k: v for k, v in os.environ.items() if k != RETRIES}  # the drivers: their own
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, cwd=self.tmp, env=env,
        )  # fmt: skip
        driver = Driver(proc, time.time())
        self.drivers.append(driver)
        threading.Thread(target=self._read, args=(driver,), daemon=True).start()
        threading.Thread(target=self._sample, args=(driver,), daemon=True).start()
        return driver

    def _read(self, driver: Driver) -> None:
        assert driver.proc.stdout is not None
        path = LOGS / f"{self.name}-driver{len(self.drivers)}.log"
        with open(path, "w") as log:
            for line in driver.proc.stdout:
                driver.lines.append((time.time(), line.rstrip()))
                log.write(line)
                log.flush()

    def _sample(self, driver: Driver) -> None:
        while driver.proc.poll() is None:
            mb = rss_mb(driver.proc.pid)
            if mb is not None:
                driver.rss.append((time.time(), mb))
            time.sleep(1.0)

    def kill(self) -> float:
        """SIGKILL the driver; 5 s later, whatever of its session is left. Returns when."""
        driver = self.drivers[-1]
        when = time.time()
        os.kill(driver.proc.pid, signal.SIGKILL)
        driver.proc.wait()
        time.sleep(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.proc.pid, signal.SIGKILL)
        return when

    def wait(self, timeout: float) -> None:
        driver = self.drivers[-1]
        code = driver.proc.wait(timeout=timeout)
        time.sleep(0.5)  # the reader thread's last lines
        if code != 0:
            tail = "\n".join(line for _, line in driver.lines[-40:])
            raise RuntimeError(f"sweep {self.name} exited {code}:\n{tail}")


def finished(pg: Any, experiment: str) -> int:
    """Trials MLflow's store has as finished (-1 while it cannot be read).

    Read in the database with one count: an MLflow ``search_runs`` of every run costs ~0.9 s of
    CPU at 200 runs (client, server and PostgreSQL; 80 ms at 16), which polled every 2 s took a
    growing share of the 2 cores the trials run on and so inflated what the soak measures.
    """
    try:
        return int(pg.sql(
            "SELECT count(*) FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "JOIN tags t ON t.run_uuid = r.run_uuid WHERE e.name = %s AND r.status = 'FINISHED' "
            "AND r.lifecycle_stage = 'active' AND t.key = 'recsys.kind' AND t.value = 'trial'",
            DATABASE, (experiment,),
        )[0][0])  # fmt: skip
    except Exception:
        return -1


def wait_for(counts: list[tuple[float, int]], count: int, sweep: Sweep,
             timeout: float = 7200) -> None:  # fmt: skip
    """Until ``count`` trials are finished, by the counter thread's latest count (``_count``)."""
    deadline = time.time() + timeout
    while True:
        n = counts[-1][1] if counts else 0
        if n >= count:
            return
        code = sweep.drivers[-1].proc.poll()
        if code is not None:
            raise RuntimeError(
                f"the sweep ended (exit {code}) at {n} finished trials, before {count}; its "
                f"console: {LOGS}"
            )
        if time.time() > deadline:
            raise TimeoutError(f"{count} finished trials not reached")
        time.sleep(2.0)


def check_mlflow(client: Any, name: str, trials: int, storage: Path) -> dict[str, Any]:
    """What MLflow alone says of the sweep, against what it must say."""
    import pandas as pd
    from ray.tune import ExperimentAnalysis

    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'trial'", max_results=5000)
    ids = [r.data.tags["recsys.trial_id"] for r in runs]
    problems = []
    if len(runs) != trials or len(set(ids)) != trials:
        problems.append(f"{len(runs)} runs for {len(set(ids))} trial ids, {trials} trials")
    want = {"loss": list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)),
            "val_auc": list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))}  # fmt: skip
    for run in runs:
        status = run.data.tags.get("recsys.status")
        if run.info.status != "FINISHED" or status not in FINAL:
            problems.append(f"{run.info.run_id}: MLflow {run.info.status}, recsys {status}")
        if status != "finished":
            continue
        for key, steps in want.items():
            got = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            if sorted(got) != steps:
                problems.append(f"{run.info.run_id} {key} steps {got}")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`recsys.kind` = 'sweep:{name}'")
    with tempfile.TemporaryDirectory() as tmp:
        csv = pd.read_csv(client.download_artifacts(parent.info.run_id, "trials.csv", tmp))
    tune = ExperimentAnalysis(str(storage / name)).dataframe()
    mine = csv.set_index("trial")["best_val_auc"].sort_index()
    theirs = tune.set_index("trial_id")["best_val_auc"].sort_index()
    if list(mine.index) != list(theirs.index) or not (mine - theirs).abs().max() < 1e-12:
        problems.append("trials.csv differs from Tune's results")
    statuses = [r.data.tags.get("recsys.status") for r in runs]
    return {
        "runs": len(runs),
        "statuses": {s: statuses.count(s) for s in sorted(set(map(str, statuses)))},
        "problems": problems,
        "worker_s": sum(r.data.metrics.get("wall_s", 0.0) for r in runs),
    }


def store_size(pg: Any, database: str) -> dict[str, float]:
    """Metric rows of the trained runs (not the probe's) per trial-step; bytes per row of the
    whole metrics table (with its indexes); the database's size."""
    trained = "run_uuid IN (SELECT run_uuid FROM metrics WHERE key = 'loss')"
    (rows, all_rows, metric_bytes, db_bytes, steps) = pg.sql(
        f"SELECT (SELECT count(*) FROM metrics WHERE {trained}), (SELECT count(*) FROM metrics), "
        "pg_total_relation_size('metrics'), pg_database_size(current_database()), "
        "(SELECT sum(m) FROM (SELECT max(step) m FROM metrics WHERE key = 'loss' "
        "GROUP BY run_uuid) s)",
        database,
    )[0]
    return {"rows": rows, "row_bytes": metric_bytes / max(all_rows, 1), "db_bytes": db_bytes,
            "trial_steps": steps or 0}  # fmt: skip


def overhead(wall: float, slots: int, worker_s: float, trials: int) -> float:
    return (wall * slots - worker_s) / trials


def reference(tmp: Path, space: Path, uri: str, trials: int) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    sweep = Sweep(tmp, space, uri, "small", trials)
    say(f"reference sweep: {trials} trials")
    start = time.time()
    sweep.start()
    sweep.wait(timeout=3600)
    wall = time.time() - start
    checked = check_mlflow(MlflowClient(uri), "small", trials, sweep.storage)
    rss = [mb for _, mb in sweep.drivers[0].rss]
    return {"wall": wall, "checked": checked, "peak_mb": max(rss),
            "overhead": overhead(wall, 2, checked["worker_s"], trials)}  # fmt: skip


def soak(
    tmp: Path, space: Path, server: Any, counts: list[tuple[float, int]], trials: int, seed: int
) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    rng = random.Random(seed)
    n = trials
    kills = [rng.randint(n // 8, n * 3 // 8), rng.randint(n * 3 // 4, n * 9 // 10)]
    outage_at, worker_at = rng.randint(n * 4 // 10, n // 2), rng.randint(n * 11 // 20, n * 7 // 10)
    client = MlflowClient(server.uri)
    sweep = Sweep(tmp, space, server.uri, "soak", trials)
    events: list[str] = []
    lost: list[float] = []  # seconds from a kill to the resumed driver's first trial start
    start = time.time()
    sweep.start()
    for at, what in sorted([(kills[0], "kill"), (outage_at, "outage"), (worker_at, "worker"),
                            (kills[1], "kill")]):  # fmt: skip
        wait_for(counts, at, sweep)
        say(f"{at} finished: {what}")
        if what == "kill":
            when = sweep.kill()
            driver = sweep.start()
            events.append(f"driver SIGKILLed at {at} finished trials, resumed")
            while driver.first_start_after(when) is None and driver.proc.poll() is None:
                time.sleep(0.5)
            lost.append((driver.first_start_after(when) or time.time()) - when)
        elif what == "outage":
            server.stop()
            time.sleep(30)
            server.start()
            events.append(f"tracking server down 30 s at {at} finished trials")
        else:
            victim = kill_a_worker(rng)
            events.append(f"training worker {victim} SIGKILLed after {at} finished trials")
    sweep.wait(timeout=7200)
    wall = time.time() - start
    checked = check_mlflow(client, "soak", trials, sweep.storage)
    worker_s = checked["worker_s"]
    return {"wall": wall, "checked": checked, "events": events, "lost": lost, "sweep": sweep,
            "start": start,
            "overhead": overhead(wall, 2, worker_s, trials),
            "overhead_no_faults": overhead(wall - sum(lost), 2, worker_s, trials)}  # fmt: skip


def memory_at(sweep: Sweep, client_counts: list[tuple[float, int]], count: int) -> float:
    """The driver's peak RSS (MB) up to the time ``count`` trials had finished."""
    until = next((t for t, n in client_counts if n >= count), float("inf"))
    return max(mb for d in sweep.drivers for t, mb in d.rss if t <= until)


def run(trials: int = 200, small: int = 16, seed: int = 0) -> str:
    from tests.servers import MlflowServer, Postgres, missing

    why = missing()
    if why:
        raise SystemExit(f"soak: {why}")
    LOGS.mkdir(exist_ok=True)
    os.environ[RETRIES] = "0"  # the probe and the counting fail at once while the server is down
    pg = Postgres().start()
    server = None
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as folder:
            tmp = Path(folder)
            space = tmp / "soak.yaml"
            space.write_text(SPACE)
            server = MlflowServer(pg.database(DATABASE), tmp / "artifacts").start()
            probe = Probe(server.uri)
            probe.start()
            counts: list[tuple[float, int]] = []
            ref = reference(tmp, space, server.uri, small)
            counter = threading.Thread(target=_count, args=(pg, counts), daemon=True)
            counter.start()
            result = soak(tmp, space, server, counts, trials, seed)
            probe.halt.set()
            store = store_size(pg, DATABASE)
            return report(ref, result, probe, store, counts, trials, small)
    finally:
        if server is not None:
            server.stop()
        pg.stop()


def _count(pg: Any, counts: list[tuple[float, int]]) -> None:
    while True:
        n = finished(pg, "soak")
        if n >= 0:
            counts.append((time.time(), n))
        time.sleep(2.0)


def wall_per(counts: list[tuple[float, int]], start: float, step: int, trials: int) -> list[float]:
    """Minutes for each ``step`` more finished trials (flat if nothing grows with the count)."""
    marks = [start] + [next((t for t, n in counts if n >= k), float("nan"))
                       for k in range(step, trials + 1, step)]  # fmt: skip
    return [(b - a) / 60 for a, b in itertools.pairwise(marks)]


def report(ref: dict, result: dict, probe: Probe, store: dict, counts: list, trials: int,
           small: int) -> str:  # fmt: skip
    sweep: Sweep = result["sweep"]
    at50, at_end = memory_at(sweep, counts, 50), memory_at(sweep, counts, trials)
    peaks = [max(mb for _, mb in d.rss) for d in sweep.drivers if d.rss]
    lat = sorted(probe.ok)
    p50, p99 = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    checked = result["checked"]
    ratio, clean = result["overhead"] / ref["overhead"], result["overhead_no_faults"]
    rows: list[list[Any]] = [
        ["trials (runs in MLflow)", f"{small} ({ref['checked']['runs']})",
         f"{trials} ({checked['runs']})"],
        ["final statuses", json.dumps(ref["checked"]["statuses"]),
         json.dumps(checked["statuses"])],
        ["problems found in MLflow", len(ref["checked"]["problems"]),
         f"{len(checked['problems'])} {checked['problems'][:3]}"],
        ["wall time", f"{ref['wall'] / 60:.1f} min", f"{result['wall'] / 60:.1f} min"],
        ["trials per hour", f"{small / ref['wall'] * 3600:.0f}",
         f"{trials / result['wall'] * 3600:.0f}"],
        ["wall per 50 finished trials", "",
         ", ".join(f"{m:.1f}" for m in wall_per(counts, result["start"], 50, trials)) + " min"],
        ["overhead per trial (slot-s)", f"{ref['overhead']:.1f}",
         f"{result['overhead']:.1f} ({ratio:.2f}x); without the {sum(result['lost']):.0f} s "
         f"from kills to resumed trials: {clean:.1f} ({clean / ref['overhead']:.2f}x)"],
        ["driver peak RSS", f"{ref['peak_mb']:.0f} MB",
         f"by 50 finished {at50:.0f} MB, by {trials} {at_end:.0f} MB ({at_end / at50:.2f}x); "
         f"per driver {', '.join(f'{p:.0f}' for p in peaks)} MB"],
        ["MLflow write latency (probe)", "",
         f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms ({len(lat)} writes; "
         f"{probe.failed} failed during the outage)"],
        ["PostgreSQL store", "",
         f"{store['rows']} metric rows of trained runs, "
         f"{store['rows'] / max(store['trial_steps'], 1):.2f} rows/trial-step; "
         f"{store['row_bytes']:.0f} B/row (metrics table with indexes); "
         f"database {store['db_bytes'] / 2**20:.1f} MB"],
    ]  # fmt: skip
    faults = "; ".join(result["events"])
    return table(["", f"{small}-trial sweep", f"soak (faults: {faults})"], rows)
