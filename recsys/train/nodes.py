"""A training run's nodes as its user should hear of them: a lost node named in one line instead
of the dead actors' tracebacks, and, while no node can place the workers again, a status line
per placement attempt (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, Ray's default 60 s) and an
end after ``RECSYS_NODE_WAIT_S``.

Ray Train V2 restarts a worker group whose node died from the last checkpoint (``FailureConfig
(max_failures)``). A group it cannot place times out after
``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` and is retried without end, a traceback each time.
``NodeWatch`` (a Train callback: it runs in the run's controller, an async actor, so it never blocks
for long: once workers died, a probe of each of their nodes' raylets, up to a second a node) says
each in one line. A node is lost when Ray no longer lists it as alive, or when its raylet does not
answer: Ray marks a node dead only after its heartbeats have been missed for seconds, and Train may
have restarted the group by then. Only a run that lost a node gives up waiting: a run queued behind
other trials of a sweep (``--max-concurrent`` above what the cluster holds at once) waits for its
turn as before.
"""

from __future__ import annotations

import logging
import os
import re
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
NODE_DIED = re.compile(r"node has died\. Node Id: ([0-9a-f]+)|node was terminated")


def node_wait_s() -> float:
    """How long a run that lost a node waits for nodes that can place its workers again."""
    return float(os.environ.get(WAIT_ENV, "") or DEFAULT_WAIT_S)


def start_timeout_s() -> float:
    """One placement attempt's length: Ray Train's ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``."""
    return float(os.environ.get(START_TIMEOUT_ENV, "") or 60.0)


class NodesGone(RuntimeError):
    """No node could place a run's workers within ``RECSYS_NODE_WAIT_S`` after it lost one."""


def waiting_for_nodes(error: Any) -> bool:
    """Whether a run's failure is a worker group that found no room within one attempt."""
    return isinstance(error, ControllerError) and isinstance(
        error.controller_failure, WorkerGroupStartupTimeoutError
    )


def actor_died(error: Exception) -> bool:
    """Whether a worker's failure is its actor's death (not an exception in its code)."""
    from ray.exceptions import RayActorError

    cause = getattr(error, "health_check_failure", None)
    return isinstance(error, RayActorError) or isinstance(cause, RayActorError)


def died_with_node(error: Exception) -> bool:
    """Whether Ray says a worker's actor died because its node did."""
    return bool(NODE_DIED.search(str(getattr(error, "health_check_failure", error))))


def alive_node_ids() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


RAYLET_PROBE_S = 1.0  # how long a node's raylet has to accept a connection to count as up


def answering_node_ids(nodes: set[str]) -> set[str]:
    """Those of ``nodes`` that Ray lists as alive and whose raylet accepts a connection within
    ``RAYLET_PROBE_S``: a node whose raylet is gone (refused, or no answer) is lost at once,
    where Ray marks it dead only once its heartbeats have been missed for seconds (by then
    Train may have restarted the group, its deaths unsaid). A node Ray lists without an address
    to probe counts as up, as Ray says."""
    import socket

    import ray

    up = set()
    for n in ray.nodes():
        if n["NodeID"] not in nodes or not n.get("Alive"):
            continue
        try:
            address = (str(n["NodeManagerAddress"]).strip("[]"), int(n["NodeManagerPort"]))
        except (KeyError, TypeError, ValueError):
            up.add(n["NodeID"])
            continue
        try:
            socket.create_connection(address, timeout=RAYLET_PROBE_S).close()
        except (OSError, OverflowError):
            continue
        up.add(n["NodeID"])
    return up


def exception_of(record: logging.LogRecord) -> Any:
    """The exception a log record carries, where it carries one."""
    return record.exc_info[1] if record.exc_info else None


