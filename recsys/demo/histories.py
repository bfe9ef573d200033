"""A click log whose click depends on the user's recent history, with its true click
probability known (planted): the playground of sequence pooling (``sparse.<col>.sequence``).

Columns: ``user`` and ``item`` (Zipf frequencies), ``history`` (the items the user saw before,
0 to ``max_history`` of them, **newest first** as many logs write them) and ``history_ts`` (each
history item's time, epoch seconds, so ``order_by: history_ts`` puts them oldest first),
``click`` and its probability ``p_click`` (not a feature). Every item has a category, which is no
column: a model learns it from the items' ids.

The planted logit::

    logit = b + user[u] + item[i] + sum_{j in the last K items} affinity[cat(j), cat(i)] / sqrt(K)

``affinity`` is a random, full-rank category x category matrix: how much having seen an item of
one category draws a user to a candidate of another. A pooled bag of the history (its sum) is a
``d``-wide summary of it, from which the sum of ``affinity`` against the candidate's category is
a bilinear guess; target attention scores each history item against the candidate. Only the
``K`` most recent items count (the schema keeps ``K``: ``schema_dict``), and the history's list
order is the reverse of its time order.

Rows are in time order (``split.by: order``); the same seed gives the same file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

FILE = "log.parquet"
RECENT = 8  # the history items that count (the schema's sequence.max_len)


@dataclass(frozen=True)
class Shape:
    users: int = 4000
    items: int = 600
    categories: int = 20
    max_history: int = 30
    zipf: float = 0.8
    strength: float = 1.5  # the affinity term's scale


def _zipf(rng: np.random.Generator, n_ids: int, size: int, alpha: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n_ids + 1) ** alpha
    return rng.choice(n_ids, size, p=p / p.sum())


def table(rows: int, seed: int = 0, shape: Shape = Shape()) -> Any:
    """``rows`` rows as a pyarrow table."""
    import pyarrow as pa

    from recsys.demo.clicklogs import START, times_before

    rng = np.random.default_rng([seed, 7])
    category = rng.integers(0, shape.categories, shape.items)
    affinity = rng.normal(0.0, 1.0, (shape.categories, shape.categories))
    user_eff, item_eff = rng.normal(0, 0.3, shape.users), rng.normal(0, 0.5, shape.items)
    user = _zipf(rng, shape.users, rows, shape.zipf)
    item = _zipf(rng, shape.items, rows, shape.zipf)
    lengths = rng.integers(0, shape.max_history + 1, rows)
    seen = _zipf(rng, shape.items, int(lengths.sum()), shape.zipf)  # newest first per row
    rank = np.arange(len(seen)) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # 0: newest
    recent = rank < RECENT
    row = np.repeat(np.arange(rows), lengths)
    term = affinity[category[seen], category[item][row]] * recent
    pull = np.bincount(row, term, minlength=rows) / np.sqrt(RECENT)
    logit = -1.0 + user_eff[user] + item_eff[item] + shape.strength * pull
    p = 1.0 / (1.0 + np.exp(-logit))
    click = rng.random(rows) < p
    event = (START.astype(np.int64) + np.arange(rows) * 60).astype(np.float64)  # one a minute
    gaps = rng.exponential(3600.0, len(seen))
    times = times_before(event, lengths, gaps)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return pa.table({
        "user": pa.array(user.astype(np.int64)),
        "item": pa.array(item.astype(np.int64)),
        "history": pa.ListArray.from_arrays(offsets, pa.array(seen.astype(np.int64))),
        "history_ts": pa.ListArray.from_arrays(offsets, pa.array(times)),
        "click": pa.array(click.astype(np.int8)),
        "p_click": pa.array(p),
    })  # fmt: skip


def schema_dict(val_fraction: float = 0.1, test_fraction: float = 0.1) -> dict[str, Any]:
    """The log's schema: ``history`` a sequence of its ``RECENT`` latest items by time, in the
    item table, attended to from ``item``; split in row order."""
    sequence = {"max_len": RECENT, "order_by": "history_ts", "target": "item"}
    return {
        "format": "parquet",
        "labels": ["click"],
        "split": {"by": "order", "val_fraction": val_fraction, "test_fraction": test_fraction},
        "sparse": {
            "user": {},
            "item": {},
            "history": {"multi_hot": True, "table": "item", "sequence": sequence},
        },
    }


def write(out: str, rows: int = 60_000, seed: int = 0, shape: Shape = Shape()) -> str:
    """Write ``rows`` rows to ``out/log.parquet``; returns its path."""
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, FILE)
    pq.write_table(table(rows, seed, shape), path)
    return path
