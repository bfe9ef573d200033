"""A simulated two-node cluster (3 CPUs per node) with shared storage: sweeps land on both nodes,
and a trial's workers are never split unevenly over nodes."""

from __future__ import annotations

import os
import sys
import threading
import time

import cloudpickle
import pytest

from recsys.configlib import ConfigError
from recsys.tracking.tracker import Tracker
from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep
from tests.ray.spaces import write_space
from tests.servers import agent_ports, ray_node_started

pytestmark = [pytest.mark.ray, pytest.mark.slow]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def two_nodes():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    from recsys.runtime.cluster import connect, local_system_config

    head = {"num_cpus": 3, "_system_config": local_system_config(), **agent_ports()}  # nice 0
    cluster = ray_node_started(lambda: Cluster(initialize_head=True, head_node_args=head), "head")
    ray_node_started(lambda: cluster.add_node(num_cpus=3, **agent_ports()), "second node")
    connect(cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_host_memory_is_measured_on_the_nodes_by_the_workers_rule(two_nodes):
    from recsys.runtime.cluster import host_memory_bytes, node_host_memory

    # both simulated nodes are this machine: the same figure a worker here plans with
    assert node_host_memory(1.0, 0.0) == host_memory_bytes()
    assert node_host_memory(4.0, 0.0) == 0  # no node can hold such a worker


def test_sweep_spreads_over_two_nodes(two_nodes, tmp_path):
    import ray

    from recsys.runtime.cluster import alive_nodes, check_fits

    assert len(alive_nodes()) == 2
    check_fits(2, 0.9, 0, alive_nodes(), extra_cpus=0.1)
    with pytest.raises(ConfigError, match="can place 6 such workers"):
        check_fits(7, 0.9, 0, alive_nodes(), extra_cpus=0.1)
    space = spaces.load(write_space(tmp_path, steps=20))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(
        name="two",
        storage=str(tmp_path / "shared"),
        tracking_uri=uri,
        num_samples=1,  # the space's dtype grid: 2 trials
        max_concurrent=2,
        num_workers=1,  # one 2.5-CPU worker a trial: a node holds one trial, so two run at once
        cpus_per_worker=2.5,  # on the two nodes (and the test has half the processes)
    )
    table = run_sweep(space, opts, Tracker(uri), restore=False)
    assert len(table) == 2 and all(r["status"] == "finished" for r in table)
    used = set()
    for row in table:
        assert len(row["worker_nodes"].split(",")) == 1  # each trial on one node
        used |= set(row["worker_nodes"].split(","))
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert used == node_ids, (used, node_ids)


def test_a_count_that_cannot_fill_nodes_evenly_is_refused_before_launch(two_nodes):
    from recsys.runtime.cluster import alive_nodes, check_fits

    check_fits(3, 1.0, 0, alive_nodes())  # one node holds 3
    check_fits(6, 1.0, 0, alive_nodes())  # two whole nodes
    with pytest.raises(ConfigError, match="cannot fill whole nodes evenly: use at most 3"):
        check_fits(4, 1.0, 0, alive_nodes())  # 3 + 1 or 2 + 2 over nodes of 3


def test_trial_waits_for_one_node_instead_of_splitting_over_two(two_nodes, tmp_path):
    """Other work holds one CPU on each node, so a 3-worker trial could only be split 2 + 1 (Ray's
    default best-effort PACK does that at once). It is placed on one node once one is free.

    Waiting is observed, not assumed from time passing: the trial's request for its 3 workers
    reaches Ray and Ray reports it cannot place it (4 CPUs are free, but no node has 3), while
    the fit is still running; only then is one node freed."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from recsys.train.ray_trainer import Resources, make_trainer
    from tests.helpers import trainer_config

    @ray.remote(num_cpus=1)
    class Blocker:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    blockers = [
        Blocker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in nodes
    ]
    assert ray.get([b.node.remote() for b in blockers]) == nodes
    steps = {"train.steps": 20, "train.checkpoint_every": 10, "train.eval_every": 20}
    trainer = make_trainer(
        trainer_config(**steps), Resources(3, False, 1.0), name="split", storage_path=str(tmp_path)
    )
    result: dict = {}
    fit = threading.Thread(target=lambda: result.update(r=trainer.fit()))
    fit.start()
    waiting = wait_for_unplaceable_workers(3, fit, timeout=180)
    assert fit.is_alive() and not placed_worker_groups(3), waiting  # not running split 2 + 1
    ray.kill(blockers[1])
    fit.join(timeout=300)
    assert not fit.is_alive() and result["r"].error is None
    assert result["r"].metrics["worker_nodes"] == nodes[1]  # all three workers on the freed node
    ray.kill(blockers[0])


def worker_groups(workers: int) -> list[dict]:
    """Ray's placement groups of ``workers`` one-CPU bundles (a trial's worker group), as
    ``ray.util.placement_group_table`` gives them."""
    import ray

    one_cpu = {"CPU": 1.0}
    return [
        pg for pg in ray.util.placement_group_table().values()
        if len(pg["bundles"]) == workers and all(b == one_cpu for b in pg["bundles"].values())
    ]  # fmt: skip


def placed_worker_groups(workers: int) -> list[dict]:
    return [pg for pg in worker_groups(workers) if pg["state"] == "CREATED"]


def wait_for_unplaceable_workers(workers: int, fit: threading.Thread, timeout: float) -> dict:
    """Until Ray has tried to place a group of ``workers`` one-CPU workers and reported that no
    node has room (``NO_RESOURCES``, still ``PENDING``); that group. Fails at once if one was
    placed or the fit ended, and after ``timeout`` seconds if no such request reached Ray."""
    deadline = time.monotonic() + timeout
    groups: list[dict] = []
    while time.monotonic() < deadline:
        groups = worker_groups(workers)
        assert not placed_worker_groups(workers), f"placed though no node had room: {groups}"
        assert fit.is_alive(), "the fit ended before its workers could be placed"
        for pg in groups:
            if pg["state"] == "PENDING" and pg["stats"]["scheduling_state"] == "NO_RESOURCES":
                return pg
        time.sleep(0.5)
    raise AssertionError(
        f"no request for {workers} workers that Ray could not place within {timeout:.0f} s "
        f"(the trial's start-up too slow, or its request not what this test expects): {groups}"
    )
