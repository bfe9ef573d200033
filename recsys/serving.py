"""The exported model as an MLflow model: scores Criteo-format rows.

Input: a DataFrame with columns ``I1..I13`` (integers, missing allowed) and ``C1..C26`` (8-hex-digit
hashes, empty or missing allowed), as the Criteo files hold them. Output: click probabilities.
The TorchScript model inside is the one ``recsys.export`` wrote; this wrapper only parses rows.
"""

from __future__ import annotations

import json
import os
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from recsys.export import META_FILE, MODEL_FILE

PIP_REQUIREMENTS = [
    "torch==2.13.0",
    "torchrec==1.8.0",
    "fbgemm-gpu-cpu==1.8.0",
    "numpy",
    "pandas",
    "pyyaml",
    "tensordict",
    "torchmetrics==1.0.3",
]


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

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> np.ndarray:
        import torch

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
        cols = Columns(
            transform_dense(raw.astype(np.float64)),
            ids.reshape(n, len(names), 1).astype(np.int64),
            np.zeros((n, 1), np.float32),
        )
        batch = to_batch(cols, rows, names)
        with torch.no_grad():
            logits = self.model(batch.dense_features, batch.sparse_features)[:, 0]
        return torch.sigmoid(logits.float()).numpy()


def example_rows(cols: Any, num_dense: int, n: int = 4) -> pd.DataFrame:
    """Criteo-format rows from preprocessed ones (dense inverted from ``log(1 + x)``)."""
    dense_cols, sparse_cols = columns(num_dense, cols.sparse.shape[1])
    frame = {
        c: np.rint(np.expm1(cols.dense[:n, i])).astype(np.int64) for i, c in enumerate(dense_cols)
    }
    for j, c in enumerate(sparse_cols):
        frame[c] = [f"{int(v):08x}" for v in cols.sparse[:n, j, 0]]
    return pd.DataFrame(frame)


def log_model(
    tracking_uri: str,
    run_id: str,
    export_dir: str,
    example: pd.DataFrame,
    registered_name: str | None = None,
) -> str:
    """Log the export as an MLflow pyfunc model in run ``run_id`` (and register it); its URI."""
    from mlflow.models import infer_signature

    mlflow.set_tracking_uri(tracking_uri)
    artifacts = {
        "model": os.path.join(export_dir, MODEL_FILE),
        "meta": os.path.join(export_dir, META_FILE),
    }
    scorer = CriteoScorer()
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    signature = infer_signature(example, scorer.predict(None, example))
    recsys_dir = os.path.dirname(os.path.abspath(__file__))
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(
            name="served_model",
            python_model=CriteoScorer(),
            artifacts=artifacts,
            code_paths=[recsys_dir],
            input_example=example,
            signature=signature,
            pip_requirements=PIP_REQUIREMENTS,
            registered_model_name=registered_name,
        )
    return str(info.model_uri)
