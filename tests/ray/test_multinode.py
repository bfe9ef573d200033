"""A cluster of nodes with addresses of their own (127.0.0.2, .3, ... on loopback, each its own
raylet, as separate machines are to Ray): a trial whose workers sit on two nodes trains as on
one; a node lost under a running trial is named and its workers restart from the last
checkpoint on a fresh node; with no capacity back, the run waits with a status line per
placement attempt and then fails with the reason."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from tests.helpers import trainer_config
from tests.servers import agent_ports, ray_node_started

pytestmark = [pytest.mark.ray, pytest.mark.slow]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENV = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
STEPS = {"train.steps": 20, "train.checkpoint_every": 10, "train.eval_every": 20}


@pytest.fixture(scope="module")
def cluster():
    """A head of 1 CPU (drivers; no worker of 2 CPUs fits it) and two 2-CPU nodes at 127.0.0.2
    and 127.0.0.3; tests add and remove nodes. The test process is its driver."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    from recsys.runtime.cluster import connect, local_system_config

    head = {"num_cpus": 1, "_system_config": local_system_config(), **agent_ports()}
    c = ray_node_started(lambda: Cluster(initialize_head=True, head_node_args=head), "head")
    for ip in ("127.0.0.2", "127.0.0.3"):
        add_node(c, 2, ip)
    c.wait_for_nodes()
    connect(c.address, log_to_driver=True)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def add_node(cluster, cpus: int, ip: str, **args):
    """A node of ``cpus`` CPUs at ``ip`` (``args``: more of ``Cluster.add_node``'s), its agents
    on ports the test chose (``tests.servers.agent_ports``); started again where its raylet
    missed Ray's fixed registration wait (``tests.servers.ray_node_started``)."""

    def start():
        return cluster.add_node(num_cpus=cpus, node_ip_address=ip, **args, **agent_ports())

    return ray_node_started(start, f"node {ip}")


def recording_train_func(config: dict) -> None:
    """The real worker, after writing what it was given to ``<out>/rank<R>.json``: Ray Train's
    ranks and the TorchRec topology its planner builds."""
    import ray
    import ray.train

    from recsys.distributed import sharding
    from recsys.train import worker

    ctx = ray.train.get_context()
    seen: dict = {
        "rank": ctx.get_world_rank(),
        "local_rank": ctx.get_local_rank(),
        "local_world_size": ctx.get_local_world_size(),
        "node_rank": ctx.get_node_rank(),
        "env": {
            k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
        },
        "ip": ray.util.get_node_ip_address(),
    }
    real_topology = sharding.topology

    def topology(world_size, local_world_size, machine):
        seen["topology"] = [world_size, local_world_size]
        return real_topology(world_size, local_world_size, machine)

    sharding.topology = topology
    worker.train_func(config)
    Path(config["out"], f"rank{seen['rank']}.json").write_text(json.dumps(seen))


def fit(tmp_path: Path, name: str, workers: int, cpus: float, **kw):
    from recsys.train.ray_trainer import Resources, make_trainer

    trainer = make_trainer(
        trainer_config(**STEPS), Resources(workers, False, cpus), name=name,
        storage_path=str(tmp_path / "storage"), train_loop=recording_train_func, **kw,
    )  # fmt: skip
    out = tmp_path / name
    out.mkdir()
    trainer.train_loop_config["out"] = str(out)
    return trainer, out


@pytest.mark.clusters
def test_a_trial_across_two_nodes_trains_as_on_one(cluster, tmp_path):
    trainer, out = fit(tmp_path, "two_nodes", workers=2, cpus=2.0)
    across = trainer.fit()
    assert across.error is None
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert {r["ip"] for r in ranks} == {"127.0.0.2", "127.0.0.3"}  # one worker on each node
    for r in ranks:
        assert (r["local_rank"], r["local_world_size"]) == (0, 1)
        assert r["node_rank"] == r["rank"]  # node ranks in rank order: rank r on host r
        assert r["env"] == {
            "RANK": str(r["rank"]), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "NODE_RANK": str(r["node_rank"]),
        }  # fmt: skip
        assert r["topology"] == [2, 1]  # TorchRec plans for 2 hosts of 1 worker
    assert len(across.metrics["worker_nodes"].split(",")) == 2

    node = add_node(cluster, 4, "127.0.0.4")  # holds both workers
    cluster.wait_for_nodes()
    try:
        trainer, out = fit(tmp_path, "one_node", workers=2, cpus=2.0)
        one = trainer.fit()
        assert one.error is None
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert {r["ip"] for r in ranks} == {"127.0.0.4"}
        assert sorted(r["local_rank"] for r in ranks) == [0, 1]
        assert all(r["topology"] == [2, 2] and r["node_rank"] == 0 for r in ranks)
    finally:
        cluster.remove_node(node)
    for key in ("loss", "val_auc", "val_log_loss", "step", "epochs_done"):
        assert across.metrics[key] == pytest.approx(one.metrics[key], rel=1e-5, abs=1e-6), key


