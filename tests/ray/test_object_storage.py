"""A sweep whose storage is an S3 bucket (SeaweedFS on loopback, the ``s3`` fixture).

Killed with its Ray while trial 2 is mid-run, its head node's local folders deleted (its working
folder, Ray's session folders, the temp folder the workers stage checkpoints in: what a lost
head node loses), it resumes from the bucket alone: trial 1 stays finished, trial 2 continues
from its last checkpoint in the bucket, one MLflow run per trial (MLflow's store is the tracking
server's, not the head node's), and the best trial exports from its checkpoint in the bucket.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile

import pytest
from mlflow.tracking import MlflowClient

from recsys import storage
from tests.ray.killing import (
    check_resumed,
    kill_space,
    start_sweep,
    sweep_cmd,
    trial_runs,
    wait_for_mid_run,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def head_node() -> tuple[str, dict[str, str]]:
    """A fresh local folder standing for the head node's disk: the sweep's working folder, and
    Ray's and the temp folder's environment pointing into it (short: Ray's sockets live there)."""
    head = tempfile.mkdtemp(prefix="rs3-", dir="/tmp")
    os.makedirs(os.path.join(head, "work"))
    return head, {"RAY_TMPDIR": head, "TMPDIR": head}


def test_a_sweep_on_s3_resumes_from_the_bucket_alone(tmp_path, s3):
    space = kill_space(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweeps = storage.join(s3, "sweeps")
    client = MlflowClient(uri)
    head, env = head_node()
    first = start_sweep(space, sweeps, uri, cwd=os.path.join(head, "work"), **env)
    try:
        wait_for_mid_run(client, first)
        first_finished = trial_runs(client)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its Ray
        first.wait()
    stale = trial_runs(client)[1]
    assert stale.info.status == "RUNNING"
    assert storage.exists(storage.join(sweeps, "kill", "sweep.json"))
    assert os.listdir(os.path.join(head, "work")) == [], "nothing of the sweep's on local disk"
    shutil.rmtree(head)

    head, env = head_node()
    try:
        resumed = subprocess.run(
            sweep_cmd(space, sweeps, uri, "--resume", "--export", "int8"),
            capture_output=True, text=True, timeout=600, cwd=os.path.join(head, "work"),
            env={**os.environ, **env},
        )  # fmt: skip
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out[-3000:]
        check_resumed(client, first_finished, stale, out)
        for run in trial_runs(client):
            best = run.data.tags["checkpoint.best"]
            assert best.startswith(storage.join(sweeps, "kill", "train", "")), best
            assert storage.exists(storage.join(best, ".metadata"))
        assert os.path.isfile(os.path.join(head, "work", "exports", "kill", "model.pt"))
        assert "exported the best trial" in out
    finally:
        shutil.rmtree(head, ignore_errors=True)
