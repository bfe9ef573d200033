"""The sweep's console table at 200 trials: a summary line with counts and an ETA, the running
trials and the best ten, never one row per trial."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from recsys.tune.progress import Progress


@dataclass
class FakeTrial:
    trial_id: str
    config: dict[str, Any] = field(default_factory=dict)
    last_result: dict[str, Any] = field(default_factory=dict)
    local_path: str = ""
    path: str = ""


class Captured(Progress):
    buffer = io.StringIO()

    @property
    def out(self):
        return self.buffer


def run(n_done: int, n_running: int, total: int) -> tuple[Captured, list[FakeTrial]]:
    p = Captured("val_auc", steps=100, every_s=0.0, mode="max", total=total)
    Captured.buffer = io.StringIO()
    trials = []
    for i in range(n_done + n_running):
        t = FakeTrial(f"abc_{i:05d}", {"params": {"optim.lr": 0.01 * (i + 1)}})
        trials.append(t)
        p.on_trial_start(0, trials, t)
        result = {"step": 100 if i < n_done else 50, "val_auc": 0.7, "best_val_auc": 0.6 + i / 1e4}
        p.on_trial_result(0, trials, t, result)
        if i < n_done:
            t.last_result = result
            p.on_trial_complete(0, trials, t)
    return p, trials


def test_a_200_trial_sweep_shows_a_summary_the_running_and_the_best_ten():
    p, _ = run(n_done=198, n_running=2, total=200)
    table = p.table().splitlines()
    assert len(table) <= 1 + 1 + 2 + 10 + 1, table  # summary, header, running, top 10, "more"
    assert table[0].startswith("200 trials of 200: 198 done, 2 running; ETA ")
    assert table[-1] == "(188 more not shown; all in the final table)"
    rows = table[2:-1]
    assert [r.split()[0] for r in rows[:2]] == ["00198", "00199"]  # the running ones first
    assert [r.split()[0] for r in rows[2:]] == [f"{i:05d}" for i in range(197, 187, -1)]  # best
    # every redraw in a log is that short too: no line of the console lists all trials
    last = Captured.buffer.getvalue().split("200 trials of 200")[-1]
    assert len(last.strip().splitlines()) == len(table)


def test_a_small_sweep_shows_every_trial_and_an_eta_from_finished_durations():
    p, _ = run(n_done=2, n_running=1, total=8)
    p.durations = [60.0, 60.0]  # each finished trial took a minute
    p.started = {k: 0.0 for k in p.rows}
    summary = p.summary(now=30.0)  # the running one is half done; 5 not started, 1 at a time
    assert summary == "3 trials of 8: 2 done, 1 running; ETA 5m30s"
    assert len(p.table().splitlines()) == 1 + 1 + 3  # summary, header, every trial


def test_minimised_metrics_rank_the_lowest_first():
    p = Captured("val_log_loss", steps=10, every_s=0.0, mode="min")
    for i, best in enumerate([0.5, 0.3, 0.4]):
        t = FakeTrial(f"x_{i}", {"params": {}})
        p.on_trial_start(0, [], t)
        t.last_result = {"step": 10, "best_val_log_loss": best}
        p.on_trial_complete(0, [], t)
    assert [r["trial"] for r in p.shown()] == ["1", "2", "0"]


def test_each_phases_clock_is_named(capsys):
    """A later phase's clock restarts at 0: its name beside it, so [00:06] after [03:34] does
    not read as time going back."""
    from recsys.tune.progress import Progress

    for label, name in (("baseline", "baselines"), ("trial", "search"), ("confirm", "seed check")):
        Progress("val_auc", 10, label=label)._say("x")
        assert capsys.readouterr().out == f"[{name} 00:00] x\n"
