"""The dense transforms, written once: what preparation applies to a dense column
(``recsys.prepare.encode``), what the generated rows and TorchRec's Criteo days are read as
(``recsys.data.input.synthetic``, ``recsys.data.prepared.torchrec_npy``), and so what a served
model gets."""

from __future__ import annotations

import numpy as np


def log1p_counts(x: np.ndarray) -> np.ndarray:
    """``log(1 + max(x, 0))``: the schema's ``log1p`` of a count (negative counts are 0)."""
    return np.log1p(np.maximum(x, 0))
