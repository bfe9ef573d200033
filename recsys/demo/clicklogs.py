"""A demo click log that looks like a real one, written as Parquet (``recsys-synth``).

    recsys-synth --out data/clicklogs_raw --rows 200000 --files 4
    recsys-preprocess --schema schemas/clicklogs.yaml data/clicklogs_raw --out data/clicklogs

Columns (``schemas/clicklogs.yaml`` describes them):

- ``user_id``, ``item_id``: string ids (``u123``, ``i45``) with Zipf-distributed frequencies;
  ``country``: one of 40 codes, also Zipf;
- ``history``: the items the user clicked before, a list of 0 to 120 item ids from
  ``item_id``'s id space (the same ``i45`` strings: a shared table fits one vocabulary over
  both; geometric lengths, mean about 20; longer than the schema's ``max_len`` now and then);
  ``history_weights``: each history item's recency weight (``0.9 ** k`` for the ``k``-th most
  recent; the list starts with the most recent), for a weighted sum of the history's embeddings;
  ``history_ts``: each history item's time (epoch seconds, float64), before the row's
  ``event_ts`` by gaps of about an hour, so sorted by it the list runs oldest first (a schema
  can read the history as a sequence ordered by it: ``sequence: {order_by: history_ts}``;
  ``schemas/clicklogs.yaml`` reads the history as a weighted list and leaves it out);
  ``tags``: 1 to 5 of 300 tag strings of the item;
- ``price`` (log-normal, 5% null), ``age`` (integer, 5% null);
- ``click`` and ``like``: two labels from a planted logistic model. ``click`` depends on user,
  item and country effects, the history's recency-weighted affinity with the item, the price,
  the local hour
  (Europe/Berlin: evenings click more), the weekend and the item's freshness (items published
  less than a week before the event); ``like`` mostly follows a click (its logit adds 2.5 for a
  click) plus its own item and tag effects. So the two tasks are correlated, and a model that
  learns beats 0.5 AUC on both;
- ``event_ts``: a timestamp (UTC), increasing over 14 days across the rows (and the files);
  ``published_ts``: when the item was published (a timestamp up to about a year before
  2026-01-01; 2% null), so ``event_ts - published_ts`` is the item's age.

Rows come in blocks generated from ``(seed, block)``; the same seed gives the same rows, however
many files hold them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

BLOCK = 1 << 16
START = np.datetime64("2026-01-01T00:00:00", "s")
DAYS = 14
ZONE = "Europe/Berlin"  # the users' local time (the hour effect)


@dataclass(frozen=True)
class Shape:
    """Sizes of the demo data set."""

    users: int = 20_000
    items: int = 5_000
    countries: int = 40
    tags: int = 300
    mean_history: float = 20.0
    max_history: int = 120
    zipf: float = 1.05


def _zipf(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1]), len(cdf) - 1)


def _sum_over_lists(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    total = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.cumsum(lengths)
    return np.asarray(total[ends] - total[ends - lengths])


def _mean_over_lists(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return _sum_over_lists(values, lengths) / np.maximum(lengths, 1)


def times_before(event: np.ndarray, lengths: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Each list item's time (epoch seconds, float64 ``[nnz]``), newest first: the ``k``-th item
    of row ``n``'s list is ``k + 1`` of its ``gaps`` before ``event[n]`` (seconds ``[n]``)."""
    total = np.cumsum(gaps)
    before = np.concatenate([[0.0], total])[np.cumsum(lengths) - lengths]
    return np.repeat(event.astype(np.float64), lengths) - (total - np.repeat(before, lengths))


