"""The exported model as an MLflow model: scores Criteo-format rows.

Input: a DataFrame with columns ``I1..I13`` (integers, missing allowed) and ``C1..C26`` (8-hex-digit
hashes, empty or missing allowed), as the Criteo files hold them. Output: click probabilities.
The TorchScript model inside is the one ``recsys.export`` wrote; this wrapper only turns rows into
the model's input with what training used, recorded in the export's ``meta.json``: the dense
transform, and the vocabularies when the training data had contiguous ids (copied next to it).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
from typing import Any

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

MODEL_FILE = "model.pt"  # the TorchScript model (written by recsys.export)
META_FILE = "meta.json"  # feature names, table sizes, transforms, the export report

# What the served model imports, pinned to the versions installed here.
SERVING_PACKAGES = ["torch", "torchrec", "numpy", "pandas", "pyyaml", "tensordict", "torchmetrics"]


def pip_requirements() -> list[str]:
    """The served model's pip requirements from the installed packages (their public versions:
    ``2.13.0`` for ``2.13.0+cpu``), with whichever FBGEMM build is installed here:
    ``fbgemm-gpu-cpu`` on a CPU host, ``fbgemm-gpu`` on a CUDA host."""
    reqs = []
    for name in [*SERVING_PACKAGES, "fbgemm-gpu", "fbgemm-gpu-cpu"]:
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            continue
        reqs.append(f"{name}=={version.split('+')[0]}")
    return reqs


def columns(num_dense: int, num_sparse: int) -> tuple[list[str], list[str]]:
    return [f"I{i + 1}" for i in range(num_dense)], [f"C{i + 1}" for i in range(num_sparse)]


def _hash(x: Any) -> int:
    if x is None or (isinstance(x, float) and np.isnan(x)) or x == "":
        return 0
    return int(x, 16) if isinstance(x, str) else int(x)


class CriteoScorer(PythonModel):  # type: ignore[misc]
    """Loads the TorchScript DLRM and scores Criteo rows with the training-time transforms."""

    def load_context(self, context: Any) -> None:
        import fbgemm_gpu  # noqa: F401  (registers FBGEMM's ops)
        import torch
        import torchrec  # noqa: F401  (registers the KeyedJaggedTensor type)

        self.model = torch.jit.load(context.artifacts["model"])
        with open(context.artifacts["meta"]) as f:
            self.meta = json.load(f)
        if self.meta.get("dense_transform", "log1p") != "log1p":
            raise ValueError(f"unknown dense_transform {self.meta['dense_transform']!r}")
        self.vocabs = None
        if self.meta.get("vocab"):
            from recsys.data import vocab

            folder = context.artifacts.get("vocab") or os.path.join(
                os.path.dirname(context.artifacts["meta"]), "vocab"
            )  # names are "vocab/C<k>.npy": relative to the vocab folder's parent
            self.vocabs = vocab.load(os.path.dirname(folder), self.meta["vocab"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> np.ndarray:
        import torch

        from recsys.config import SparseLayout
        from recsys.data import vocab
        from recsys.data.columns import Columns
        from recsys.data.criteo import transform_dense
        from recsys.data.loader import to_batch

        names, rows = self.meta["feature_names"], self.meta["table_rows"]
        dense_cols, sparse_cols = columns(self.meta["num_dense"], len(names))
        missing = [c for c in dense_cols + sparse_cols if c not in model_input.columns]
        if missing:
            raise ValueError(f"input lacks Criteo columns {missing[:5]} (expects I1.., C1..)")
        raw = model_input[dense_cols].apply(pd.to_numeric, errors="raise").fillna(0).to_numpy()
        ids = np.array([[_hash(x) for x in row] for row in model_input[sparse_cols].to_numpy()])
        n = len(model_input)
        ids = ids.reshape(n, len(names)).astype(np.int64)
        if self.vocabs is not None:
            ids = vocab.apply(ids, self.vocabs).astype(np.int64)
        cols = Columns(
            transform_dense(raw.astype(np.float64)),
            ids.reshape(n, len(names), 1),
            np.zeros((n, 1), np.float32),
        )
        batch = to_batch(cols, SparseLayout(names, rows))
        with torch.no_grad():
            logits = self.model(batch.dense_features, batch.sparse_features)[:, 0]
        return torch.sigmoid(logits.float()).numpy()


def example_rows(
    cols: Any, num_dense: int, n: int = 4, vocabs: list[Any] | None = None
) -> pd.DataFrame:
    """Criteo-format rows from preprocessed ones (dense inverted from ``log(1 + x)``; vocabulary
    ids back to the hashes they stand for, the shared id 0 as a missing field)."""
    dense_cols, sparse_cols = columns(num_dense, cols.sparse.shape[1])
    frame = {
        c: np.rint(np.expm1(cols.dense[:n, i])).astype(np.int64) for i, c in enumerate(dense_cols)
    }
    for j, c in enumerate(sparse_cols):
        values = [int(v) for v in cols.sparse[:n, j, 0]]
        if vocabs is not None:
            kept = vocabs[j].kept
            frame[c] = ["" if v == 0 else f"{int(kept[v - 1]):08x}" for v in values]
        else:
            frame[c] = [f"{v:08x}" for v in values]
    return pd.DataFrame(frame)
