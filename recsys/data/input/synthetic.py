"""Synthetic click logs in the Criteo schema, with a planted signal, generated per row range.

Labels are drawn from a known logistic model: ``logit = b + sum_k w_k z_k + sum_f u_f[id_f]``
over half of the dense features (``z_k``: standardised ``log(1 + x_k)``) and half of the sparse
features (``u_f``: a random effect per id). The bias ``b`` is solved so that the positive rate is
``positive_rate`` (Criteo: about 25%). Ids follow a power law (``p_k ~ (k + 1)^-zipf_alpha``,
shuffled over the table), dense values are log-normal counts (``>= 0``) with 10% missing, except
feature 1, which also takes values down to -3 (Criteo's ``I2`` is its one feature with negative
values). With ``num_dense=0`` the rows have no dense features (``dense_raw [N, 0]``) and the
planted logit is the sparse effects alone.

Rows are generated in blocks of ``BLOCK`` rows, block ``k`` from its own seed ``(seed, k)``; the
model's parameters (weights, id effects, bias, standardisation) come from ``seed`` alone. So any
row range can be generated on its own and equals the same rows of the whole data set: a worker
generates only its rows (``SyntheticRows.read``). A model that learns clearly beats 0.5 AUC (the
true ``logits`` give the ceiling); a bug that breaks learning shows as AUC near 0.5.
``signal=0`` gives pure-noise labels.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

import numpy as np

from recsys.config import SyntheticConfig
from recsys.data.columns import Columns, RowSource
from recsys.data.dense import log1p_counts

MISSING_RATE = 0.1
BLOCK = 16_384
PILOT_ROWS = 20_000  # rows that fix the standardisation and the bias


def transform_dense(raw: np.ndarray) -> np.ndarray:
    """``log(1 + max(x, 0))`` as float32 (the schema's ``log1p``); callers map missing to 0."""
    return log1p_counts(raw).astype(np.float32)


def write_tsv(
    path: str,
    labels: np.ndarray,
    dense_raw: np.ndarray,
    sparse_ids: np.ndarray,
    *,
    compress: bool = False,
) -> None:
    """Write rows in the Criteo format (``schemas/criteo_kaggle.yaml``): tab-separated, no
    header, label, counts, 8-digit hex ids.

    Args:
        labels: ``[N]`` in {0, 1}.
        dense_raw: ``[N, I]`` float, NaN where missing (written as an empty field).
        sparse_ids: ``[N, F]`` ints in ``[0, 2**32)`` written as 8 hex digits; negative = missing.
    """
    opener = gzip.open if compress else open
    with opener(path, "wt", encoding="ascii") as f:  # type: ignore[operator]
        for y, d, s in zip(labels, dense_raw, sparse_ids, strict=True):
            dense = ["" if np.isnan(x) else str(int(x)) for x in d]
            cats = ["" if x < 0 else f"{int(x):08x}" for x in s]
            f.write("\t".join([str(int(y)), *dense, *cats]) + "\n")


@dataclass(frozen=True)
class SyntheticData:
    """Raw generated rows: ``dense_raw [N, I]`` (NaN = missing), ``sparse [N, F, H]`` ids,
    ``labels [N]`` and the true ``logits [N]``."""

    dense_raw: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    logits: np.ndarray

    def columns(self) -> Columns:
        dense = transform_dense(np.nan_to_num(self.dense_raw, nan=0.0))
        labels = self.labels.astype(np.float32).reshape(-1, 1)
        return Columns(dense, self.sparse, labels, source="synthetic")

    def write_tsv(self, path: str, compress: bool = False) -> None:
        """Write as a Criteo TSV (one-hot only: the format has one id per field)."""
        if self.sparse.shape[2] != 1:
            raise ValueError("the Criteo format holds one id per field; use multi_hot=1")
        write_tsv(path, self.labels, self.dense_raw, self.sparse[:, :, 0], compress=compress)


def _power_law_ids(
    rng: np.random.Generator, cdf: np.ndarray, perm: np.ndarray, size: tuple[int, ...]
) -> np.ndarray:
    ranks = np.searchsorted(cdf, rng.random(size) * cdf[-1])
    return perm[np.minimum(ranks, len(perm) - 1)]


def _solve_bias(z: np.ndarray, rate: float) -> float:
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(z + mid)))) < rate else (lo, mid)
    return (lo + hi) / 2


