"""The sweep's console: a line when a trial starts and when it ends, and a compact table (status,
sampled params, step, the metric now and its best so far, embedding MB, samples/s): redrawn in
place in a terminal, printed every ``every_s`` seconds in a log. Ray Tune's own per-trial output
is off (``verbose=0``).

The table stays readable at hundreds of trials: a summary line (trials by status, and an ETA from
the finished trials' durations), then the running trials and the ``top`` best ones, never more.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import IO, Any

import pandas as pd
from ray.tune import Callback

from recsys.tune.results import PAUSE, POINT, short, trial_status


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ",".join(fmt(v) for v in value) + "]"
    return str(value)


def status_of(result: dict[str, Any], done: bool, steps: int) -> str:
    if not done:
        return "running"
    status = trial_status(result, steps)
    return "done" if status == "finished" else status


def clock(seconds: float) -> str:
    """``1h05m``, ``4m10s``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


# each phase's clock starts at 0: its name beside it, so a later phase's [00:06] does not read as
# time going back after an earlier one's [03:34]
PHASES = {"trial": "search", "baseline": "baselines", "confirm": "seed check"}


class Console:
    """The terminal two phases print to at once (the references beside the search): lines go
    above the one table drawn in place (a terminal's), which is erased and drawn again below
    them; one lock orders the threads' writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shown = ""  # the table now drawn ('' for none)

    def _erase(self, out: IO[str]) -> None:
        if self.shown and out.isatty():
            print(f"\x1b[{self.shown.count(chr(10)) + 1}F\x1b[J", end="", file=out)

    def line(self, text: str, out: IO[str]) -> None:
        with self.lock:
            self._erase(out)
            print(text, file=out, flush=True)
            if self.shown and out.isatty():
                print(self.shown, file=out, flush=True)

    def table(self, text: str, out: IO[str]) -> None:
        """Draw ``text`` in place of the table drawn before ('' erases it)."""
        with self.lock:
            self._erase(out)
            self.shown = text
            if text:
                print(text, file=out, flush=True)


CONSOLE = Console()  # the process's one terminal


class Progress(Callback):  # type: ignore[misc]
    """Prints the progress of the trials of a sweep scored by ``metric``."""

    def __init__(
        self,
        metric: str,
        steps: int,
        every_s: float = 300.0,
        mode: str = "max",
        total: int = 0,
        top: int = 10,
        label: str = "trial",
        table: bool = True,
        t0: float = 0.0,
    ) -> None:
        self.metric, self.steps, self.every_s = metric, steps, every_s  # (pickled by Tune)
        self.mode, self.total, self.top = mode, total, top
        self.label = label  # "trial", "baseline", "confirm": the phase's trials
        self.draws = table  # False: its lines only (a phase beside another that draws its table)
        self.t0 = t0 or time.time()  # (a phase's start: its clock's 00:00)
        self.rows: dict[str, dict[str, Any]] = {}
        self.started: dict[str, float] = {}  # trial id -> when it started
        self.durations: list[float] = []  # of the trials that ended
        self.last_table = time.time()

    @property
    def out(self) -> IO[str]:
        return sys.stdout

    @property
    def tty(self) -> bool:
        return self.out.isatty()

    def _say(self, text: str) -> None:
        minutes, seconds = divmod(int(time.time() - self.t0), 60)
        phase = PHASES.get(self.label, self.label)
        CONSOLE.line(f"[{phase} {minutes:02d}:{seconds:02d}] {text}", self.out)

    def _row(self, trial: Any) -> dict[str, Any]:
        if trial.trial_id not in self.rows:
            params = (trial.config or {}).get("params", {})
            point = str(params.get(POINT, ""))  # (a point of successive halving: fm-3)
            name = point.rsplit("baselines-", 1)[-1] if point else trial.trial_id.split("_")[-1]
            row = {"trial": name, "status": "running"}
            shown = {short(k.lstrip("_")): v for k, v in params.items()  # (_confirms: a phase's)
                     if k != POINT and not (k == PAUSE and not v)}  # fmt: skip
            self.rows[trial.trial_id] = {**row, **shown}
        return self.rows[trial.trial_id]

    def _update(self, trial: Any, result: dict[str, Any], done: bool) -> dict[str, Any]:
        row = self._row(trial)
        row.update({
            "status": status_of(result, done, self.steps),
            "step": result.get("step", row.get("step", 0)),
            self.metric: result.get(self.metric, row.get(self.metric, math.nan)),
            "best": result.get(f"best_{self.metric}", row.get("best", math.nan)),
            "emb MB": result.get("emb_bytes", math.nan) / 2**20,
            "samples/s": result.get("samples_per_s", row.get("samples/s", math.nan)),
        })  # fmt: skip
        return row

    def summary(self, now: float | None = None) -> str:
        """``12 trials of 200: 2 running, 9 done, 1 infeasible; ETA 1h05m``."""
        counts: dict[str, int] = {}
        for row in self.rows.values():
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        total = max(self.total, len(self.rows))
        parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        text = f"{len(self.rows)} {self.label}s of {total}: {parts}"
        running = counts.get("running", 0)
        left = total - len(self.rows) + running
        if self.durations and left and running:
            now = time.time() if now is None else now
            mean = sum(self.durations) / len(self.durations)
            busy = [now - self.started[t] for t, r in self.rows.items()
                    if r["status"] == "running" and t in self.started]  # fmt: skip
            ahead = sum(max(mean - b, 0.0) for b in busy) + (left - running) * mean
            text += f"; ETA {clock(ahead / running)}"
        return text

    def shown(self) -> list[dict[str, Any]]:
        """The running trials, then the ``top`` best of the others (by their best score)."""
        rows = list(self.rows.values())
        running = [r for r in rows if r["status"] == "running"]
        others = [r for r in rows if r["status"] != "running"]
        sign = -1.0 if self.mode == "max" else 1.0

        def key(r: dict[str, Any]) -> float:
            best = r.get("best", math.nan)
            return math.inf if not isinstance(best, float) or math.isnan(best) else sign * best

        return running + sorted(others, key=key)[: self.top]

    def table(self) -> str:
        if not self.rows:
            return ""
        frame = pd.DataFrame(self.shown())
        hidden = len(self.rows) - len(frame)
        more = f"\n({hidden} more not shown; all in the final table)" if hidden else ""
        return self.summary() + "\n" + frame.map(fmt).to_string(index=False) + more

    def _draw(self) -> None:
        if not self.draws:
            return
        text = self.table()
        if self.tty:
            CONSOLE.table(text, self.out)
        elif time.time() - self.last_table >= self.every_s:
            CONSOLE.line(text, self.out)
            self.last_table = time.time()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.started.setdefault(trial.trial_id, time.time())
        row = self._row(trial)
        params = " ".join(f"{k}={fmt(v)}" for k, v in row.items() if k not in ("trial", "status"))
        self._say(f"{self.label} {row['trial']} started: {params}")
        self._draw()

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self._update(trial, result, done=False)
        self._draw()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.started:
            self.durations.append(time.time() - self.started[trial.trial_id])
        row = self._update(trial, trial.last_result or {}, done=True)
        detail = trial.last_result.get("status_detail", "") if trial.last_result else ""
        score = (
            f"best {self.metric} {fmt(row['best'])}" if row["status"] != "infeasible" else detail
        )
        self._say(f"{self.label} {row['trial']} {row['status']}: step {row['step']}, {score}")
        self._draw()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        row = self._row(trial)
        row["status"] = "error"
        self._say(f"{self.label} {row['trial']} failed: see {trial.local_path or trial.path}")
        self._draw()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.draws:
            CONSOLE.table("", self.out)
