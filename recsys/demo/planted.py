"""A click log of categorical fields only, whose true click probability is known (planted).

    python -m recsys.cli.planted --out data/planted_raw          # log.parquet + schema.yaml
    recsys-preprocess --schema data/planted_raw/schema.yaml data/planted_raw --out data/planted

It measures models rather than the pipeline: every row carries ``p_click``, the probability its
``click`` was drawn with, so the Bayes-optimal (oracle) AUC of any set of rows is the AUC of
``p_click`` against ``click`` (``oracle_auc``). ``p_click`` is not a feature: the schema
(``schema_dict``) lists the id columns and the label only.

Columns (all categorical; ids are strings or integers as real logs have them):

- ``user`` (``u0`` ..) and ``item`` (integers) with Zipf frequencies: a few thousand each, many
  seen only a few times in training, so a model that memorises rare ids overfits;
- ``category`` (of the item: the same item always has the same one), ``country``, ``hour``,
  ``device``: few values each.

The planted logit is main effects plus **pairwise interactions**::

    logit = b + user[u] + item[i] + country[c] + hour[h] + device[d]
            + taste[group(u), category(i)]      # users of a latent group like some categories
            + screen[device, category]          # some categories work on some devices
            + daypart[hour, country]            # local time of day
            + <p_u, q_i> / sqrt(k)              # a weak rank-k user-item affinity

so a linear model (LR) learns the main effects only, a factorization machine or a DLRM also the
pairs. The latent group of a user is not a column: it is learnt through the user's id, from the
rows of that user. The bias ``b`` is set so that about ``positive_rate`` of rows click.

With ``Shape(tasks=2)`` every row also has a second label, ``like``, drawn with its own known
``p_like`` from a logit that shares some of the click's terms and conflicts on others::

    like_logit = b' + user[u] + item[i] + country[c] + hour[h] + device[d]   # shared
                 + screen[device, category]                                # shared
                 - taste[segment(u), category(i)]                          # conflicting
                 + quality[i]                                              # its own

(what a segment clicks most it likes least: a model of both tasks has to keep ``taste`` apart
for each), the playground of multi-task experts (MMoE, PLE) against a shared bottom. The click
columns are the same as the one-task log's of the same seed.

Rows are in time order (``split.by: order``: the last ``test_fraction`` of the rows are the test
split); the same seed gives the same file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

FILE = "log.parquet"
SCHEMA_FILE = "schema.yaml"
FIELDS = ("user", "item", "category", "segment", "country", "hour", "device")
TRUTH = "p_click"
TRUTHS = {"click": TRUTH, "like": "p_like"}  # each label's true probability (tasks=2: both)


@dataclass(frozen=True)
class Shape:
    """Sizes and strengths of the planted log.

    Attributes:
        users / items: ids of each (Zipf frequencies with exponent ``zipf``).
        categories / countries / devices / hours: values of the small fields.
        groups: latent user groups of ``taste``; rank: ``k`` of the user-item affinity.
        main / pairs / affinity: standard deviations of the main effects, of the pairwise
            terms (``taste``; ``screen`` and ``daypart`` are 0.8 and 0.5 of it) and of the
            user-item affinity.
        positive_rate: the share of clicks the bias aims at.
        tasks: 1 (``click``) or 2 (``click`` and ``like``, module docstring).
        quality / like_rate: with 2 tasks, the standard deviation of the items' own ``quality``
            (the like's alone) and the share of likes its bias aims at.
    """

    users: int = 3000
    items: int = 2000
    categories: int = 20
    segments: int = 8
    countries: int = 30
    devices: int = 5
    hours: int = 24
    groups: int = 8
    rank: int = 4
    zipf: float = 1.0
    main: float = 0.3
    pairs: float = 1.0
    latent: float = 0.5
    affinity: float = 0.2
    positive_rate: float = 0.3
    tasks: int = 1
    quality: float = 0.8
    like_rate: float = 0.2

    def __post_init__(self) -> None:
        if self.tasks not in (1, 2):
            raise ValueError(f"tasks={self.tasks!r}: 1 (click) or 2 (click and like)")


def _zipf_ids(rng: np.random.Generator, order: np.ndarray, size: int, alpha: float) -> np.ndarray:
    """``size`` ids: ``order[k]`` with probability ~ ``(k + 1) ** -alpha`` (``order``: the ids by
    popularity, part of the model)."""
    p = np.arange(1, len(order) + 1, dtype=np.float64) ** -alpha
    return order[rng.choice(len(order), size=size, p=p / p.sum())]


class Planted:
    """The planted model of ``seed`` (its tables of effects), and rows drawn from it."""

    def __init__(self, seed: int = 0, shape: Shape = Shape()) -> None:
        self.seed, self.shape = seed, shape
        s, rng = shape, np.random.default_rng([seed, 0])
        self.user = rng.normal(0, s.main, s.users)
        self.item = rng.normal(0, s.main, s.items)
        self.country = rng.normal(0, 1.5 * s.main, s.countries)
        self.hour = rng.normal(0, s.main / 2, s.hours)
        self.device = rng.normal(0, s.main / 2, s.devices)
        self.category_of = rng.integers(0, s.categories, s.items)
        self.segment_of = rng.integers(0, s.segments, s.users)
        self.group_of = rng.integers(0, s.groups, s.users)
        self.taste = rng.normal(0, s.pairs, (s.segments, s.categories))
        self.screen = rng.normal(0, 0.8 * s.pairs, (s.devices, s.categories))
        self.daypart = rng.normal(0, 0.4 * s.pairs, (s.hours, s.countries))
        self.hidden = rng.normal(0, s.latent, (s.groups, s.categories))
        self.p = rng.normal(0, 1, (s.users, s.rank))
        self.q = rng.normal(0, 1, (s.items, s.rank))
        self.order = {
            f: rng.permutation(n)
            for f, n in (
                ("user", s.users),
                ("item", s.items),
                ("country", s.countries),
                ("device", s.devices),
            )
        }  # by popularity
        # the like's own terms from a stream of their own: the click's are the one-task log's
        self.quality = np.random.default_rng([seed, 3]).normal(0, s.quality, s.items)
        self.bias = self.like_bias = 0.0
        pilot = self.draw(20_000, np.random.default_rng([seed, 1]))
        self.bias = self._solve_bias(pilot["logit"], s.positive_rate)
        if s.tasks == 2:
            self.like_bias = self._solve_bias(pilot["like_logit"], s.like_rate)

    @staticmethod
    def _solve_bias(logit: np.ndarray, rate: float) -> float:
        lo, hi = -10.0, 10.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (1 / (1 + np.exp(-(logit + mid)))).mean() < rate:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def parts(self, r: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The planted logit's terms for rows ``r`` (``draw``'s ids), by name."""
        s, u, i, c, h, d = self.shape, r["user"], r["item"], r["country"], r["hour"], r["device"]
        cat = self.category_of[i]
        return {
            "main": self.user[u] + self.item[i] + self.country[c] + self.hour[h] + self.device[d],
            "taste": self.taste[self.segment_of[u], cat],
            "screen": self.screen[d, cat],
            "daypart": self.daypart[h, c],
            "hidden": self.hidden[self.group_of[u], cat],
            "affinity": (self.p[u] * self.q[i]).sum(1) * s.affinity / np.sqrt(s.rank),
        }

    def like_parts(self, r: dict[str, np.ndarray], parts: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:  # fmt: skip
        """The like's logit terms for rows ``r`` given the click's ``parts``: shared, conflicting
        (``taste`` with the opposite sign) and its own (``quality``)."""
        return {
            "main": parts["main"],
            "screen": parts["screen"],
            "taste": -parts["taste"],
            "quality": self.quality[r["item"]],
        }

    def draw(self, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``rows`` rows: each field's ids, the planted ``logit``, ``p_click`` and ``click``
        (and with 2 tasks ``like_logit``, ``p_like`` and ``like``, drawn after the clicks)."""
        s = self.shape
        r = {
            "user": _zipf_ids(rng, self.order["user"], rows, s.zipf),
            "item": _zipf_ids(rng, self.order["item"], rows, s.zipf),
            "country": _zipf_ids(rng, self.order["country"], rows, 1.0),
            "hour": rng.integers(0, s.hours, rows),
            "device": _zipf_ids(rng, self.order["device"], rows, 1.0),
        }
        r["category"] = self.category_of[r["item"]]
        r["segment"] = self.segment_of[r["user"]]
        parts = self.parts(r)
        r["logit"] = self.bias + np.sum(list(parts.values()), axis=0)
        r[TRUTH] = 1 / (1 + np.exp(-r["logit"]))
        r["click"] = (rng.random(rows) < r[TRUTH]).astype(np.int8)
        if s.tasks == 2:
            r["like_logit"] = self.like_bias + np.sum(list(self.like_parts(r, parts).values()), 0)
            r[TRUTHS["like"]] = 1 / (1 + np.exp(-r["like_logit"]))
            r["like"] = (rng.random(rows) < r[TRUTHS["like"]]).astype(np.int8)
        return r

    @property
    def labels(self) -> list[str]:
        """The log's labels: ``click`` (and ``like`` with 2 tasks)."""
        return list(TRUTHS)[: self.shape.tasks]

    def table(self, rows: int) -> Any:
        """``rows`` rows as an Arrow table: the id columns (``user`` as ``u<k>`` strings, the
        others integers), each label and its true probability (``click``, ``p_click``, then
        ``like``, ``p_like`` with 2 tasks)."""
        import pyarrow as pa

        r = self.draw(rows, np.random.default_rng([self.seed, 2]))
        names = np.array([f"u{k}" for k in range(self.shape.users)], dtype=object)
        columns = {f: pa.array(r[f].astype(np.int64)) for f in FIELDS}
        columns["user"] = pa.array(names[r["user"]])
        columns["item"] = pa.array(r["item"].astype(np.int64) + 100_000)
        for label in self.labels:
            columns[label], columns[TRUTHS[label]] = pa.array(r[label]), pa.array(r[TRUTHS[label]])
        return pa.table(columns)


def schema_dict(
    val_fraction: float = 0.1, test_fraction: float = 0.1, tasks: int = 1
) -> dict[str, Any]:
    """The log's schema (``recsys.data.schema``): the id fields, its labels (``click``, and
    ``like`` with 2 tasks), no numeric column, split in row order (so the test rows are the
    file's last rows)."""
    return {
        "format": "parquet",
        "labels": list(TRUTHS)[:tasks],
        "split": {"by": "order", "val_fraction": val_fraction, "test_fraction": test_fraction},
        "dense": {},
        "sparse": {f: {} for f in FIELDS},
    }


def write(
    out: str, rows: int = 75_000, seed: int = 0, shape: Shape = Shape(),
    val_fraction: float = 0.1, test_fraction: float = 0.1,
) -> str:  # fmt: skip
    """Write ``rows`` rows to ``out/log.parquet`` and the schema to ``out/schema.yaml``;
    returns the Parquet file's path."""
    import pyarrow.parquet as pq
    import yaml

    if rows < 10:
        raise ValueError(f"rows={rows}: at least 10")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, FILE)
    pq.write_table(Planted(seed, shape).table(rows), path)
    with open(os.path.join(out, SCHEMA_FILE), "w") as f:
        yaml.safe_dump(schema_dict(val_fraction, test_fraction, shape.tasks), f, sort_keys=False)
    return path


def test_rows(path: str, meta: dict[str, Any]) -> Any:
    """The raw rows of ``path`` that a preparation (``meta``: its ``meta.json``) made the test
    split: ``split.by: order`` puts the rows from ``row_bounds[1]`` on there. A DataFrame."""
    import pyarrow.parquet as pq

    bounds = (meta.get("split") or {}).get("row_bounds")
    if not bounds:
        raise ValueError("the preparation did not split by order (meta.json split.row_bounds)")
    return pq.read_table(path).slice(bounds[1]).to_pandas()


def oracle_auc(frame: Any, label: str = "click") -> float:
    """The Bayes-optimal AUC of these rows for ``label``: its true probability (``p_click``,
    ``p_like``) against it."""
    from recsys.metrics.binary import auc

    truth = np.asarray(frame[TRUTHS[label]], np.float64)
    return auc(np.asarray(frame[label], np.float64), truth)
