"""What a finished search's own results say about its space: edges and early peaks.

- **Edges.** A numeric dimension whose best trials (the ``TOP`` best with a score) all sit in the
  outer tenth of its range, on one side (a ``loguniform`` range measured on a log scale), or a
  numeric ``choice``/``grid`` whose best trials all took its smallest or its largest value: the
  search's optimum may lie beyond the range. Said one line each, tagged on the sweep's MLflow run
  (``recsys.edge.<key>``), kept in ``sweep.json``; ``--more N --widen`` grows the sweep with each
  such range widened on its side (``widened``: a decade for a ``loguniform`` range, its own width
  for a ``uniform`` or ``randint`` one, one value a step beyond for a choice, the ratio of its two
  values at that end, or their difference where one is 0 or below).
- **Early peaks.** Where most scored trials (more than half) peaked within the first tenth of
  their budget (``best_step <= train_steps / 10``), the search saw each peak coarsely and spent the
  rest learning nothing: said with what to change (``recsys.early_peaks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from recsys.tune.results import SCORED
from recsys.tune.space import Dimension, SearchSpace

TOP = 3  # the best trials an edge is read from
OUTER = 0.1  # the outer share of a range that counts as its edge
EARLY = 0.1  # a peak in this first share of the budget is early


def numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


@dataclass(frozen=True)
class Edge:
    """A dimension the best trials pressed against: ``side`` ``low`` or ``high`` of ``dim``,
    with the best trials' values (``best``)."""

    dim: Dimension
    side: str
    best: tuple[Any, ...]

    def range_text(self) -> str:
        return f"{self.dim.kind} {self.dim.values}"

    def line(self) -> str:
        """``edge: optim.lr: the 3 best trials sit at the top of loguniform [0.01, 0.1] (...)``."""
        where = {"low": "bottom", "high": "top"}[self.side]
        part = "tenth" if self.dim.kind in ("uniform", "loguniform", "randint") else "value"
        shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in self.best)
        wider = widened(self.dim, self.side).values
        return (f"edge: {self.dim.key}: the {len(self.best)} best trials sit in the {where} "
                f"{part} of {self.range_text()} ({shown}): its optimum may lie beyond; "
                f"--more N --widen searches {wider}")  # fmt: skip

    def tag(self) -> str:
        return f"{self.side}: {self.range_text()}; best {list(self.best)}"

    def saved(self) -> dict[str, Any]:
        return {"key": self.dim.key, "side": self.side}


def position(dim: Dimension, value: Any) -> float:
    """Where ``value`` lies in a range dimension, 0 (low) to 1 (high); a log scale for
    ``loguniform``."""
    low, high = (float(v) for v in dim.values)
    if dim.kind == "loguniform":
        low, high, value = math.log(low), math.log(high), math.log(float(value))
    if dim.kind == "randint":
        high -= 1  # (exclusive, as Ray Tune's)
    return (float(value) - low) / (high - low) if high > low else 0.5


def edge_of(dim: Dimension, best: list[Any]) -> str | None:
    """``low``, ``high`` or None: the side of ``dim`` every one of ``best`` presses against."""
    if dim.kind in ("uniform", "loguniform", "randint"):
        where = [position(dim, v) for v in best]
        if all(p <= OUTER for p in where):
            return "low"
        if all(p >= 1 - OUTER for p in where):
            return "high"
        return None
    values = [v for v in dim.values if v is not None]
    if not numeric(values) or not numeric(best) or len(set(values)) < 2:
        return None  # (no order: a categorical choice)
    if all(v == min(values) for v in best):
        return "low"
    if all(v == max(values) for v in best):
        return "high"
    return None


def search_edges(frame: pd.DataFrame, space: SearchSpace) -> list[Edge]:
    """The edges the ``TOP`` best scored search trials of ``frame`` (ranked) press against."""
    if frame.empty:
        return []
    key = space.objectives[0].key
    role = frame["role"] if "role" in frame else pd.Series("trial", index=frame.index)
    scored = frame[(role == "trial") & frame["status"].isin(SCORED) & frame[key].notna()]
    top = scored.head(TOP)
    if len(top) < TOP:
        return []
    out = []
    for dim in space.dimensions:
        best = [p.get(dim.key) for p in top["params"]]
        if any(v is None for v in best):
            continue
        side = edge_of(dim, best)
        if side is not None:
            out.append(Edge(dim, side, tuple(best)))
    return out


