"""Ray Train's floor for the overhead benchmark: a trial whose workers only import and report.

Kept apart from ``overhead.py``, whose imports (``recsys``, so torch and TorchRec) would otherwise
be loaded by every floor worker when Ray unpickles these functions, so that the "torch only"
floor would not be one. Only the standard library is imported at module level.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any


def empty_train(config: dict[str, Any]) -> None:
    """A Train worker that does nothing but import and report once."""
    started = time.time()
    import torch  # noqa: F401

    if config["torchrec"]:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    import ray.train

    # Train V2's Result.metrics are those of the latest report with a checkpoint: report with a
    # one-file checkpoint (our trials checkpoint with every report too)
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/t", "w") as f:
            f.write("0")
        metrics = {"t_worker_start": started, "t_imported": time.time()}
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def floor_trial(config: dict[str, Any], storage: str, cpus: float, workers: int = 2) -> None:
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        empty_train,
        train_loop_config={"torchrec": config["torchrec"]},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(
            name=f"floor_{tune.get_context().get_trial_id()}", storage_path=storage
        ),
    )
    t0 = time.time()
    metrics = trainer.fit().metrics or {}
    t1 = time.time()
    tune.report(
        {
            "wall": t1 - t0,
            "worker start": metrics["t_worker_start"] - t0,
            "imports": metrics["t_imported"] - metrics["t_worker_start"],
            "teardown": t1 - metrics["t_imported"],
            "t_fit_start": t0,
            "t_fit_end": t1,
        }
    )
