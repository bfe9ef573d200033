"""A click log over periods whose tastes drift, with its true click probability known: what a
recommender's log looks like when it never ends (new items appear, old ones fade, users' tastes
move, a user's history is what they clicked before), for the quality benchmark's time-split part
and the time walk (train on one period, serve the next).

Each period (``Shape.days`` days) brings ``items_per_period`` new items, each of a category and a
quality, alive for ``lifetime`` periods and fading with age. A user has a taste for each category,
which moves by ``drift`` (a random walk) from one period to the next. Every event is a user
(Zipf-active) shown an alive item (newer items more often), at a time of its period; the planted
logit::

    logit = b + bias[user] + taste[period, user, cat(i)] + quality[i] - fade * age(i)
            + recent * mean_{j in the user's last clicks} affinity[cat(j), cat(i)]
            + hour[hour(t), cat(i)]

``affinity`` is a category x category matrix, mostly its diagonal (users go on in a category).
``history`` holds the user's ``history`` latest clicked items before the event, newest first,
``history_ts`` their times (epoch seconds). Rows are in time order; the same seed gives the same
rows, period after period (``table(..., periods=range(p, q))`` continues the same world).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

START = 1_700_000_000  # the first period's first second (2023-11-14 UTC)
DAY = 86_400


@dataclass(frozen=True)
class Shape:
    users: int = 3000
    categories: int = 24
    items_per_period: int = 400
    lifetime: int = 3  # periods an item is shown in
    rows_per_period: int = 40_000
    days: int = 14  # a period's length
    history: int = 10  # clicked items a row's history holds (the schema's sequence.max_len)
    drift: float = 0.5  # the std of a taste's move from one period to the next
    fade: float = 0.4  # an item's appeal lost per period of its age
    recent: float = 1.0  # the history term's scale
    zipf: float = 0.9  # users' activity
    taste: float = 0.7  # the std of a user's first tastes
    user_bias: float = 0.6  # the std of a user's own click rate (its logit)
    quality: float = 0.9  # the std of an item's appeal


@dataclass
class World:
    """The fixed draws of a seed: categories, qualities and births of the items, the tastes of
    every period, the affinity and hour effects."""

    shape: Shape
    category: np.ndarray  # [items]
    quality: np.ndarray  # [items]
    birth: np.ndarray  # [items]: the period an item appears
    taste: np.ndarray  # [periods, users, categories]
    affinity: np.ndarray  # [categories, categories]
    hour: np.ndarray  # [24, categories]
    activity: np.ndarray  # [users]: each user's share of the events
    user_bias: np.ndarray  # [users]


def world(seed: int, shape: Shape, periods: int) -> World:
    """The draws of ``seed`` for ``periods`` periods (a longer world starts the same)."""
    rng = np.random.default_rng([seed, 11])
    s = shape
    items = s.items_per_period * (periods + s.lifetime)
    birth = np.repeat(np.arange(-s.lifetime + 1, periods + 1), s.items_per_period)[:items]
    steps = rng.normal(0.0, s.drift, (periods, s.users, s.categories))
    steps[0] = rng.normal(0.0, s.taste, (s.users, s.categories))
    affinity = 0.8 * np.eye(s.categories) + rng.normal(0.0, 0.2, (s.categories, s.categories))
    activity = 1.0 / np.arange(1, s.users + 1) ** s.zipf
    return World(
        s, rng.integers(0, s.categories, items), rng.normal(0.0, s.quality, items), birth,
        np.cumsum(steps, axis=0), affinity, rng.normal(0.0, 0.3, (24, s.categories)),
        rng.permutation(activity / activity.sum()), rng.normal(0.0, s.user_bias, s.users),
    )  # fmt: skip


def period_events(w: World, p: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Period ``p``'s events (time order): user, item, time, and the logit without the history
    term."""
    s = w.shape
    n = s.rows_per_period
    t = np.sort(rng.uniform(0.0, s.days * DAY, n)) + START + p * s.days * DAY
    user = rng.choice(s.users, n, p=w.activity)
    alive = np.flatnonzero((w.birth <= p) & (p < w.birth + s.lifetime))
    age = p - w.birth[alive]
    shown = np.exp(-0.7 * age)  # newer items are shown more
    item = alive[rng.choice(len(alive), n, p=shown / shown.sum())]
    cat = w.category[item]
    hour = ((t.astype(np.int64) // 3600) % 24).astype(np.int64)
    base = (-1.0 + w.user_bias[user] + w.taste[p, user, cat] + w.quality[item]
            - s.fade * (p - w.birth[item]) + w.hour[hour, cat])  # fmt: skip
    return {"t": t, "user": user, "item": item, "base": base}


def table(seed: int = 0, shape: Shape = Shape(), periods: range = range(3)) -> Any:
    """The events of ``periods`` (each ``shape.rows_per_period`` rows) as a pyarrow table:
    ``ts``, ``user``, ``item``, ``category``, ``history``, ``history_ts``, ``period``, ``click``
    and ``p_click`` (not a feature). The histories run on from the periods before (drawn again,
    identically, from the seed)."""
    import pyarrow as pa

    w = world(seed, shape, periods.stop)
    rng = np.random.default_rng([seed, 13])
    clicked: list[list[tuple[int, float]]] = [[] for _ in range(shape.users)]
    cols: dict[str, list[Any]] = {k: [] for k in ("ts", "user", "item", "hist", "hist_ts",
                                                  "period", "click", "p")}  # fmt: skip
    for p in range(periods.stop):
        ev = period_events(w, p, rng)
        draws = rng.random(len(ev["t"]))
        keep = p >= periods.start
        for k in range(len(ev["t"])):
            u, i, t = int(ev["user"][k]), int(ev["item"][k]), float(ev["t"][k])
            past = clicked[u]
            logit = ev["base"][k]
            if past:
                logit += shape.recent * float(np.mean(
                    w.affinity[w.category[[j for j, _ in past]], w.category[i]]))  # fmt: skip
            prob = 1.0 / (1.0 + np.exp(-logit))
            click = draws[k] < prob
            if keep:
                cols["ts"].append(int(t))
                cols["user"].append(u)
                cols["item"].append(i)
                cols["hist"].append([j for j, _ in reversed(past)])  # newest first
                cols["hist_ts"].append([s for _, s in reversed(past)])
                cols["period"].append(p)
                cols["click"].append(int(click))
                cols["p"].append(prob)
            if click:
                past.append((i, t))
                del past[: -shape.history]
    items = np.asarray(cols["item"], np.int64)
    return pa.table({
        "ts": pa.array(np.asarray(cols["ts"], np.int64)),
        "user": pa.array(np.asarray(cols["user"], np.int64)),
        "item": pa.array(items),
        "category": pa.array(w.category[items].astype(np.int64)),
        "history": pa.array(cols["hist"], pa.list_(pa.int64())),
        "history_ts": pa.array(cols["hist_ts"], pa.list_(pa.float64())),
        "period": pa.array(np.asarray(cols["period"], np.int64)),
        "click": pa.array(np.asarray(cols["click"], np.int8)),
        "p_click": pa.array(np.asarray(cols["p"], np.float64)),
    })  # fmt: skip


def schema_dict(val_fraction: float = 0.15, test_fraction: float = 0.15,
                history: int = Shape.history) -> dict[str, Any]:  # fmt: skip
    """The log's schema: a time split, the user's history a sequence in the item table attended to
    from the item, the hour and weekday of the event (UTC); rows grouped by user for ranking
    (GAUC)."""
    sequence = {"max_len": history, "order_by": "history_ts", "target": "item"}
    return {
        "format": "parquet",
        "labels": ["click"],
        "time": "ts",
        "split": {"val_fraction": val_fraction, "test_fraction": test_fraction},
        "group_by": "user",
        "sparse": {
            "user": {},
            "item": {},
            "category": {},
            "history": {"multi_hot": True, "table": "item", "sequence": sequence},
            "hour": {"derive": "hour", "source": "ts", "time_zone": "UTC"},
            "weekday": {"derive": "weekday", "source": "ts", "time_zone": "UTC"},
        },
    }


def write(out: str, seed: int = 0, shape: Shape = Shape(), periods: range = range(3)) -> str:
    """Write the events of ``periods`` to ``out/log.parquet``; returns its path."""
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "log.parquet")
    pq.write_table(table(seed, shape, periods), path)
    return path


def oracle_auc(test: Any) -> float:
    """The AUC of the rows' true probabilities (``p_click``) against their clicks."""
    from recsys.metrics.binary import auc

    return auc(np.asarray(test["click"], np.float64), np.asarray(test["p_click"], np.float64))
