"""Which Ray a command runs on, by Ray's own rules: ``--address``, else ``RAY_ADDRESS``, else the
cluster ``ray start`` runs on this node (its ``ray_current_cluster`` file), else a new local Ray;
an address where nothing answers is refused at once, naming it and where it came from."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from recsys.runtime.cluster import RaySource, check_answers, find_ray, ray_line

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """This node's Ray temp folder in ``tmp_path`` (``RAY_TMPDIR``), no RAY_ADDRESS; returns a
    function that writes the address ``ray start`` would leave there."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def started(address: str) -> Path:
        (tmp_path / "ray").mkdir(exist_ok=True)
        path = tmp_path / "ray" / "ray_current_cluster"
        path.write_text(address)
        return path

    return started


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_found_starts_a_local_ray(node):
    assert find_ray(None) == RaySource(None)


def test_the_cluster_ray_start_runs_on_this_node_is_joined(node):
    path = node("127.0.0.1:6379")
    source = find_ray(None)
    assert source.address == "127.0.0.1:6379" and str(path) in source.origin
    assert find_ray("auto").address == "127.0.0.1:6379"


def test_ray_address_wins_over_this_nodes_cluster(node, monkeypatch):
    node("127.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.2:7000")
    assert find_ray(None) == RaySource("127.0.0.2:7000", "RAY_ADDRESS")


def test_the_flag_wins_over_everything(node, monkeypatch):
    node("127.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.2:7000")
    assert find_ray("127.0.0.3:8000") == RaySource("127.0.0.3:8000", "--address")
    local = find_ray("local")
    assert local.local and local.origin == "--address=local"


def test_ray_address_local_starts_a_local_ray(node, monkeypatch):
    node("127.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert find_ray(None).local


def test_auto_without_a_running_cluster_is_refused(node):
    with pytest.raises(ConnectionError, match="--address=auto: no Ray cluster runs on this node"):
        find_ray("auto")


def test_a_dashboard_address_is_refused_with_what_to_do(node, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    with pytest.raises(ConnectionError, match=r"RAY_ADDRESS=http://127.0.0.1:8265 is a dashboard"):
        find_ray(None)


@pytest.mark.parametrize(
    "origin", ["--address", "RAY_ADDRESS", "this node's running cluster, /x/ray_current_cluster"]
)
def test_an_address_that_answers_nothing_is_named_with_its_origin(origin):
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(ConnectionError) as e:
        check_answers(RaySource(address, origin), timeout_s=5)
    assert f"no Ray cluster answers at {address} (from {origin})" in str(e.value)
    if "ray_current_cluster" in origin:
        assert "ray stop" in str(e.value)


def test_a_malformed_address_is_named():
    with pytest.raises(ConnectionError, match="'nohost' is not a Ray address"):
        check_answers(RaySource("nohost", "--address"))


def test_the_console_line_says_which_ray():
    joined = ray_line(RaySource("10.0.0.1:6379", "RAY_ADDRESS"), {"CPU": 4.0}, 3, None)
    assert joined == (
        "joined the Ray cluster at 10.0.0.1:6379 (from RAY_ADDRESS): 3 nodes, 4 CPUs, 0 GPUs"
    )
    assert ray_line(RaySource(None), {"CPU": 2.0}, 1, None) == "started a local Ray: 2 CPUs"


@pytest.mark.parametrize(
    "command",
    [
        ["experiments/sweep.py", "--smoke-test"],
        ["experiments/train.py"],
        ["-m", "recsys.cli.preprocess", "--schema", "clicklogs", "x", "--out", "y"],
    ],
)
def test_every_entry_point_refuses_a_stale_ray_address_before_launch(command, node):
    address = f"127.0.0.1:{closed_port()}"
    env = {**os.environ, "RAY_ADDRESS": address}
    done = subprocess.run(
        [sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert f"error: no Ray cluster answers at {address} (from RAY_ADDRESS)" in done.stderr, (
        done.stderr[-2000:]
    )
