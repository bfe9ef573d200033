"""A real two-node cluster on this machine whose second node (at 127.0.0.2) sees the shared folder
differently: its raylet runs in a mount namespace of its own in which ``shared/`` is covered by an
empty tmpfs holding another ``data/meta.json``. ``check_nodes_see`` must refuse a ``--storage`` or
``--data`` under it, naming that node, and pass paths both nodes see and object store URIs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recsys.configlib import ConfigError
from tests.servers import AGENT_PORTS, agent_ports, ray_node_started, stop_group

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ODD_IP = "127.0.0.2"


def unshare_refused() -> str | None:
    """Why a process cannot get a mount namespace of its own with a tmpfs in it, or None."""
    if not shutil.which("unshare"):
        return "no unshare program (util-linux)"
    with tempfile.TemporaryDirectory() as folder:
        script = f"mount -t tmpfs tmpfs {shlex.quote(folder)}"
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"unshare --mount with a tmpfs is not permitted here: {done.stderr.strip()[:300]}"
    return None


@pytest.fixture(scope="module")
def head() -> Iterator[str]:
    """A one-node cluster (the head, at this machine's IP) this process is connected to; its
    address."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if reason := unshare_refused():
        pytest.skip(reason)
    import ray
    from ray.cluster_utils import Cluster

    from recsys.runtime.cluster import connect

    args = {"num_cpus": 1, "include_dashboard": False, **agent_ports()}
    cluster = ray_node_started(lambda: Cluster(initialize_head=True, head_node_args=args), "head")
    try:
        connect(cluster.address, log_to_driver=False, announce=False)
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


@dataclass
class Views:
    shared: Path  # what the head sees; the odd node sees an empty tmpfs with another data/
    own: Path  # a folder both nodes see
    frozen: Path  # a folder both nodes see, read-only for the odd node
    odd_id: str  # the odd node's id


@pytest.fixture(scope="module")
def odd_node(head: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Views]:
    """A second node, 127.0.0.2, whose view of ``shared/`` differs (see the module's doc)."""
    root = tmp_path_factory.mktemp("views")
    shared, own = root / "shared", root / "own"
    (shared / "data").mkdir(parents=True)
    (shared / "data" / "meta.json").write_text(json.dumps({"format": "the driver's"}))
    (own / "frozen").mkdir(parents=True)
    (own / "frozen" / "meta.json").write_text("{}")
    for attempt in range(1, 4):
        proc, temp, log = start_odd_node(head, shared, own / "frozen")
        try:
            odd_id = wait_for_node(proc, log)
            break
        except RuntimeError as e:  # Ray's fixed 30-s wait for its raylet (tests.servers)
            shutil.rmtree(temp, ignore_errors=True)
            log.unlink(missing_ok=True)
            if "timed out during startup" not in str(e) or attempt == 3:
                raise
            print(f"the odd node: its raylet did not register within Ray's 30 s; again ({e})")
    try:
        yield Views(shared, own, own / "frozen", odd_id)
    finally:
        stop_group(proc, timeout=30)
        shutil.rmtree(temp, ignore_errors=True)
        log.unlink(missing_ok=True)


def start_odd_node(address: str, shared: Path, frozen: Path) -> tuple[subprocess.Popen, str, Path]:
    """``ray start`` joining ``address`` in a mount namespace of its own: ``shared`` covered by a
    tmpfs with another ``data/meta.json``, ``frozen`` mounted read-only, and Ray's temp folder a
    tmpfs of its own (``ray start`` writes ``ray_current_cluster`` there, which must not point
    this machine's later commands at a test's cluster; a short path: Ray's sockets live in it)."""
    temp = tempfile.mkdtemp(prefix="rn-")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    s, f, t = shlex.quote(str(shared)), shlex.quote(str(frozen)), shlex.quote(temp)
    other = shlex.quote(json.dumps({"format": "another"}))
    ports = " ".join(f"{AGENT_PORTS[name]} {port}" for name, port in agent_ports().items())
    script = (
        f"mount -t tmpfs tmpfs {s} && mount -t tmpfs tmpfs {t} && mkdir {s}/data && "
        f"echo {other} > {s}/data/meta.json && "
        f"mount --bind {f} {f} && mount -o remount,bind,ro {f} && "
        f"exec {shlex.quote(ray_bin)} start --address {address} --num-cpus 1 "
        f"--node-ip-address {ODD_IP} --temp-dir {t} {ports} --block --disable-usage-stats"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = Path(temp + ".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    return proc, temp, log


def wait_for_node(proc: subprocess.Popen, log: Path, timeout: float = 180) -> str:
    """The id of the node at ``ODD_IP`` once the cluster shows it alive."""
    import ray

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for n in ray.nodes():
            if n["Alive"] and n["NodeManagerAddress"] == ODD_IP:
                return str(n["NodeID"])
        time.sleep(0.5)
    stop_group(proc, timeout=10)
    raise RuntimeError(f"the odd node did not join: {log.read_text()[-3000:]}")


def no_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any node task of ``check_nodes_see`` fail the test."""
    from recsys.runtime import shared_storage

    def ask(*args: object) -> None:
        raise AssertionError("no node should have been asked")

    monkeypatch.setattr(shared_storage, "ask", ask)


# (first: the odd node joins for the tests below it)
def test_a_one_node_cluster_passes_at_once(head, tmp_path, monkeypatch):
    import ray

    from recsys.runtime.shared_storage import check_nodes_see

    assert len([n for n in ray.nodes() if n["Alive"]]) == 1
    no_tasks(monkeypatch)
    check_nodes_see({"--storage": str(tmp_path / "runs"), "--data": str(tmp_path / "data")})
    assert not (tmp_path / "runs").exists()  # not even a marker written


def test_a_path_one_node_sees_otherwise_is_refused_naming_that_node(odd_node):
    import ray

    from recsys.runtime.shared_storage import check_nodes_see

    storage, data = odd_node.shared / "runs", odd_node.shared / "data"
    before = sorted(os.listdir(data))
    with pytest.raises(ConfigError) as refused:
        check_nodes_see(
            {"--storage": f"file://{storage}", "--data": str(data)},
            files={"--data": str(data / "meta.json")},  # a prepared folder: its meta.json
        )
    text = str(refused.value)
    print(text)
    odd = f"{ODD_IP} (node {odd_node.odd_id[:8]})"
    (head,) = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != odd_node.odd_id]
    assert f"--storage={storage}: 1 of 2 nodes do not see" in text
    assert f"  {odd}: missing: no folder {odd_node.shared}/runs" in text
    assert f"--data={data}: 1 of 2 nodes do not see what the driver sees there (meta.json)" in text
    assert f"  {odd}: different content: its meta.json differs" in text
    assert f"(node {head['NodeID'][:8]})" not in text  # the head sees both
    assert "every node mounts at the same path (NFS" in text and "object store URI" in text
    assert os.listdir(storage) == []  # the marker removed
    assert sorted(os.listdir(data)) == before  # nothing written into --data


def test_paths_every_node_sees_pass(odd_node):
    from recsys.runtime.shared_storage import check_nodes_see

    storage, data = odd_node.own / "runs", odd_node.own / "prepared"
    data.mkdir()
    (data / "meta.json").write_text("{}")
    check_nodes_see(
        {"--storage": str(storage), "--data": str(data)}, files={"--data": str(data / "meta.json")}
    )
    assert os.listdir(storage) == []  # created, and the marker removed
    check_nodes_see({"--data": str(data / "meta.json")})  # a file
    check_nodes_see({"--data": str(odd_node.own)})  # a folder with no file named: its listing


def test_storage_a_node_cannot_write_is_refused_and_data_may_be_read_only(odd_node):
    from recsys.runtime.shared_storage import check_nodes_see

    with pytest.raises(ConfigError) as refused:
        check_nodes_see({"--storage": str(odd_node.frozen)})
    node = f"{ODD_IP} (node {odd_node.odd_id[:8]})"
    assert f"  {node}: {odd_node.frozen} is there but not writable" in str(refused.value)
    assert os.listdir(odd_node.frozen) == ["meta.json"]  # the marker removed
    check_nodes_see({"--data": str(odd_node.frozen)})


def test_object_store_uris_are_not_checked(odd_node, monkeypatch):
    from recsys.runtime.shared_storage import check_nodes_see

    no_tasks(monkeypatch)
    check_nodes_see({"--storage": "s3://no-such-bucket/runs", "--data": "s3://no-such/data"})


def test_nodes_that_do_not_answer_are_named(odd_node, monkeypatch):
    from recsys.runtime import shared_storage

    odd_id, look_all = odd_node.odd_id, shared_storage.look_all

    def silent_on_the_odd_node(probes):  # nested: Ray pickles it by value
        import time

        import ray

        if ray.get_runtime_context().get_node_id() == odd_id:
            time.sleep(600)  # cancelled when the check gives up on it
        return look_all(probes)

    monkeypatch.setattr(shared_storage, "look_all", silent_on_the_odd_node)
    storage = odd_node.own / "silent"
    with pytest.raises(ConfigError) as refused:
        shared_storage.check_nodes_see({"--storage": str(storage)}, timeout_s=20)
    text = str(refused.value)
    assert "1 of 2 nodes do not see" in text  # the head answered
    assert f"  {ODD_IP} (node {odd_id[:8]}): did not answer within 20 s" in text
    assert os.listdir(storage) == []  # the marker removed on failure too
