"""The exported model as an MLflow model: scores Criteo-format rows (``CriteoScorer``), or a
user's own rows in their data set's schema (``TabularScorer``).

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


# ---------------------------------------------------------------------------------------------
# A user's own data (a prepared folder): rows in the schema's columns, one probability per task

PREPARED_DIR = "prepared"  # beside the model: the data's meta.json and vocabularies


class TabularScorer(PythonModel):  # type: ignore[misc]
    """Scores a DataFrame with the columns of the data set's schema (lists for multi-hot
    columns; labels and the time column are not needed): raw ids are mapped through the training
    vocabularies (or hashed into their buckets) and dense values filled and transformed with
    the training statistics, by the same code as the preparation (``recsys.data.encode``).
    Returns one probability per task, a column named after each label."""

    def load_context(self, context: Any) -> None:
        import fbgemm_gpu  # noqa: F401  (registers FBGEMM's ops)
        import torch
        import torchrec  # noqa: F401  (registers the KeyedJaggedTensor type)

        self.model = torch.jit.load(context.artifacts["model"])
        with open(context.artifacts["meta"]) as f:
            self.meta = json.load(f)
        folder = context.artifacts.get("prepared") or os.path.join(
            os.path.dirname(context.artifacts["meta"]), PREPARED_DIR
        )
        self.fitted = load_fitted(folder)

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> pd.DataFrame:
        import torch

        batch = tabular_batch(model_input, self.fitted, self.meta["table_rows"])
        with torch.no_grad():
            logits = self.model(batch.dense_features, batch.sparse_features)
        probs = torch.sigmoid(logits.float()).numpy()
        return pd.DataFrame(probs, columns=list(self.fitted.schema.labels))


def load_fitted(folder: str) -> Any:
    """The preparation's fitted transforms (schema, vocabularies, dense statistics) from a
    prepared folder (or its copy beside an export)."""
    from recsys.data.encode import Fitted, Vocabulary
    from recsys.data.schema import DatasetSchema

    with open(os.path.join(folder, META_FILE)) as f:
        meta = json.load(f)
    schema = DatasetSchema.from_dict(meta["schema"])
    vocabs = {
        name: Vocabulary(np.load(os.path.join(folder, path)))
        for name, path in meta["vocab"].items()
    }
    return Fitted(schema, vocabs, meta["dense_stats"], id_types=meta["id_types"])


def raw_table(frame: pd.DataFrame, fitted: Any) -> Any:
    """The schema's feature columns of ``frame`` as a pyarrow table, ids as the type they were
    hashed as in preparation (``"5"`` and ``5`` are different ids); a missing column or a bad
    value is a ``ValueError`` naming column and row."""
    import pyarrow as pa

    from recsys.data.encode import column_problem

    schema = fitted.schema
    needed = [*schema.dense, *schema.sparse]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(f"input lacks the schema's columns {missing} (needs {needed})")
    cols = {}
    for name in needed:
        values = frame[name].tolist()
        if name in schema.sparse:
            cols[name] = _ids(values, fitted.id_types[name], schema.sparse[name].multi_hot, name)
        else:
            cols[name] = pa.array(values, from_pandas=True)
    table = pa.table(cols)
    for name in needed:
        bad, why = column_problem(name, table.column(name), schema)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            got = frame[name].iloc[row]
            raise ValueError(f"column {name!r}, row {row}: {why} (got {got!r})")
    return table


def _ids(values: list[Any], id_type: str, multi_hot: bool, name: str) -> Any:
    import pyarrow as pa

    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return None
        if id_type == "int":
            return int(v)
        return str(int(v)) if isinstance(v, (int, np.integer)) else str(v)

    try:
        if not multi_hot:
            return pa.array(
                [one(v) for v in values], pa.int64() if id_type == "int" else pa.string()
            )
        inner = pa.int64() if id_type == "int" else pa.string()
        lists = [None if v is None or (isinstance(v, float) and np.isnan(v)) else
                 [one(x) for x in v] for v in values]  # fmt: skip
        return pa.array(lists, pa.list_(inner))
    except (TypeError, ValueError) as e:
        raise ValueError(f"column {name!r}: {e}") from None


def tabular_batch(frame: pd.DataFrame, fitted: Any, table_rows: list[int]) -> Any:
    """Raw rows -> the model's batch (raw ids; a QR model splits them itself)."""
    from recsys.config import SparseLayout
    from recsys.data.columns import RaggedColumns
    from recsys.data.encode import encode
    from recsys.data.loader import to_batch

    enc = encode(raw_table(frame, fitted), fitted, with_labels=False)
    n = len(enc)
    names = list(fitted.schema.sparse)
    ones = np.ones(n, np.int64)
    lengths = np.stack([ones if enc.lengths[f] is None else enc.lengths[f] for f in names], 1)  # type: ignore[misc]
    cols = RaggedColumns(enc.dense, tuple(enc.ids[f] for f in names), lengths,
                         np.zeros((n, 1), np.float32))  # fmt: skip
    return to_batch(cols, SparseLayout(names, list(table_rows)))