def recency_weights(lengths: np.ndarray) -> np.ndarray:
    """``0.9 ** k`` for the ``k``-th id of each list (``k = 0``: the most recent), float32."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.asarray(0.9 ** (np.arange(int(lengths.sum())) - starts), np.float32)


def _float_lists(
    values: np.ndarray, lengths: np.ndarray, tp: pa.DataType | None = None
) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, tp or pa.float32()))


class ClickLogs:
    """The generator of ``rows`` rows with ``seed``; ``block(k)`` makes rows of block ``k``."""

    def __init__(self, rows: int, seed: int = 0, shape: Shape = Shape()) -> None:
        self.rows, self.seed, self.shape = rows, seed, shape
        rng = np.random.default_rng([seed, 0])
        s = shape
        self.cdf = {k: np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -s.zipf)
                    for k, n in (("user", s.users), ("item", s.items), ("country", s.countries),
                                 ("tag", s.tags))}  # fmt: skip
        self.user_eff = rng.normal(0, 0.6, s.users)
        self.item_eff = rng.normal(0, 0.6, s.items)
        self.country_eff = rng.normal(0, 0.3, s.countries)
        self.item_group = rng.integers(0, 16, s.items)  # items of a group attract each other
        self.user_group = rng.integers(0, 16, s.users)
        self.item_like = rng.normal(0, 0.8, s.items)
        self.tag_like = rng.normal(0, 0.5, s.tags)
        self.item_tags = [rng.choice(s.tags, rng.integers(1, 6), replace=False)
                          for _ in range(s.items)]  # fmt: skip
        published_days = np.minimum(rng.exponential(90.0, s.items), 400.0)  # before START
        self.published = START - (published_days * 86400).astype("timedelta64[s]")
        dictionary = {"user": "u", "item": "i", "country": "c", "tag": "t"}
        self.names = {k: pa.array([f"{p}{i}" for i in range(len(self.cdf[k]))])
                      for k, p in dictionary.items()}  # fmt: skip

    def block(self, k: int) -> pa.Table:
        s = self.shape
        n = min(BLOCK, self.rows - k * BLOCK)
        rng = np.random.default_rng([self.seed, 1, k])
        user = _zipf(rng, self.cdf["user"], n)
        item = _zipf(rng, self.cdf["item"], n)
        country = _zipf(rng, self.cdf["country"], n)
        lengths = np.minimum(rng.geometric(1 / s.mean_history, n) - 1, s.max_history)
        # a history mixes the user's group's items with popular ones
        popular = _zipf(rng, self.cdf["item"], int(lengths.sum()))
        same = rng.random(len(popular)) < 0.5
        group_items = np.repeat(self.user_group[user], lengths) * (s.items // 16) + rng.integers(
            0, s.items // 16, len(popular)
        )
        history = np.where(same, np.minimum(group_items, s.items - 1), popular)
        weights = recency_weights(lengths)
        same_group = self.item_group[history] == np.repeat(self.item_group[item], lengths)
        affinity = _sum_over_lists(weights * same_group, lengths) / np.maximum(
            _sum_over_lists(weights, lengths), 1e-9
        )  # the recency-weighted share of the history in the item's group
        price = np.exp(rng.normal(3.0, 1.0, n))
        age = rng.integers(18, 80, n).astype(np.float64)
        when = np.random.default_rng([self.seed, 2, k])  # its own stream: the rest unchanged
        seconds = (k * BLOCK + np.sort(when.random(n)) * n) * (DAYS * 86400 / max(self.rows, 1))
        event = START + seconds.astype("timedelta64[s]")
        logit = (-1.4 + self.user_eff[user] + self.item_eff[item] + self.country_eff[country]
                 + 2.0 * affinity - 0.25 * (np.log1p(price) - 3.0)
                 + 0.01 * (age - 45) + self._time_effect(event, item))  # fmt: skip
        click = rng.random(n) < 1 / (1 + np.exp(-logit))
        tag_lists = [self.item_tags[i] for i in item]
        tag_len = np.array([len(t) for t in tag_lists])
        tags = np.concatenate(tag_lists)
        like_logit = (
            -3.0
            + 2.5 * click
            + self.item_like[item]
            + _mean_over_lists(self.tag_like[tags], tag_len)
        )
        like = rng.random(n) < 1 / (1 + np.exp(-like_logit))
        price[rng.random(n) < 0.05] = np.nan
        age_arr = pa.array(age.astype(np.int64), mask=rng.random(n) < 0.05)
        published = pa.array(self.published[item], pa.timestamp("s"), mask=when.random(n) < 0.02)
        gaps = np.random.default_rng([self.seed, 3, k]).exponential(3600.0, len(history))
        seen = times_before(event.astype(np.int64), lengths, gaps)
        return pa.table({
            "user_id": self._dict("user", user),
            "item_id": self._dict("item", item),
            "country": self._dict("country", country),
            "history": self._lists("item", history, lengths),
            "history_weights": _float_lists(weights, lengths),
            "history_ts": _float_lists(seen, lengths, pa.float64()),
            "tags": self._lists("tag", tags, tag_len),
            "price": pa.array(price, from_pandas=True),
            "age": age_arr,
            "click": pa.array(click.astype(np.int8)),
            "like": pa.array(like.astype(np.int8)),
            "event_ts": pa.array(event, pa.timestamp("s")),
            "published_ts": published,
        })  # fmt: skip

    def _time_effect(self, event: np.ndarray, item: np.ndarray) -> np.ndarray:
        """The click logit's time terms: the local hour (a peak at 20:00), the weekend, and
        the item's freshness (published less than 7 days before the event)."""
        import pandas as pd

        local = pd.DatetimeIndex(event).tz_localize("UTC").tz_convert(ZONE)
        hour = np.asarray(local.hour, np.float64)
        weekend = np.asarray(local.day_of_week, np.int64) >= 5
        fresh = (event - self.published[item]) < np.timedelta64(7 * 86400, "s")
        return 0.5 * np.cos(2 * np.pi * (hour - 20) / 24) + 0.3 * weekend + 0.6 * fresh

    def _dict(self, kind: str, idx: np.ndarray) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), self.names[kind])

    def _lists(self, kind: str, idx: np.ndarray, lengths: np.ndarray) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), self._dict(kind, idx))

    def blocks(self) -> int:
        return -(-self.rows // BLOCK)


def write(out: str, rows: int, files: int = 4, seed: int = 0, shape: Shape = Shape()) -> list[str]:
    """Write ``rows`` rows as ``files`` Parquet files ``part-00000.parquet`` ... in time order,
    of as many rows each as can be (the rows are the same however many files hold them)."""
    import pyarrow.parquet as pq

    if rows < 1 or files < 1:
        raise ValueError(f"--rows {rows} and --files {files} must be >= 1")
    if files > rows:
        raise ValueError(f"--files {files}: more files than --rows {rows}")
    gen = ClickLogs(rows, seed, shape)
    os.makedirs(out, exist_ok=True)
    bounds = [f * rows // files for f in range(files + 1)]
    paths: list[str] = []
    cached: tuple[int, Any] = (-1, None)
    for f in range(files):
        path = os.path.join(out, f"part-{f:05d}.parquet")
        tmp = path + ".tmp"
        writer = None
        start, end = bounds[f], bounds[f + 1]
        for k in range(start // BLOCK, -(-end // BLOCK)):
            if cached[0] != k:  # (a block that spans two files is made once)
                cached = (k, gen.block(k))
            table = cached[1]
            lo, hi = max(start - k * BLOCK, 0), min(end - k * BLOCK, table.num_rows)
            piece = table.slice(lo, hi - lo)
            writer = writer or pq.ParquetWriter(tmp, piece.schema)
            writer.write_table(piece)
        assert writer is not None  # (each file holds at least one row: files <= rows)
        writer.close()
        os.replace(tmp, path)
        paths.append(path)
    return paths
