"""A sweep's results, from Ray Tune's ``ResultGrid``: one row per trial from its *best* report.

A trial's score is the best value of the space's metric over its validation reports (the workers
report it as ``best_<metric>`` in every report), so the row shows that report's metrics, its step
and its checkpoint, not the last report's. Rows are ranked by the score (trials without one last),
and trials no other trial beats in every objective are marked ``pareto``: the space's objectives
when it has several, else the score against embedding bytes (the trade QR and mixed dims make).

    frame = trial_frame(result_grid, space)      # pandas, best first
    print(format_table(frame, space))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from recsys.tune.search import INFEASIBLE
from recsys.tune.space import Objective, SearchSpace

METRICS = ["val_auc", "val_log_loss", "val_ne"]  # shown from the best report
COST = ["wall_s", "worker_s", "samples_seen"]  # what the trial cost, from its last report


STOPPED = "stopped"  # by the scheduler (ASHA), or paused at a rung of halving, before its end
SCORED = ("finished", "early_stopped", STOPPED)  # a trial with a score to stand on
TRAINED_TO_END = ("finished", "early_stopped")  # not cut short by the scheduler (a reference's)


def any_scored(rows: list[dict[str, Any]]) -> bool:
    """Whether one search trial among a sweep's ``rows`` (baselines aside) has a score."""
    return any(r.get("role", "trial") == "trial" and r.get("status") in SCORED for r in rows)


def trial_status(metrics: dict[str, Any], steps: int) -> str:
    """A trial's outcome from its last report: ``infeasible``, ``diverged``, ``early_stopped``
    (patience), ``stopped`` (the scheduler ended it before its last step) or ``finished``. Its
    last step is the one its workers report training to (``train_steps``: a budget in epochs
    comes to its own steps for the trial's batch size and workers), else ``steps`` (the sweep's
    base config's, derived for the sweep's workers)."""
    for key in (INFEASIBLE, "diverged", "early_stopped"):
        if metrics.get(key):
            return key
    if metrics.get("converged"):  # a full-batch solver's end (train.solver: lbfgs)
        return "finished"
    own = metrics.get("train_steps")
    last = own if isinstance(own, (int, float)) and own > 0 else steps
    return "finished" if metrics.get("step", 0) >= last else STOPPED


def status(result: Any, last: dict[str, Any], steps: int) -> str:
    if result.error is not None:
        return "error"
    return trial_status(last, steps)


def best_report(result: Any, objective: Objective) -> dict[str, Any]:
    """The report with the best value of ``objective.metric`` (the earliest among equals)."""
    frame = result.metrics_dataframe
    last = result.metrics or {}
    if frame is None or objective.metric not in frame.columns:
        return last
    values = pd.to_numeric(frame[objective.metric], errors="coerce")
    if not values.notna().any():
        return last
    best = values.max() if objective.mode == "max" else values.min()
    return {str(k): v for k, v in frame[values == best].iloc[0].items()}


def non_dominated(points: np.ndarray, modes: list[str]) -> np.ndarray:
    """Which rows of ``points`` ``[N, K]`` no other row beats: at least as good in every column
    and better in one (``modes[k]``: ``max`` or ``min``). Rows with a NaN are never marked."""
    signed = points * np.array([1.0 if m == "max" else -1.0 for m in modes])
    ok = ~np.isnan(signed).any(axis=1)
    keep = ok.copy()
    for i in np.flatnonzero(ok):
        others = signed[ok]
        beats = (others >= signed[i]).all(axis=1) & (others > signed[i]).any(axis=1)
        keep[i] = not beats.any()
    return keep


def front_objectives(space: SearchSpace) -> list[Objective]:
    if len(space.objectives) > 1:
        return space.objectives
    return [space.objectives[0], Objective("emb_bytes", "min")]


# In a reference trial's params: the name of its grid point, which successive halving trains over
# several rounds (one Tune trial each): its id in the results, its MLflow run's and its training's
# (``recsys.tune.trial``), instead of each round's Tune trial id.
POINT = "_point"
PAUSE = "_pause_at"  # in a round's trial params: the step it pauses at (``train.pause_at``)


def point_of(params: dict[str, Any], trial_id: str) -> str:
    """The id of a trial's results, MLflow run and training: its point's (``POINT``) or Tune's."""
    return str(params.get(POINT) or trial_id)


def best_columns(space: SearchSpace) -> list[str]:
    """The columns of a row taken from its trial's best report (``_row``)."""
    return ["best_step", *METRICS, *task_aucs(space), "checkpoint"]


def _row(result: Any, space: SearchSpace, role: str) -> dict[str, Any]:
    last = result.metrics or {}
    best = best_report(result, space.objectives[0])
    given = dict((result.config or {}).get("params", {}))
    params = {k: v for k, v in given.items() if not k.startswith("_")}  # (a phase's own keys)
    row: dict[str, Any] = {
        "trial": point_of(given, last.get("trial_id", "")),
        "role": role,
        "arch": params.get("model.arch", space.base.model.arch),
        "status": status(result, last, space.base.train.steps),
    }
    row.update(params)
    row["params"] = params  # as sampled (a column with a None turns 1000 into 1000.0)
    for o in space.objectives:
        row[o.key] = last.get(o.key, math.nan)
    row["best_step"] = best.get("step", math.nan)
    row["last_step"] = last.get("step", math.nan)
    row["train_steps"] = last.get("train_steps", math.nan)  # its budget, as its workers made it
    row.update({m: best.get(m, math.nan) for m in METRICS + task_aucs(space)})
    row["emb_bytes"] = last.get("emb_bytes", math.nan)
    row["samples_per_s"] = last.get("samples_per_s", math.nan)
    row.update({c: last.get(c, math.nan) for c in COST})
    row["checkpoint"] = best.get("checkpoint_path", "")
    row["worker_nodes"] = last.get("worker_nodes", "")
    row["status_detail"] = last.get("status_detail", "")
    return row


