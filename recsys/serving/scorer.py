"""The exported model as an MLflow model: scores raw rows in the data set's columns
(``TabularScorer``), whatever the data: a prepared folder's schema (Criteo's included), or the
columns export writes for synthetic data and TorchRec's folders (``recsys.data.dataset``).

The TorchScript model inside is the one ``recsys.serving.export`` wrote; this wrapper only turns
rows into the model's input with what training used, copied beside it (``prepared/``: the schema,
the vocabularies, the dense statistics), by the same code as the preparation
(``recsys.prepare.encode``).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
from typing import Any

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

MODEL_FILE = "model.pt"  # the TorchScript model (written by recsys.serving.export)
META_FILE = "meta.json"  # feature names, table sizes, transforms, the export report

# What the served model imports, pinned to the versions installed here.
SERVING_PACKAGES = [
    "torch",
    "torchrec",
    "numpy",
    "pandas",
    "pyyaml",
    "tensordict",
    "torchmetrics",
    "tzdata",
]  # tzdata: time zones where the system has none (pinned if here)


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


PREPARED_DIR = "prepared"  # beside the model: the data's meta.json and vocabularies


class TabularScorer(PythonModel):  # type: ignore[misc]
    """Scores a DataFrame with the columns of the data set's schema (lists for multi-hot
    columns; labels and the time column are not needed, the timestamp columns of time features
    are): raw ids are mapped through the training vocabularies (or hashed into their buckets),
    time features derived from their timestamps, and dense values filled and transformed with
    the training statistics, by the same code as the preparation (``recsys.prepare.encode``).
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
        from recsys.prepare.like import load_fitted

        self.fitted = load_fitted(folder)

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> pd.DataFrame:
        """Probabilities per task. A bad row raises MLflow's invalid-parameter error naming the
        column and row (``raw_table``), which ``mlflow models serve`` answers with HTTP 400."""
        import torch
        from mlflow.exceptions import MlflowException

        try:
            batch = tabular_batch(model_input, self.fitted, self.meta["table_rows"])
        except ValueError as e:
            raise MlflowException.invalid_parameter_value(str(e)) from None
        with torch.no_grad():
            logits = self.model(batch.dense_features, batch.sparse_features)
        probs = torch.sigmoid(logits.float()).numpy()
        return pd.DataFrame(probs, columns=list(self.fitted.schema.labels))


def raw_table(frame: pd.DataFrame, fitted: Any) -> Any:
    """The schema's raw columns of ``frame`` (dense, ids, and the timestamp columns that time
    features are derived from) as a pyarrow table, ids as the type they were hashed as in
    preparation (``"5"`` and ``5`` are different ids); a missing column or a bad value is a
    ``ValueError`` naming column and row."""
    import pyarrow as pa

    from recsys.prepare.checks import column_problem, parallel_problem

    schema = fitted.schema
    needed = schema.serving_columns()
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(f"input lacks the schema's columns {missing} (needs {needed})")
    roles = schema.roles()
    ids, numbers = roles["sparse"], roles["weights"] + roles["orders"]
    cols = {}
    for name in needed:
        if name in ids:
            cols[name] = _ids(frame[name].tolist(), fitted.id_types[name],
                              schema.sparse[name].multi_hot, name)  # fmt: skip
        elif name in numbers:
            cols[name] = _numbers(frame[name].tolist(), name)
        elif name in schema.dense:
            cols[name] = pa.array(frame[name].tolist(), from_pandas=True)
        else:  # a timestamp column: pandas' datetimes keep their unit and time zone
            cols[name] = _timestamps(frame[name], name)
    table = pa.table(cols)
    problems = [(name, column_problem(name, table.column(name), schema)) for name in needed]
    problems += list(parallel_problem(table, schema).items())
    for name, (bad, why) in problems:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            got = frame[name].iloc[row]
            raise ValueError(f"column {name!r}, row {row}: {why} (got {got!r})")
    return table


def _numbers(values: list[Any], name: str) -> Any:
    """A number list column's lists (weights, a sequence's times) as Arrow lists of float64 (a
    null list stays null)."""
    import pyarrow as pa

    def one(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)

    try:
        lists = [None if v is None or (isinstance(v, float) and np.isnan(v)) else
                 [one(x) for x in v] for v in values]  # fmt: skip
        return pa.array(lists, pa.list_(pa.float64()))
    except (TypeError, ValueError) as e:
        raise ValueError(f"column {name!r}: must hold lists of numbers: {e}") from None


EPOCH_GUARD = pd.Timestamp("1971-01-01")


def _timestamps(values: pd.Series, name: str) -> Any:
    """A timestamp column as Arrow. A datetime before 1971 is refused naming column and row:
    it is almost surely a number sent as a timestamp over JSON (pandas writes epoch
    milliseconds, which MLflow's schema check reads as nanoseconds: 2026 becomes 1970), and the
    time features derived from it would be silently wrong."""
    import pyarrow as pa

    try:
        arr = pa.Array.from_pandas(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"column {name!r}: not timestamps: {e}") from None
    if pd.api.types.is_datetime64_any_dtype(values.dtype):
        when = values.dt.tz_localize(None) if values.dt.tz is not None else values
        early = np.flatnonzero((when < EPOCH_GUARD).to_numpy())
        if len(early):
            row = int(early[0])
            raise ValueError(
                f"column {name!r}, row {row}: {values.iloc[row]} is before 1971, most likely a "
                "number read as a timestamp (epoch milliseconds read as nanoseconds); send "
                "timestamps as ISO 8601 strings (pandas: to_json(date_format='iso'))"
            )
    return arr


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
    """Raw rows -> the model's batch (raw ids; a QR model splits them itself; weighted lists
    give a weighted KJT, as in training)."""
    from recsys.config import SparseLayout
    from recsys.data.columns import RaggedColumns
    from recsys.data.input.loader import to_batch
    from recsys.prepare.encode import encode

    enc = encode(raw_table(frame, fitted), fitted, with_labels=False)
    n = len(enc)
    names = list(fitted.schema.sparse)
    ones = np.ones(n, np.int64)
    lengths = np.stack([ones if enc.lengths[f] is None else enc.lengths[f] for f in names], 1)  # type: ignore[misc]
    weights = tuple(enc.weights.get(f) for f in names) if enc.weights else None
    cols = RaggedColumns(enc.dense, tuple(enc.ids[f] for f in names), lengths,
                         np.zeros((n, 1), np.float32), weights=weights)  # fmt: skip
    sequences = {n: s.max_len for n, s in fitted.schema.sequences.items()}
    return to_batch(cols, SparseLayout(names, list(table_rows), sequences=sequences))