class Generator:
    """The synthetic data set of ``cfg`` with ``num_dense`` dense and ``len(table_rows)`` sparse
    features (feature ``f`` has ids in ``[0, table_rows[f])``); ``raw(start, stop)`` generates rows
    ``[start, stop)``. Same seed, same rows."""

    def __init__(self, cfg: SyntheticConfig, num_dense: int, table_rows: list[int]) -> None:
        self.cfg, self.num_dense, self.table_rows = cfg, num_dense, table_rows
        rng = np.random.default_rng([cfg.seed, 0])
        self.mu = rng.uniform(0.5, 3.0, num_dense)
        self.informative_dense = max(1, num_dense // 2) if num_dense else 0
        self.informative_sparse = max(1, len(table_rows) // 2)
        scale = cfg.signal / np.sqrt(self.informative_dense + self.informative_sparse)
        self.w = rng.normal(0, 1, self.informative_dense) * scale
        self.effects = [rng.normal(0, scale, table_rows[f]) for f in range(self.informative_sparse)]
        self.perms = [rng.permutation(r) for r in table_rows]
        ranks = [np.arange(1, r + 1, dtype=np.float64) for r in table_rows]
        self.cdfs = [np.cumsum(r**-cfg.zipf_alpha) for r in ranks]
        pilot_dense, pilot_sparse = self._features(np.random.default_rng([cfg.seed, 1]), PILOT_ROWS)
        z = self._z_raw(pilot_dense)
        self.z_mean, self.z_std = z.mean(0), z.std(0) + 1e-6
        self.bias = _solve_bias(self._logit(pilot_dense, pilot_sparse), cfg.positive_rate)

    def _features(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        dense = np.floor(np.exp(rng.normal(self.mu, 1.0, (n, self.num_dense))))
        if self.num_dense:
            dense[:, 1 % self.num_dense] -= 3  # like Criteo's I2: negative down to -3
        dense[rng.random((n, self.num_dense)) < MISSING_RATE] = np.nan
        h = self.cfg.multi_hot
        tables = zip(self.cdfs, self.perms, strict=True)
        sparse = np.stack([_power_law_ids(rng, c, p, (n, h)) for c, p in tables], axis=1)  # [N,F,H]
        return dense, sparse.astype(np.int64)

    def _z_raw(self, dense: np.ndarray) -> np.ndarray:
        return log1p_counts(np.nan_to_num(dense[:, : self.informative_dense], nan=0.0))

    def _logit(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        """The planted logit without the bias."""
        logit = ((self._z_raw(dense) - self.z_mean) / self.z_std) @ self.w
        for f, effect in enumerate(self.effects):
            logit += effect[sparse[:, f, :]].mean(axis=1)
        return logit

    def _block(self, k: int) -> SyntheticData:
        n = min(BLOCK, self.cfg.num_samples - k * BLOCK)
        rng = np.random.default_rng([self.cfg.seed, 2, k])
        dense, sparse = self._features(rng, n)
        logit = self._logit(dense, sparse) + self.bias
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        return SyntheticData(dense, sparse, labels, logit)

    def raw(self, start: int = 0, stop: int | None = None) -> SyntheticData:
        """Rows ``[start, stop)`` (default: all) with their true logits."""
        stop = self.cfg.num_samples if stop is None else stop
        if not 0 <= start <= stop <= self.cfg.num_samples:
            raise IndexError(
                f"synthetic rows [{start}, {stop}) outside [0, {self.cfg.num_samples})"
            )
        first, last = start // BLOCK, max(start, stop - 1) // BLOCK
        blocks = [self._block(k) for k in range(first, last + 1)]
        cut = slice(start - first * BLOCK, stop - first * BLOCK)

        def joined(name: str) -> np.ndarray:
            return np.concatenate([getattr(b, name) for b in blocks])[cut]

        return SyntheticData(
            joined("dense_raw"), joined("sparse"), joined("labels"), joined("logits")
        )


class SyntheticRows(RowSource):
    """The synthetic data set as a ``RowSource``: rows are generated when read."""

    generated = True

    def __init__(self, cfg: SyntheticConfig, num_dense: int, table_rows: list[int]) -> None:
        self.generator = Generator(cfg, num_dense, table_rows)
        self.n = cfg.num_samples
        self.source = "synthetic"

    def __len__(self) -> int:
        return self.n

    def read(self, start: int, stop: int) -> Columns:
        return self.generator.raw(start, min(stop, self.n)).columns()


def generate(cfg: SyntheticConfig, num_dense: int, table_rows: list[int]) -> SyntheticData:
    """All ``cfg.num_samples`` rows at once (tests, TSV files for the readers)."""
    return Generator(cfg, num_dense, table_rows).raw()
