"""A training run's nodes as its user should hear of them: a lost node named in one line instead
of the dead actors' tracebacks, and a wait for capacity that says where it stands every
``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (Ray's default: 60 s) and ends after a limit.

Ray Train V2 restarts a worker group whose node died from the last checkpoint (``FailureConfig
(max_failures)``). A group it cannot place (no node holds it: the lost node's capacity did not
come back) times out after ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` and is retried without
end, a traceback each time. ``NodeWatch`` (a Train callback: it runs in the run's controller)
turns each into one line and bounds the wait at ``RECSYS_NODE_WAIT_S`` (default 600 s;
``node_wait_attempts``), after which the run fails with the reason.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2.api.exceptions import ControllerError

WAIT_ENV = "RECSYS_NODE_WAIT_S"
DEFAULT_WAIT_S = 600.0
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # Ray Train's, default 60 s
FAILURE_LOGGER = "ray.train.v2._internal.execution.failure_handling.default"
CONTROLLER_LOGGER = "ray.train.v2._internal.execution.controller.controller"
BACKEND_LOGGER = "ray.train.v2._internal.callbacks.backend_setup"  # the dead group's shutdown


def node_wait_s() -> float:
    """How long a run waits for nodes that can place its workers (``RECSYS_NODE_WAIT_S``)."""
    return float(os.environ.get(WAIT_ENV, "") or DEFAULT_WAIT_S)


def start_timeout_s() -> float:
    """One placement attempt's length: Ray Train's ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``."""
    return float(os.environ.get(START_TIMEOUT_ENV, "") or 60.0)


def node_wait_attempts() -> int:
    """``FailureConfig.controller_failure_limit``: the placement attempts that fill the wait (a
    run that cannot place its workers fails after them, instead of retrying without end)."""
    return max(1, math.ceil(node_wait_s() / start_timeout_s()))


def waiting_for_nodes(error: Any) -> bool:
    """Whether a run's failure is a worker group that found no room within one attempt."""
    return isinstance(error, ControllerError) and isinstance(
        error.controller_failure, WorkerGroupStartupTimeoutError
    )


# a node's raylet killed: its actors are reported dead at once, the node itself after Ray's
# health checks miss it (about 5 s by default); how long a worker's death waits to learn which
NODE_DEATH_WAIT_S = 30.0


def actor_died(error: Exception) -> bool:
    """Whether a worker's failure is its actor's death (not an exception in its code)."""
    from ray.exceptions import RayActorError

    cause = getattr(error, "health_check_failure", None)
    return isinstance(error, RayActorError) or isinstance(cause, RayActorError)


def dead_nodes(node_ids: set[str]) -> set[str]:
    """Those of ``node_ids`` that Ray no longer lists as alive."""
    import ray

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return node_ids - alive


def wait_for_dead_nodes(node_ids: set[str], timeout_s: float) -> set[str]:
    """``dead_nodes``, asked until one is dead or ``timeout_s`` passed (a worker died alone)."""
    deadline = time.monotonic() + timeout_s
    while not (dead := dead_nodes(node_ids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return dead


class QuietKnownFailures(logging.Filter):
    """Drops the controller's traceback logs of the failures ``NodeWatch`` says in one line (a
    lost node's dead workers; a placement attempt that timed out); every other failure is
    logged by Ray as before."""

    def __init__(self, watch: NodeWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "WorkerGroupStartupTimeoutError" in message or "Timed out after" in message:
            return not self.watch.waiting
        lost_node_noise = message.startswith(("[FailurePolicy] RETRY", "Graceful shutdown"))
        return not (self.watch.lost and lost_node_noise)


class NodeWatch(ControllerCallback, WorkerGroupCallback):  # type: ignore[misc]
    """Names a lost node (its IP, id and the ranks it held) and the restart it causes; while the
    run cannot place its workers, a status line per placement attempt, and the reason when it
    gives up. ``label`` starts each line (the trial's name); ``max_failures`` is the run's; the
    wait's limits are read where the run is made (``node_wait_s``, ``start_timeout_s``)."""

    def __init__(self, label: str, max_failures: int) -> None:
        self.label, self.max_failures = label, max_failures
        self.wait_s, self.attempt_s = node_wait_s(), start_timeout_s()
        self.ranks: dict[str, tuple[str, list[int]]] = {}  # node id -> (IP, ranks)
        self.lost: set[str] = set()
        self.failures = 0
        self.waiting = False
        self.wait_started = 0.0
        self.workers = ""

    def after_controller_start(self, train_run_context: Any) -> None:
        for name in (FAILURE_LOGGER, CONTROLLER_LOGGER, BACKEND_LOGGER):
            logging.getLogger(name).addFilter(QuietKnownFailures(self))

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        per = worker_group_context.resources_per_worker
        self.workers = f"{worker_group_context.num_workers} workers of " + ", ".join(
            f"{v:g} {k}" for k, v in sorted(per.items())
        )

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.ranks = {}
        for rank, worker in enumerate(worker_group.get_workers()):
            meta = worker.metadata
            self.ranks.setdefault(meta.node_id, (meta.node_ip, []))[1].append(rank)
        if self.waiting:
            waited = time.monotonic() - self.wait_started
            self.say(f"placed after {waited:.0f} s of waiting for nodes: {self.hosts()}")
        self.waiting, self.lost = False, set()

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        errors = worker_group_status.errors
        if not errors or self.lost or not any(map(actor_died, errors.values())):
            return
        self.lost = wait_for_dead_nodes(set(self.ranks), NODE_DEATH_WAIT_S)
        for node in sorted(self.lost):
            ip, ranks = self.ranks[node]
            self.failures += 1
            self.say(
                f"lost node {ip} ({node[:8]}), which held ranks {ranks}: the worker group "
                f"restarts from its last checkpoint (failure {self.failures} of at most "
                f"{self.max_failures})"
            )

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        error = getattr(current_state, "training_failed_error", None)
        if error is None or not waiting_for_nodes(error):
            return
        if not self.waiting:
            self.waiting, self.wait_started = True, time.monotonic()
        waited, limit = time.monotonic() - self.wait_started, self.wait_s
        if type(current_state).__name__ == "ErroredState":
            self.say(
                f"gave up: no nodes could place {self.workers} within {WAIT_ENV}={limit:g} s "
                f"({self.capacity()})"
            )
            return
        self.say(
            f"waiting for nodes to place {self.workers}: {waited + self.attempt_s:.0f} s "
            f"of {WAIT_ENV}={limit:g} s ({self.capacity()})"
        )

    def hosts(self) -> str:
        return "; ".join(f"{ip}: ranks {r}" for ip, r in self.ranks.values())

    def capacity(self) -> str:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        free = ray.available_resources()
        return (
            f"{len(nodes)} alive nodes, {free.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} "
            "GPUs free"
        )

    def say(self, text: str) -> None:
        print(f"{self.label}: {text}", flush=True)