class QuietKnownFailures(logging.Filter):
    """Drops the controller's traceback logs of what ``NodeWatch`` says in one line, by the
    exception they carry: a placement attempt that timed out, and the dead workers of a lost
    node (the failure decision and the dead group's shutdown). Every other record stays."""

    def __init__(self, watch: NodeWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        error = exception_of(record)
        if isinstance(error, WorkerGroupStartupTimeoutError) or waiting_for_nodes(error):
            return False
        if not self.watch.lost_since:
            return True
        if record.name == BACKEND_LOGGER:
            return not actor_died(error) if error is not None else True
        return not (record.name == FAILURE_LOGGER and self.watch.lost_error(error))


TUNE_CONTROLLER_LOGGER = "ray.tune.execution.tune_controller"


class LostTrialProcess(logging.Filter):
    """Tune's record of a failed trial whose process was lost (a ``RayActorError``: its node
    gone, the process killed; a trial of one CPU worker trains there, ``recsys.train.inline``)
    in one line in place of the traceback: Tune tries the trial again from its last checkpoint
    while its ``--max-failures`` allow. A trial's own error, an actor that failed in its
    creation, and Tune's other records keep their tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ray.exceptions import RayActorError

        error = exception_of(record)
        failed = str(record.msg).startswith("Trial task failed for trial")
        if failed and isinstance(error, RayActorError) and not error.actor_init_failed:
            record.msg = (f"{record.getMessage()}: its process was lost ({type(error).__name__}: "
                          f"{what_happened(error)}); Tune tries it again from its last "
                          "checkpoint while --max-failures allows")  # fmt: skip
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def what_happened(error: Exception) -> str:
    """An actor's death in a line: its message's first line and, where Ray says more (a node
    that died, a process killed for memory), its last."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def quiet_lost_trial_processes() -> None:
    """``LostTrialProcess`` on Tune's controller's logger in this process (once)."""
    log = logging.getLogger(TUNE_CONTROLLER_LOGGER)
    if not any(isinstance(f, LostTrialProcess) for f in log.filters):
        log.addFilter(LostTrialProcess())


class NodeWatch(ControllerCallback, WorkerGroupCallback):  # type: ignore[misc]
    """Names a lost node (its IP, id and the ranks it held) and the restart it causes; while the
    run cannot place its workers, a status line per placement attempt; after a lost node, the
    run fails with the reason once ``RECSYS_NODE_WAIT_S`` passed without room. ``label`` starts
    each line (the run's name); the limits are read where the run is made."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.wait_s, self.attempt_s = node_wait_s(), start_timeout_s()
        self.ranks: dict[str, tuple[str, list[int]]] = {}  # node id -> (IP, its ranks)
        self.suspect = False  # workers died; their node's death may not be known yet
        self.lost_since = 0.0  # when a node was lost (0: none since the group last started)
        self.waiting_since = 0.0
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
        self.name_lost_nodes()  # the old group's, if their deaths were not known before
        if self.waiting_since:
            waited = time.monotonic() - self.waiting_since
            self.say(f"placed after {waited:.0f} s of waiting for nodes")
        self.ranks = {}
        for rank, worker in enumerate(worker_group.get_workers()):
            meta = worker.metadata
            self.ranks.setdefault(meta.node_id, (meta.node_ip, []))[1].append(rank)
        self.suspect, self.lost_since, self.waiting_since = False, 0.0, 0.0

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        errors = list(worker_group_status.errors.values())
        if not errors or self.lost_since:
            return
        # any failure may be a lost node's: the dead ranks' own, or a survivor's (its peer's
        # connection reset) that reaches the controller first
        self.suspect = True
        said = {m.group(1) for e in errors if (m := NODE_DIED.search(str(e))) and m.group(1)}
        self.name_lost_nodes(said)

    def name_lost_nodes(self, known: set[str] | None = None) -> None:
        """Say which of the group's nodes died (those Ray named, no longer lists as alive, or
        whose raylet does not answer), once; nothing while none is known to have died (the next
        hook asks again)."""
        if not self.suspect or self.lost_since:
            return
        nodes = set(self.ranks)
        lost = sorted((nodes - answering_node_ids(nodes)) | ((known or set()) & nodes))
        for node in lost:
            ip, ranks = self.ranks[node]
            self.say(
                f"lost node {ip} ({node[:8]}), which held ranks {ranks}: the worker group "
                "restarts from its last checkpoint where nodes can hold it"
            )
        if lost:
            self.lost_since = time.monotonic()

    def lost_error(self, error: Any) -> bool:
        """Whether ``error`` is the failure of a group that lost its node (said already)."""
        from ray.train.v2.api.exceptions import WorkerGroupError

        if not isinstance(error, WorkerGroupError):
            return False
        return all(actor_died(e) for e in error.worker_failures.values())

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        self.name_lost_nodes()
        error = getattr(current_state, "training_failed_error", None)
        if error is None or not waiting_for_nodes(error):
            return
        now = time.monotonic()
        self.waiting_since = self.waiting_since or now - self.attempt_s
        waited = now - self.waiting_since
        if not self.lost_since:  # queued behind other runs: it waits for its turn
            self.say(f"waiting for nodes to place {self.workers}: {waited:.0f} s "
                     f"({self.capacity()})")  # fmt: skip
            return
        since = now - self.lost_since
        if since >= self.wait_s:
            why = (f"gave up: no nodes could place {self.workers} within {WAIT_ENV}="
                   f"{self.wait_s:g} s of losing a node ({self.capacity()})")  # fmt: skip
            self.say(why)
            raise NodesGone(f"{self.label}: {why}")
        self.say(f"waiting for nodes to place {self.workers}: {since:.0f} s of {WAIT_ENV}="
                 f"{self.wait_s:g} s ({self.capacity()})")  # fmt: skip

    def capacity(self) -> str:
        """The alive nodes and the free CPUs and GPUs, for a status line."""
        import ray

        nodes = alive_node_ids()
        free = ray.available_resources()
        return (
            f"{len(nodes)} alive nodes, {free.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} "
            "GPUs free"
        )

    def say(self, text: str) -> None:
        """One line on the run's console (the controller's output reaches the driver's)."""
        print(f"{self.label}: {text}", flush=True)
