"""Parameter accounting of the embedding tables, before and after QR.

Sweeps log these next to AUC, so the memory/accuracy trade of QR and mixed dims is visible. A table
that features share (``EmbeddingConfig.shared``) is counted once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from recsys.config import EmbeddingConfig, QRConfig
from recsys.models.embeddings import table_specs

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class TableStats:
    name: str
    features: tuple[str, ...]  # the KJT keys that read it (several: a shared table)
    rows: int
    dim: int
    params: int
    bytes: int


@dataclass(frozen=True)
class EmbeddingReport:
    """Per-table and total rows/params/bytes; ``*_full`` are the figures without QR."""

    tables: list[TableStats]
    rows: int
    params: int
    bytes: int
    rows_full: int
    params_full: int
    bytes_full: int

    @property
    def compression(self) -> float:
        """``params_full / params`` (1.0 without QR)."""
        return self.params_full / self.params

    def as_metrics(self) -> dict[str, float]:
        return {
            "emb_rows": self.rows,
            "emb_params": self.params,
            "emb_bytes": self.bytes,
            "emb_params_full": self.params_full,
            "emb_bytes_full": self.bytes_full,
            "emb_compression": self.compression,
        }


def table_stats(cfg: EmbeddingConfig) -> list[TableStats]:
    width = BYTES_PER_ELEMENT[cfg.dtype]
    return [
        TableStats(s.name, s.features, s.rows, s.dim, s.rows * s.dim, s.rows * s.dim * width)
        for s in table_specs(cfg)
    ]


def embedding_report(cfg: EmbeddingConfig) -> EmbeddingReport:
    """Rows, parameters and bytes of every table the config builds, and totals without QR."""
    tables = table_stats(cfg)
    full = table_stats(dataclasses.replace(cfg, qr=QRConfig(threshold=None)))
    return EmbeddingReport(
        tables=tables,
        rows=sum(t.rows for t in tables),
        params=sum(t.params for t in tables),
        bytes=sum(t.bytes for t in tables),
        rows_full=sum(t.rows for t in full),
        params_full=sum(t.params for t in full),
        bytes_full=sum(t.bytes for t in full),
    )
