"""Object storage against a real S3-compatible server on loopback (SeaweedFS, ``s3`` fixture):
the few file operations the driver and the export do themselves, and the checks that name a
missing bucket or wrong credentials before anything launches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recsys import storage
from recsys.configlib import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_files_round_trip_through_the_store(s3, tmp_path):
    sweep = storage.join(s3, "sweeps", "a")
    state = storage.join(sweep, "sweep.json")
    assert not storage.exists(state)
    storage.write_text(state, '{"x": 1}')
    assert storage.exists(state) and storage.read_text(state) == '{"x": 1}'
    storage.write_text(storage.join(sweep, "ckpt", "part", "w.bin"), "weights")
    with storage.local_folder(storage.join(sweep, "ckpt")) as local:
        with open(os.path.join(local, "part", "w.bin")) as f:
            assert f.read() == "weights"
        assert not local.startswith(s3)
    assert not os.path.exists(local), "the download is removed afterwards"
    with storage.local_folder(str(tmp_path)) as same:  # a folder is itself
        assert same == str(tmp_path)


def test_a_uri_keeps_its_query_when_joined():
    uri = "s3://bucket/sweeps?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join(uri, "a", "b.json") == (
        "s3://bucket/sweeps/a/b.json?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert storage.join("/runs", "a") == "/runs/a"


def test_a_download_without_room_is_refused_before_it_starts(s3):
    folder = storage.join(s3, "big")
    storage.write_text(storage.join(folder, "w.bin"), "x" * 1000)
    too_big = storage.local_folder(folder, need_bytes=1 << 60)
    with pytest.raises(OSError, match="GiB free; set TMPDIR"), too_big:
        pass
    with (
        pytest.raises(FileNotFoundError, match="no such folder"),
        storage.local_folder(storage.join(s3, "missing")),
    ):
        pass


def test_missing_bucket_and_wrong_credentials_are_named(s3, s3_server, monkeypatch):
    storage.check_storage(storage.join(s3, "sweeps"))  # the fixture's bucket and key: fine
    with pytest.raises(ConfigError, match=r"bucket 'nobucket' at http://127\.0\.0\.1:\d+: NO_SUCH"):
        storage.check_storage("s3://nobucket/sweeps")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError, match="SIGNATURE_DOES_NOT_MATCH"):
        storage.check_storage(storage.join(s3, "sweeps"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with pytest.raises(ConfigError, match="INVALID_ACCESS_KEY_ID"):
        storage.check_storage(storage.join(s3, "sweeps"))


def test_the_sweep_names_a_missing_bucket_before_ray_starts(s3, tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
         "--storage", "s3://nobucket/sweeps", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "error: --storage=s3://nobucket/sweeps: cannot write to bucket 'nobucket'" in out
    assert "Ray" not in out and "Traceback" not in out
    assert not os.path.exists(tmp_path / "m.db"), "nothing was written"


def test_a_checkpoint_upload_is_retried_while_the_store_is_down(s3, s3_server, tmp_path):
    """Ray Train's own upload, against the real server taken down: the first try fails, one line
    names the store, the server comes back during the wait, the second try lands every file.
    With no patience left the error is raised (the run then fails and restarts)."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    from recsys.train.worker import retrying_upload

    ctx = StorageContext(storage_path=storage.join(s3, "runs"), experiment_dir_name="trial")
    folder = tmp_path / "staged"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "w.bin").write_text("weights")
    lines: list[str] = []

    def wait_while_the_store_comes_back(seconds: float) -> None:
        s3_server.start()

    s3_server.stop()
    try:
        upload = retrying_upload(ctx, 60, log=lines.append, sleep=wait_while_the_store_comes_back)
        persisted = upload(Checkpoint.from_directory(str(folder)), "step_00000010")
    finally:
        s3_server.start()
    uri = storage.as_uri(persisted.filesystem, persisted.path)
    assert uri == storage.join(s3, "runs", "trial", "step_00000010")
    assert storage.read_text(storage.join(uri, "part", "w.bin")) == "weights"
    assert len(lines) == 1, lines
    assert f"upload to s3://{s3[5:]}/runs/trial failed (" in lines[0] and "retry in 2 s" in lines[0]

    s3_server.stop()
    try:
        with pytest.raises(OSError):
            retrying_upload(ctx, 0, log=lines.append)(
                Checkpoint.from_directory(str(folder)), "step_00000020"
            )
    finally:
        s3_server.start()
    assert len(lines) == 1, "no retry without patience"