def task_aucs(space: SearchSpace) -> list[str]:
    """``val_auc/<task>`` of each task, when the trials have several (shown per trial)."""
    names = space.base.loss.names()
    return [f"val_auc/{t}" for t in names] if len(names) > 1 else []


def trial_frame(result_grid: Any, space: SearchSpace, role: str = "trial") -> pd.DataFrame:
    """One row per trial (its params, status, score, best report, cost), best first. ``role``:
    the phase the trials ran in (``trial``: the search, whose rows get ``pareto``)."""
    frame = pd.DataFrame([_row(r, space, role) for r in result_grid])
    if frame.empty:
        return frame
    objectives = front_objectives(space)
    for o in objectives:
        if o.key not in frame:
            frame[o.key] = math.nan
    points = frame[[o.key for o in objectives]].to_numpy(dtype=float)
    frame["pareto"] = non_dominated(points, [o.mode for o in objectives]) & (role == "trial")
    return ranked(frame, space)


def ranked(frame: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """Rows by the space's score, best first (rows without one last)."""
    score = space.objectives[0]
    frame = frame.sort_values(score.key, ascending=score.mode == "min", na_position="last")
    return frame.reset_index(drop=True)


def with_baselines(
    trials: pd.DataFrame, baselines: pd.DataFrame, space: SearchSpace
) -> pd.DataFrame:
    """The search's rows and the baselines' (``role == "baseline"``) in one ranking."""
    if baselines.empty:
        return trials
    return ranked(pd.concat([trials, baselines], ignore_index=True), space)


def short(key: str) -> str:
    """A swept key as a column name: ``embeddings.qr.threshold`` -> ``qr.threshold``,
    ``optim.lr`` -> ``lr``."""
    parts = key.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 and parts[-2] == "qr" else parts[-1]


def format_table(frame: pd.DataFrame, space: SearchSpace, top: int = 10, winner: str = "") -> str:
    """The best ``top`` search trials and every baseline, in one ranking: model (``[best]`` on
    the ``winner`` trial's row: the sweep's best model, whatever its kind), params, status,
    score, step, metrics of the best report, MB, cost (worker-seconds)."""
    if frame.empty:
        return "(no trials)"
    params = [d.key for d in space.dimensions if d.key in frame]
    role = frame["role"] if "role" in frame else pd.Series("trial", index=frame.index)
    keep = (role == "trial").cumsum().le(top) & (role == "trial") | (role != "trial")
    shown = frame[keep].copy()
    shown["emb MB"] = shown["emb_bytes"] / 2**20
    shown["pareto"] = shown["pareto"].map({True: "*", False: ""})
    models = []
    if (role != "trial").any():
        ref = role[keep] != "trial"
        shown["model"] = shown["arch"].where(~ref, shown["arch"] + " (ref)")
        shown.loc[shown["trial"] == winner, "model"] += " [best]"
        models = ["model"]
        for p in params:  # a reference's row shows no searched value
            shown[p] = shown[p].astype(object).where(~ref, "")
    scores = [o.key for o in space.objectives if o.key != "emb_bytes"]
    metrics = [m for m in METRICS + task_aucs(space) if m != space.metric]
    cost = [c for c in ("worker_s",) if c in shown and c not in scores]
    columns = ["trial", *models, "status", *params, *scores, "best_step", *metrics, "emb MB",
               "samples_per_s", *cost, "pareto"]  # fmt: skip
    out = shown[columns].rename(columns={p: short(p) for p in params})
    return out.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-")


def pareto_plot(frame: pd.DataFrame, space: SearchSpace, path: str) -> list[str]:
    """The score against embedding memory, one point per trial, the non-dominated ones marked,
    the baselines apart. Returns the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = space.objectives[0]
    ok = frame[frame[score.key].notna() & frame["emb_bytes"].notna()]
    refs = ok[ok["role"] == "baseline"] if "role" in ok else ok.iloc[:0]
    ok = ok[ok["role"] == "trial"] if "role" in ok else ok
    x, y = ok["emb_bytes"] / 2**20, ok[score.key]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(x, y, c="tab:blue", label="trials")
    if not refs.empty:
        rx, ry = refs["emb_bytes"] / 2**20, refs[score.key]
        ax.scatter(rx, ry, c="black", marker="s", label="baselines (references)")
        for arch, xi, yi in zip(refs["arch"], rx, ry, strict=True):
            ax.annotate(f"{arch} (ref)", (xi, yi), fontsize=8)
    front = ok[ok["pareto"]].sort_values("emb_bytes")
    ax.plot(front["emb_bytes"] / 2**20, front[score.key], "o-", c="tab:red", label="non-dominated")
    for trial, xi, yi in zip(ok["trial"], x, y, strict=True):
        ax.annotate(str(trial)[-5:], (xi, yi), fontsize=7, alpha=0.7)
    ax.set_xlabel("embedding memory (MB)")
    ax.set_ylabel(f"{score.metric}, best report ({score.mode})")
    ax.set_title(f"{space.name}: each trial's best {score.metric} against embedding memory")
    labels = [t.get_text() for t in ax.legend().get_texts()]
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return labels