def worker_group_node(cpus: float, workers: int) -> str | None:
    """The node id of the placed group of ``workers`` bundles of ``cpus`` CPUs (all on one)."""
    import ray

    for pg in ray.util.placement_group_table().values():
        bundles = list(pg["bundles"].values())
        ours = len(bundles) == workers and all(b == {"CPU": cpus} for b in bundles)
        if pg["state"] == "CREATED" and ours:
            return next(iter(set(pg["bundles_to_node_id"].values())))
    return None


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def node_of(cluster, node_id: str):
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


LOST_SPACE = """
base: debug
num_samples: 1
overrides:
  embeddings.num_embeddings: [50, 200, 1000, 3000]
  embeddings.dim: 8
  model.bottom_mlp: [8]
  model.top_mlp: [8]
  data.synthetic.num_samples: 8000
  train.steps: 120
  train.batch_size: 64
  train.checkpoint_every: 10
  train.eval_every: 20
  train.log_every: 10
space:
  model.interaction: {choice: [dot]}
"""


@pytest.mark.clusters
def test_a_lost_node_is_named_and_its_sweep_trial_restarts_on_a_fresh_one(cluster, tmp_path, capfd):
    """The node that holds a running sweep trial's 2 workers dies (killed, not drained); a fresh
    node joins: the trial restarts from its last checkpoint, the sweep finishes, and MLflow has
    one run for the trial with every step once."""
    uri, result, sweep = lost_sweep(tmp_path, "lost", 2, LOST_SPACE)
    thread = threading.Thread(target=sweep)
    thread.start()
    held = wait_for(lambda: worker_group_node(1.0, 2), 240, "the trial's workers placed")
    storage = tmp_path / "storage"
    wait_for(lambda: list(storage.glob("lost/train/*/step_*")), 300, "a first checkpoint")
    lost = node_of(cluster, held)
    ip = lost.node_ip_address
    cluster.remove_node(lost, allow_graceful=False)
    fresh = add_node(cluster, 2, "127.0.0.5")
    thread.join(timeout=500)
    assert not thread.is_alive(), "the sweep did not end after the fresh node joined"
    steps = trial_steps(uri, "lost", result, "loss")
    assert steps == sorted(set(steps)) and steps[-1] == 120, steps  # every step once, in order
    console = capfd.readouterr()
    assert f"lost node {ip} ({held[:8]}), which held ranks [0, 1]" in console.out, console
    assert "the worker group restarts from its last checkpoint" in console.out
    assert "ActorDiedError" not in console.out + console.err  # the dead actors' tracebacks
    cluster.remove_node(fresh)


LONGER = {"train.steps": 3000, "train.checkpoint_every": 100, "train.eval_every": 1000}


@pytest.mark.clusters
def test_a_lost_node_under_a_one_worker_trial_restarts_it_elsewhere(
    cluster, tmp_path, capfd, caplog
):
    """The node that holds a running sweep trial of one CPU worker (trained in its Tune trial's
    process, ``recsys.train.inline``) dies: Tune starts the trial again on another node, which
    resumes from its last checkpoint; the sweep finishes, and MLflow has one run for the trial
    with every step once."""
    from recsys.train.nodes import TUNE_CONTROLLER_LOGGER

    longer = "".join(f"  {k}: {v}\n" for k, v in LONGER.items())
    space = LOST_SPACE.replace("space:\n", longer + "space:\n")
    uri, result, sweep = lost_sweep(tmp_path, "lost1", 1, space)
    run = tmp_path / "storage" / "lost1" / "train" / "*"
    held, done = lose_the_node_of(cluster, sweep, run, "127.0.0.10")
    steps = trial_steps(uri, "lost1", result, "step")
    assert steps == sorted(set(steps)) and steps[-1] == 3000, steps  # every report once
    assert done["step"] == 3000 and done["worker_nodes"] != held  # finished on another node
    assert "resumed from step" in capfd.readouterr().out
    tune_said = [r for r in caplog.records if r.name == TUNE_CONTROLLER_LOGGER]
    assert tune_said, caplog.text  # Tune's record of the lost trial: one line, no traceback
    for record in tune_said:
        assert "its process was lost (ActorUnavailableError: " in record.getMessage()
        assert record.exc_info is None


