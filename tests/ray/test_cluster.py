"""A sweep on a simulated two-node cluster with shared storage: trials land on both nodes."""

from __future__ import annotations

import os

import pytest

from recsys.tune import space as spaces
from recsys.tune.sweep import SweepOptions, run_sweep
from recsys.tune.tracking import Tracker
from tests.ray.spaces import write_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def two_nodes():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    from recsys.cluster import connect

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    connect(cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_sweep_spreads_over_two_nodes(two_nodes, tmp_path):
    import ray

    from recsys.cluster import alive_nodes, check_fits

    assert len(alive_nodes()) == 2
    check_fits(2, 0.9, 0, alive_nodes(), extra_cpus=0.1)
    with pytest.raises(Exception, match="can place 4 such workers"):
        check_fits(5, 0.9, 0, alive_nodes(), extra_cpus=0.1)
    space = spaces.load(write_space(tmp_path, steps=20))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(
        name="two",
        storage=str(tmp_path / "shared"),
        tracking_uri=uri,
        num_samples=2,
        max_concurrent=2,
        cpus_per_worker=0.9,
    )
    table = run_sweep(space, opts, Tracker(uri), restore=False)
    assert len(table) == 4 and all(r["status"] == "ok" for r in table)
    used = set()
    for row in table:
        used |= set(row["worker_nodes"].split(","))
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert used == node_ids, (used, node_ids)
