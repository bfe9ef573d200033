"""Helpers shared by test files in different places: a test file never imports another test file
(``tests/unit/test_architecture.py`` checks it). Fixtures live in the ``conftest.py`` files; the
multi-process helpers in ``tests/distributed/common.py`` and ``harness.py``; the sweep tests' tiny
spaces in ``tests/ray/spaces.py``; the tracking server in ``tests/servers.py``.

Heavy imports (Ray, pyarrow, the preparation) happen inside the functions, so that a unit test
importing this module pays for none of them.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from recsys.config import ExperimentConfig

if TYPE_CHECKING:
    import numpy as np

    from recsys.train.ray_trainer import Resources

# Ray's workers may not find the ``tests`` package: what this module sends them (the killing
# train loop) travels by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- one configuration under Ray Train (tests/ray/test_trainer.py, test_cluster.py, tests/gpu) ---


def trainer_config(**overrides: Any) -> ExperimentConfig:
    """A small DLRM on synthetic data that learns in 120 steps (table-wise tables)."""
    cfg = ExperimentConfig.from_dict(
        {
            "embeddings": {"num_embeddings": [50, 200, 1000, 3000, 100, 400], "dim": 8},
            "model": {"bottom_mlp": [16], "top_mlp": [16]},
            "data": {"synthetic": {"num_samples": 24000, "seed": 4}},
            "train": {"steps": 120, "batch_size": 128, "eval_every": 60, "checkpoint_every": 30},
            "sharding": {"default": {"sharding_types": ["table_wise"]}},
        }
    )
    return cfg.with_overrides(overrides)


def kills_itself(rank: int, world_size: int, step: int, kill_at: int, marker: str) -> bool:
    """Whether a worker of ``killing_train_func`` kills itself now: the last rank (one that
    exists on any worker count), at step ``kill_at``, unless the marker says it already did."""
    return rank == world_size - 1 and step == kill_at and not os.path.exists(marker)


def killing_train_func(config: dict) -> None:
    """The real worker, but the last rank SIGKILLs itself right after the step-``kill_at``
    report on the first attempt (the marker file says whether it already did): rank 1 of two,
    rank 0 of one (``kills_itself``)."""
    import ray.train

    from recsys.train import worker

    marker, kill_at = config["marker"], config["kill_at"]
    real_report = worker.RayReporter.report

    def report(self, metrics, folder, step):
        real_report(self, metrics, folder, step)
        ctx = ray.train.get_context()
        if kills_itself(ctx.get_world_rank(), ctx.get_world_size(), step, kill_at, marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    worker.RayReporter.report = report
    worker.train_func(config)


def fit_killed_once(tmp_path: Path, resources: Resources) -> None:
    """90 steps, a worker SIGKILLed at step 60, one restart allowed; asserts the failure happened,
    the run completed and every step's loss reached Ray exactly once, in order."""
    from recsys.train.ray_trainer import make_trainer

    cfg = trainer_config(**{"train.steps": 90, "train.eval_every": 0, "train.log_every": 10})
    trainer = make_trainer(
        cfg,
        resources,
        name="kill",
        storage_path=str(tmp_path),
        max_failures=1,
        keep_checkpoints=None,
        train_loop=killing_train_func,
    )
    trainer.train_loop_config.update(marker=str(tmp_path / "killed"), kill_at=60)
    result = trainer.fit()
    assert os.path.exists(tmp_path / "killed")  # the failure happened
    assert result.error is None and result.metrics["step"] == 90
    steps = [s for _, m in result.best_checkpoints for s, _ in m["loss_history"]]
    assert sorted(steps) == list(range(10, 100, 10))


# --- search spaces over a tiny prepared log (tests/unit/test_space.py, test_launch_checks.py) ---


def space_file(tmp_path: Path, body: str) -> str:
    """``body`` over the ``debug`` base, written to ``<tmp_path>/s.yaml``; its path."""
    path = tmp_path / "s.yaml"
    path.write_text("base: debug\n" + body)
    return str(path)


def metric_space(tmp_path: Path, metric: str, mode: str = "max") -> str:
    """A two-trial space that optimises ``metric`` (``mode``), in ``<tmp_path>/s.yaml``."""
    return space_file(tmp_path, f"space:\n  optim.lr: {{choice: [0.01, 0.02]}}\nmetric: {metric}\n"
                                f"mode: {mode}\n")  # fmt: skip


def prepared_log(folder: Path, labels: dict[str, np.ndarray], val_fraction: float = 0.2) -> str:
    """A tiny log of ids and ``labels`` prepared without Ray, split by input order (the rows
    600..799 of 1000 are validation with ``val_fraction=0.2``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    rng = np.random.default_rng(0)
    n = len(next(iter(labels.values())))
    table = pa.table({"user": rng.integers(0, 50, n), "item": rng.integers(0, 20, n), **labels})
    os.makedirs(folder / "raw")
    pq.write_table(table, folder / "raw" / "log.parquet")
    schema = DatasetSchema.from_dict({
        "labels": list(labels), "dense": {}, "sparse": {"user": {}, "item": {}},
        "split": {"by": "order", "val_fraction": val_fraction, "test_fraction": 0.2},
    })  # fmt: skip
    out = str(folder / "prepared")
    prepare(schema, [str(folder / "raw")], out, workers=0, log=lambda s: None)
    return out


def assert_int8_export_close(model: Any, dense: Any, kjt: Any, tol: float = 0.01) -> None:
    """``model`` (FP32, raw ids in) quantized to INT8, traced and scripted scores ``(dense, kjt)``
    within ``tol`` of itself in probability."""
    import torch

    from recsys.serving.export import quantize_and_script

    with torch.no_grad():
        want = torch.sigmoid(model(dense, kjt))
    scripted, _ = quantize_and_script(model, "int8", (dense, kjt))
    got = torch.sigmoid(scripted(dense, kjt))
    assert isinstance(scripted, torch.jit.ScriptModule)
    assert (got - want).abs().max() < tol


def served_in_a_fresh_process(tracking_uri: str, model_uri: str, rows: Any, folder: Path) -> Any:
    """What the MLflow model ``model_uri`` returns for the DataFrame ``rows``, loaded with
    ``mlflow.pyfunc`` in a new Python process (as a user's scoring job would): a DataFrame."""
    import json
    import subprocess

    import pandas as pd

    path = folder / "rows.parquet"
    rows.to_parquet(path)
    code = (
        "import json, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({tracking_uri!r})\n"
        f"m = mlflow.pyfunc.load_model({model_uri!r})\n"
        f"p = m.predict(pd.read_parquet({str(path)!r}))\n"
        "print(json.dumps({'columns': list(p.columns), 'rows': p.to_numpy().tolist()}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return pd.DataFrame(out["rows"], columns=out["columns"])