@pytest.mark.clusters
def test_a_lost_node_under_a_one_worker_training_task_runs_it_elsewhere(cluster, tmp_path, capfd):
    """The same for a training outside a sweep (``recsys-train``, a refit, a retrain's) of one
    CPU worker, in a Ray task (``recsys.train.launch``): the task is submitted again from its
    last checkpoint, with one line saying so, and goes on on another node."""
    from recsys.train.launch import make_run
    from recsys.train.ray_trainer import Resources

    said: list[str] = []
    cfg = trainer_config(**{**STEPS, **LONGER})
    run = make_run(cfg, Resources(1, False, 1.5), name="task", max_failures=1,
                   storage_path=str(tmp_path / "storage"), log=said.append)  # fmt: skip
    result: dict = {}
    held, done = lose_the_node_of(cluster, lambda: result.update(r=run.fit()),
                                  tmp_path / "storage" / "task", "127.0.0.11")  # fmt: skip
    assert result["r"].metrics["step"] == 3000
    assert done["step"] == 3000 and done["worker_nodes"] != held  # finished on another node
    assert len(said) == 1 and "trying again from its last checkpoint (1 of 1)" in said[0], said
    assert "resumed from step" in capfd.readouterr().out


def lost_sweep(tmp_path: Path, name: str, workers: int, space_text: str):
    """A one-trial sweep ``name`` of ``space_text`` with ``workers`` workers of 1 CPU and one
    retry: its SQLite store's URI, the dict its rows land in (``t``) and the function that runs
    it."""
    from recsys.tracking.tracker import Tracker
    from recsys.tune import space as spaces
    from recsys.tune.sweep import SweepOptions, run_sweep

    (tmp_path / "lost.yaml").write_text(space_text)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = SweepOptions(
        name=name, storage=str(tmp_path / "storage"), tracking_uri=uri, num_samples=1,
        num_workers=workers, cpus_per_worker=1.0, max_failures=1,
    )  # fmt: skip
    space = spaces.load(str(tmp_path / "lost.yaml"))
    result: dict = {}

    def sweep() -> None:
        result.update(t=run_sweep(space, opts, Tracker(uri), restore=False))

    return uri, result, sweep


def trial_steps(uri: str, name: str, result: dict, metric: str) -> list[int]:
    """The steps of ``metric`` in the MLflow run of sweep ``name``'s one trial, which finished
    (its row in ``result``)."""
    from mlflow import MlflowClient

    (row,) = result["t"]
    assert row["status"] == "finished", row
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    (run,) = client.search_runs([exp.experiment_id], "tags.`recsys.kind` = 'trial'")
    return [m.step for m in client.get_metric_history(run.info.run_id, metric)]


def lose_the_node_of(cluster, train, run: Path, fresh_ip: str) -> tuple[str, dict]:
    """Run ``train`` (a one-worker training of more than 1 CPU: no room on the head) in a
    thread; kill the node it trains on once its first checkpoint has its report, and add a
    fresh node at ``fresh_ip`` (the cluster keeps its size); the node that was lost and the
    run's last report once ``train`` ended."""
    thread = threading.Thread(target=train)
    thread.start()
    reports = wait_for(lambda: sorted(run.parent.glob(f"{run.name}/step_*/metrics.json")),
                       300, "a first checkpoint with its report")  # fmt: skip
    held = json.loads(reports[0].read_text())["worker_nodes"]  # (the node it trained on)
    cluster.remove_node(node_of(cluster, held), allow_graceful=False)
    add_node(cluster, 2, fresh_ip)
    thread.join(timeout=500)
    assert not thread.is_alive(), "the training did not end after its node was lost"
    last = sorted(run.parent.glob(f"{run.name}/step_*/metrics.json"))[-1]
    return held, json.loads(last.read_text())