def tidy(x: float) -> float:
    """``x`` to 12 significant digits: 0.3 * 0.3 / 0.2 is 0.45, not 0.44999999999999996."""
    return float(f"{x:.12g}")


def widened(dim: Dimension, side: str) -> Dimension:
    """``dim`` widened on ``side`` (the module's rules)."""
    values = list(dim.values)
    if dim.kind == "loguniform":
        low, high = values
        return Dimension(dim.key, dim.kind, [tidy(low / 10), high] if side == "low"
                         else [low, tidy(high * 10)])  # fmt: skip
    if dim.kind in ("uniform", "randint"):
        low, high = values
        width = high - low
        if side == "low":
            low = tidy(low - width) if low < 0 or low - width >= 0 else 0
            return Dimension(dim.key, dim.kind, [low, high])
        return Dimension(dim.key, dim.kind, [low, tidy(high + width)])
    options = sorted({v for v in values if v is not None})
    a, b = (options[0], options[1]) if side == "low" else (options[-1], options[-2])
    new = tidy(a * a / b if a > 0 and b > 0 else a + (a - b))
    if all(isinstance(v, int) for v in options):
        new = round(new)
    if new in options:
        return dim
    return Dimension(dim.key, dim.kind, [*values, new] if side == "high" else [new, *values])


def widen(space: SearchSpace, saved: list[dict[str, Any]]) -> SearchSpace:
    """``space`` with each saved edge's dimension widened on its side (``Edge.saved``), the
    space's file text untouched but for its ``space`` section (the new ranges), checked as a
    space is (every option builds)."""
    from dataclasses import replace

    from recsys.tune.space import check_builds

    sides = {e["key"]: e["side"] for e in saved}
    dims = [widened(d, sides[d.key]) if d.key in sides else d for d in space.dimensions]
    check_builds(space.source, space.base, dims)
    raw = {**space.raw, "space": {d.key: {d.kind: list(d.values)} for d in dims}}
    return replace(space, dimensions=dims, raw=raw)


@dataclass(frozen=True)
class EarlyPeaks:
    """How many scored search trials (``of``) peaked within the first tenth of their budget."""

    early: int
    of: int
    steps: int  # the budget the share is read against (the trials' own, their median)

    @property
    def most(self) -> bool:
        return self.of > 0 and self.early * 2 > self.of

    def line(self) -> str:
        return (
            f"early peaks: {self.early} of {self.of} trials peaked within the first tenth of "
            f"their budget (best_step <= {self.steps / 10:g} of {self.steps}): the search sees "
            "each peak coarsely and spends the rest learning nothing. Report more often "
            "(train.reports_per_epoch, train.checkpoint_every), shorten the budget "
            "(train.epochs, train.steps), lower the learning rates, or regularise more "
            "(model.dropout, optim.weight_decay, optim.embedding_weight_decay)"
        )


def early_peaks(frame: pd.DataFrame, space: SearchSpace) -> EarlyPeaks:
    """The search trials of ``frame`` that peaked early, of those with a score and a budget."""
    if frame.empty or "train_steps" not in frame:
        return EarlyPeaks(0, 0, 0)
    key = space.objectives[0].key
    role = frame["role"] if "role" in frame else pd.Series("trial", index=frame.index)
    ok = frame[(role == "trial") & frame["status"].isin(SCORED) & frame[key].notna()]
    ok = ok[ok["best_step"].notna() & ok["train_steps"].notna() & (ok["train_steps"] > 0)]
    if ok.empty:
        return EarlyPeaks(0, 0, 0)
    early = int((ok["best_step"] <= EARLY * ok["train_steps"]).sum())
    return EarlyPeaks(early, len(ok), int(ok["train_steps"].median()))
