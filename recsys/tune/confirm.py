"""The seed check's statistics: is the winner's lead larger than the noise of a retrain?

After the search, the ``top`` best configurations are re-trained with ``seeds`` new seeds each
(``recsys.tune.phases``). Each configuration's score is then the mean of those new runs with a
two-sided t confidence interval (the search's own run is left out: it was picked as the maximum of
many, so it is biased upward). The leader and the runner-up are *separable* when Welch's interval
of the difference of their means excludes 0.

Export picks the best confirmed mean, not a lower confidence bound: the mean is what a retrain of
that configuration is expected to score, and a lower bound would reward a configuration for the
low spread it happened to show over a handful of seeds, itself a noisy estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95


@dataclass(frozen=True)
class Spread:
    """A configuration's confirmed score: its seed runs' values, their mean, sample standard
    deviation and the ``level`` t interval of the mean."""

    trial: str
    values: list[float]
    mean: float
    std: float
    low: float
    high: float

    @property
    def n(self) -> int:
        return len(self.values)


def _t(q: float, df: float) -> float:
    """Student's t quantile (scipy.stats loads in about a second: only when a sweep needs it)."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


def spread(trial: str, values: list[float], level: float = LEVEL) -> Spread:
    """``values``: the metric of each seed run (at least 2)."""
    a = np.asarray(values, dtype=float)
    mean, std = float(a.mean()), float(a.std(ddof=1))
    half = _t(0.5 + level / 2, len(a) - 1) * std / math.sqrt(len(a))
    return Spread(trial, [float(v) for v in a], mean, std, mean - half, mean + half)


def ranked(spreads: list[Spread], mode: str) -> list[Spread]:
    """Best confirmed mean first."""
    return sorted(spreads, key=lambda s: -s.mean if mode == "max" else s.mean)


@dataclass(frozen=True)
class Separation:
    """The leader's mean minus the runner-up's (signed so that positive means the leader is
    better), Welch's ``level`` interval of it, and whether that excludes 0."""

    lead: float
    low: float
    high: float

    @property
    def separable(self) -> bool:
        return self.low > 0


def separation(first: Spread, second: Spread, mode: str, level: float = LEVEL) -> Separation:
    sign = 1.0 if mode == "max" else -1.0
    v1, v2 = first.std**2 / first.n, second.std**2 / second.n
    se = math.sqrt(v1 + v2)
    lead = sign * (first.mean - second.mean)
    if se == 0.0:
        return Separation(lead, lead, lead)
    df = (v1 + v2) ** 2 / (v1**2 / (first.n - 1) + v2**2 / (second.n - 1))
    half = _t(0.5 + level / 2, df) * se
    return Separation(lead, lead - half, lead + half)


def verdict(spreads: list[Spread], mode: str, metric: str) -> str:
    """The summary's lines: each confirmed configuration's mean and interval, then whether the
    top two are separable."""
    order = ranked(spreads, mode)
    pct = f"{LEVEL:.0%}"
    lines = [
        f"  {s.trial}: {metric} {s.mean:.4f} +- {s.high - s.mean:.4f} ({pct} CI "
        f"[{s.low:.4f}, {s.high:.4f}], std {s.std:.4f}, {s.n} seeds)"
        for s in order
    ]
    if len(order) >= 2:
        a, b = order[0], order[1]
        sep = separation(a, b, mode)
        interval = f"[{sep.low:+.4f}, {sep.high:+.4f}]"
        if sep.separable:
            lines.append(
                f"  {a.trial} beats {b.trial} by {sep.lead:+.4f} ({pct} CI {interval}): separable"
            )
        else:
            lines.append(
                f"  {a.trial} and {b.trial} are NOT separable: lead {sep.lead:+.4f}, {pct} CI "
                f"{interval} includes 0; the seed noise is as large as the difference"
            )
    return "\n".join(lines)