def test_with_no_capacity_back_the_run_waits_then_fails_with_the_reason(
    cluster, tmp_path, capfd, monkeypatch
):
    """A run's 2 workers of 2 CPUs sit on two nodes; one node dies and none comes: the run says
    it waits, a line per placement attempt (5 s here; Ray's default 60 s), and fails once
    RECSYS_NODE_WAIT_S (12 s here) passed since the node was lost."""
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    monkeypatch.setenv("RECSYS_NODE_WAIT_S", "12")
    from ray.train.v2.api.exceptions import ControllerError

    from recsys.runtime.cluster import runtime_env

    # a sweep's trials make their runs in Ray's processes: the limits travel with them
    assert runtime_env()["env_vars"]["RECSYS_NODE_WAIT_S"] == "12"
    # two nodes of their own (a resource only they have): what earlier tests left elsewhere
    # cannot change where the run goes
    kept = add_node(cluster, 2, "127.0.0.8", resources={"stuck": 1})
    extra = add_node(cluster, 2, "127.0.0.6", resources={"stuck": 1})
    cluster.wait_for_nodes()
    trainer, _ = fit(tmp_path, "stuck", workers=2, cpus=2.0, max_failures=1)
    trainer.scaling_config.resources_per_worker = {"CPU": 2.0, "stuck": 1.0}
    trainer.train_loop_config["experiment"]["train"]["steps"] = 400
    failed: dict = {}
    thread = threading.Thread(target=lambda: failed.update(e=raises(trainer.fit)))
    thread.start()
    wait_for(lambda: list((tmp_path / "storage" / "stuck").glob("step_*")), 300, "a checkpoint")
    cluster.remove_node(extra, allow_graceful=False)  # one of the two nodes it runs on
    thread.join(timeout=300)
    cluster.remove_node(kept)
    assert not thread.is_alive(), "the run never gave up"
    assert isinstance(failed["e"], ControllerError), failed
    assert "gave up: no nodes could place 2 workers of 2 CPU" in str(failed["e"])
    out = capfd.readouterr().out
    assert "stuck: lost node 127.0.0.6" in out, out
    assert out.count("stuck: waiting for nodes to place 2 workers of 2 CPU") >= 1, out
    gave_up = "stuck: gave up: no nodes could place 2 workers of 2 CPU, 1 stuck within "
    gave_up += "RECSYS_NODE_WAIT_S=12 s of losing a node"
    assert gave_up in out, out
    assert "WorkerGroupStartupTimeoutError" not in out  # the attempts' tracebacks


def raises(fn) -> BaseException | None:
    """The exception ``fn()`` raised (None if none)."""
    try:
        fn()
    except BaseException as e:  # what the test thread hands to the test
        return e
    return None


def test_a_trial_no_node_holds_waits_for_nodes_then_goes_or_is_refused(cluster, capsys):
    """``--wait-for-nodes``: no node holds a 4-CPU worker; the launch asks the autoscaler, waits
    and goes on once a node that holds it joins; with no node coming the refusal stands, with
    the time waited. Without the flag it is refused at once."""
    from recsys.configlib import ConfigError
    from recsys.runtime.cluster import wait_for_fit

    with pytest.raises(ConfigError, match="can place 0 such workers"):
        wait_for_fit(1, 4.0, 0.0, 0.1, wait_s=0)
    with pytest.raises(ConfigError, match=r"can place 0 such workers.*\(waited \d+ s for nodes"):
        wait_for_fit(1, 4.0, 0.0, 0.1, wait_s=3, poll_s=0.5)
    assert "waiting up to 3 s for nodes (--wait-for-nodes)" in capsys.readouterr().out

    done = threading.Event()
    waiter = threading.Thread(
        target=lambda: (wait_for_fit(1, 4.0, 0.0, 0.1, wait_s=300, poll_s=0.5), done.set())
    )
    waiter.start()
    wait_for(lambda: "waiting up to 300 s" in capsys.readouterr().out, 60, "the wait to start")
    assert not done.is_set()
    node = add_node(cluster, 4, "127.0.0.7")
    try:
        waiter.join(timeout=120)
        assert done.is_set(), "the wait did not end when a node that holds the worker joined"
        assert "nodes came after" in capsys.readouterr().out
    finally:
        cluster.remove_node(node)
