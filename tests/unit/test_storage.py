"""Object storage against a real S3-compatible server on loopback (SeaweedFS, ``s3`` fixture):
the few file operations the driver and the export do themselves, and the checks that name a
missing bucket or wrong credentials before anything launches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recsys.configlib import ConfigError
from recsys.runtime import storage

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
        assert os.path.isdir(local)
    assert not os.path.exists(local), "the download is removed afterwards"
    with storage.local_folder(str(tmp_path)) as same:  # a folder is itself
        assert same == str(tmp_path)


def test_a_uri_keeps_its_query_when_joined():
    uri = "s3://bucket/sweeps?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join(uri, "a", "b.json") == (
        "s3://bucket/sweeps/a/b.json?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert storage.join("/runs", "a") == "/runs/a"


def test_one_rule_says_what_is_a_uri_for_every_command(tmp_path, demo_prepared):
    """``file://`` is a local folder to the sweep, the training, the space's data and a prepared
    folder's reader alike; an object store URI is kept as it is."""
    from recsys.cli.sweep import parse_args as sweep_args
    from recsys.data.dataset import source_for
    from recsys.data.prepared.meta import read_meta

    assert storage.resolved(f"file://{tmp_path}") == str(tmp_path)
    assert storage.resolved("runs") == os.path.abspath("runs")
    assert storage.resolved("s3://b/p?scheme=http") == "s3://b/p?scheme=http"
    assert not storage.is_uri(f"file://{tmp_path}") and storage.is_uri("s3://b/p")
    assert read_meta(f"file://{demo_prepared}") == read_meta(demo_prepared)
    assert source_for(f"file://{demo_prepared}") == "prepared"
    assert sweep_args(["--storage", f"file://{tmp_path}"]).storage == f"file://{tmp_path}"
    root = os.path.join(ROOT, "recsys")
    bare = subprocess.run(["grep", "-rn", "--include=*.py", '"://" in', root], capture_output=True,
                          text=True).stdout.splitlines()  # fmt: skip
    assert [line for line in bare if "storage.py" not in line] == []  # no rule of its own


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


def test_rays_upload_waits_out_the_store_being_down(s3, s3_server, tmp_path, monkeypatch, capsys):
    """Ray Train's own checkpoint upload through the run's storage file system
    (``ray_storage``), against the real server taken down while it runs and brought back 6 s
    later: the upload goes on once the store is back and lands every byte; one line per failed
    try names the store and the error. With no patience the error is raised."""
    import threading

    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    monkeypatch.setenv(storage.PATIENCE_ENV, "120")
    path, fs = storage.ray_storage(storage.join(s3, "runs"))
    ctx = StorageContext(storage_path=path, experiment_dir_name="trial", storage_filesystem=fs)
    folder = tmp_path / "staged"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "w.bin").write_bytes(os.urandom(1 << 20))
    s3_server.stop()
    back = threading.Timer(6, s3_server.start)
    back.start()
    try:
        persisted = ctx.persist_current_checkpoint(Checkpoint.from_directory(str(folder)), "s1")
    finally:
        back.join()
        s3_server.start()
    uri = storage.as_uri(persisted.filesystem, persisted.path)
    assert uri == storage.join(s3, "runs", "trial", "s1")
    with storage.local_folder(uri) as local, open(os.path.join(local, "part", "w.bin"), "rb") as f:
        assert f.read() == (folder / "part" / "w.bin").read_bytes()
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("s3 store, " in line and "; retry in " in line for line in lines)
    assert "NETWORK_CONNECTION" in lines[0]

    monkeypatch.setenv(storage.PATIENCE_ENV, "0")
    path, fs = storage.ray_storage(storage.join(s3, "runs"))
    s3_server.stop()
    try:
        with pytest.raises(OSError, match="NETWORK_CONNECTION"):
            fs.create_dir(f"{path}/other")
    finally:
        s3_server.start()


def test_the_stores_firm_answers_are_not_retried(s3, capsys):
    """A missing object or bucket is the store's answer, raised at once (no retry line)."""
    path, fs = storage.ray_storage(storage.join(s3, "runs"))
    with pytest.raises(FileNotFoundError):
        fs.open_input_stream(f"{path}/nothing.json")
    _, missing = storage.ray_storage("s3://nobucket/runs")
    with (
        pytest.raises(OSError, match="NO_SUCH_BUCKET"),
        missing.open_output_stream("nobucket/runs/x.json") as f,
    ):
        f.write(b"{}")
    assert "retry in" not in capsys.readouterr().out


def test_a_uri_with_a_query_is_refused_naming_the_environment(s3):
    with pytest.raises(ConfigError, match=r"AWS_ENDPOINT_URL, ...\), not in the URI's query"):
        storage.check_storage(storage.join(s3, "runs") + "?endpoint_override=127.0.0.1:1")


def test_many_files_copied_at_once_through_the_store_do_not_deadlock(s3, tmp_path):
    """``copy_files`` closes its streams on Arrow's IO threads, more files than it has threads:
    each close uploads in its own thread (``foreground``), none waits on a queued one."""
    import threading

    import pyarrow.fs

    folder = tmp_path / "many"
    folder.mkdir()
    for k in range(40):
        (folder / f"f{k}.bin").write_bytes(os.urandom(70_000))
    path, fs = storage.ray_storage(storage.join(s3, "many"))
    copy = threading.Thread(
        target=pyarrow.fs.copy_files, args=(str(folder), path), daemon=True,
        kwargs={"destination_filesystem": fs},
    )  # fmt: skip
    copy.start()
    copy.join(timeout=120)
    assert not copy.is_alive(), "copy_files through the retrying store deadlocked"
    listed = fs.get_file_info(pyarrow.fs.FileSelector(path))
    assert sorted(i.size for i in listed) == [70_000] * 40


def test_restart_archives_a_sweep_in_the_store(s3):
    """``--restart`` on object storage: the sweep's objects move to ``<name>.archived-<time>``
    (an object store moves no folders: copied, then removed)."""
    from recsys.tune.state import SweepOptions, archive

    opts = SweepOptions(name="s", storage=f"{s3}/sweeps", tracking_uri="sqlite:///x")
    storage.write_text(f"{s3}/sweeps/s/sweep.json", "{}")
    storage.write_text(f"{s3}/sweeps/s/train/trial_1/step_1/part", "x")
    to = archive(opts)
    assert to.startswith(f"{s3}/sweeps/s.archived-")
    assert storage.read_text(f"{to}/sweep.json") == "{}"
    assert storage.read_text(f"{to}/train/trial_1/step_1/part") == "x"
    assert not storage.exists(f"{s3}/sweeps/s/sweep.json")
    assert archive(opts) == ""  # nothing left to archive
