"""Synthetic click logs in the Criteo schema, with a planted signal.

Labels are drawn from a known logistic model: ``logit = b + sum_k w_k z_k + sum_f u_f[id_f]``
over half of the dense features (``z_k``: standardised ``log(1 + x_k)``) and half of the sparse
features (``u_f``: a random effect per id). The bias ``b`` is solved so that the positive rate is
``positive_rate`` (Criteo: about 25%). Ids follow a power law (``p_k ~ (k + 1)^-zipf_alpha``,
shuffled over the table), dense values are log-normal counts with 10% missing.

A model that learns clearly beats 0.5 AUC (the true ``logits`` give the ceiling); a bug that breaks
learning shows as AUC near 0.5. ``signal=0`` gives pure-noise labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys.config import SyntheticConfig
from recsys.data.columns import Columns
from recsys.data.criteo import transform_dense, write_tsv

MISSING_RATE = 0.1


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
    rng: np.random.Generator, rows: int, size: tuple[int, ...], alpha: float
) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -alpha)
    ranks = np.searchsorted(cdf, rng.random(size) * cdf[-1])
    return rng.permutation(rows)[np.minimum(ranks, rows - 1)]


def _solve_bias(z: np.ndarray, rate: float) -> float:
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(z + mid)))) < rate else (lo, mid)
    return (lo + hi) / 2


def generate(cfg: SyntheticConfig, num_dense: int, table_rows: list[int]) -> SyntheticData:
    """Generate ``cfg.num_samples`` rows with ``num_dense`` dense and ``len(table_rows)`` sparse
    features; feature ``f`` has ids in ``[0, table_rows[f])``. Same seed, same rows."""
    rng = np.random.default_rng(cfg.seed)
    n, h = cfg.num_samples, cfg.multi_hot
    mu = rng.uniform(0.5, 3.0, num_dense)
    dense = np.floor(np.exp(rng.normal(mu, 1.0, (n, num_dense)))) - 1
    dense[rng.random((n, num_dense)) < MISSING_RATE] = np.nan
    sparse = np.stack(
        [_power_law_ids(rng, r, (n, h), cfg.zipf_alpha) for r in table_rows], axis=1
    )  # [N, F, H]

    informative_dense = max(1, num_dense // 2)
    informative_sparse = max(1, len(table_rows) // 2)
    scale = cfg.signal / np.sqrt(informative_dense + informative_sparse)
    z = np.log1p(np.nan_to_num(dense[:, :informative_dense], nan=0.0).clip(min=0))
    z = (z - z.mean(0)) / (z.std(0) + 1e-6)
    logit = z @ (rng.normal(0, 1, informative_dense) * scale)
    for f in range(informative_sparse):
        effect = rng.normal(0, scale, table_rows[f])
        logit += effect[sparse[:, f, :]].mean(axis=1)
    logit += _solve_bias(logit, cfg.positive_rate)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return SyntheticData(dense, sparse.astype(np.int64), labels, logit)
