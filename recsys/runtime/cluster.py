"""Connecting to Ray and checking that a request fits the cluster before anything launches.

Ray Train V2 waits forever for a worker group it cannot place (a retry every 60 s, no error), so an
impossible request must be refused up front, with the numbers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any

from recsys.configlib import ConfigError, option

# Ray Train V2's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default 2 s)
# and takes one report per poll, so every ray.train.report waited up to 2 s (measured: 2.0 s per
# report, 15.7 s of a 37 s smoke trial). 0.1 s cuts that twentyfold for a little controller CPU
# (two actor calls per poll): the overhead benchmark's 10 reports took 0.29 s in all at 0.1 s, as
# at 0.05 s (with the MLflow store opened early: recsys.tracking.report).
#
# Ray Train V2 also starts a PreemptionWatcher actor per run, for ray.train.get_preemption_info(),
# which this project does not read (worker failures are handled by FailureConfig either way); Ray
# core logs an error line about that actor's restart arguments for every trial. Off.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


# settings read in Ray's processes (a run's controller), passed on from the driver where set: how
# long a run waits for nodes to place its workers, and one placement attempt (recsys.train.nodes)
FORWARDED_ENV = ("RECSYS_NODE_WAIT_S", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")


def runtime_env() -> dict[str, Any]:
    """Environment for every Ray process of ours (a user's own setting wins)."""
    env = {k: os.environ.get(k, v) for k, v in TRAIN_ENV.items()}
    env.update({k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)})
    return {"env_vars": env}


ADDRESS_ENV = "RAY_ADDRESS"


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """Where a command's Ray Train workers run: the flags every command that trains takes
    (``recsys-sweep``, ``recsys-train``, ``recsys-export --refit``, ``recsys-retrain``), each
    declared once here with its one default."""

    num_workers: int = option(2, "Ray Train workers per training run (its ranks)", kind="count")
    cpus_per_worker: float = option(0.95, "CPUs reserved per worker", kind="positive")
    use_gpu: bool = option(False, "one GPU per worker (NCCL)", flag="--gpus", kind="flag")
    wait_for_nodes: float = option(
        0.0, "where no node can hold the workers yet, ask the autoscaler and wait up to S "
        "seconds for nodes before refusing (an autoscaling cluster, KubeRay; 0, the "
        "default: refuse at once)", metavar="S",
    )  # fmt: skip


@dataclass(frozen=True)
class RaySource:
    """Which Ray a command runs on, and why: ``address`` None starts a local Ray of this process;
    ``origin`` says where the address came from (``--address``, ``RAY_ADDRESS``, or this node's
    running cluster), as an error about it must say."""

    address: str | None
    origin: str = ""

    @property
    def local(self) -> bool:
        return self.address is None


def node_cluster_file() -> str:
    """Where ``ray start`` on this node writes its cluster's address (``ray stop`` removes it):
    ``ray_current_cluster`` in Ray's temp folder (``$RAY_TMPDIR``, else ``/tmp``, then ``ray``)."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def node_cluster() -> str | None:
    """The address of the cluster ``ray start`` runs on this node, as ``ray.init()`` finds it
    (None if there is none). A Ray that another process started for itself
    (``ray.init(address="local")``, another sweep's) writes no such file and is never joined."""
    try:
        with open(node_cluster_file()) as f:
            return f.read().strip() or None
    except OSError:
        return None


def find_ray(flag: str | None) -> RaySource:
    """Ray's rules for which Ray to use: ``--address`` wins (``local``: a new local Ray; ``auto``:
    this node's running cluster); else ``RAY_ADDRESS`` (as ``ray job submit`` sets it; the same
    two words); else the cluster ``ray start`` runs on this node; else a new local Ray."""
    if flag:
        return _named(flag, "--address")
    if env := os.environ.get(ADDRESS_ENV, "").strip():
        return _named(env, ADDRESS_ENV)
    if running := node_cluster():
        return RaySource(running, f"this node's running cluster, {node_cluster_file()}")
    return RaySource(None)


def _named(value: str, origin: str) -> RaySource:
    """The Ray that a flag's or variable's ``value`` names (``origin``: which it was)."""
    if value == "local":
        return RaySource(None, f"{origin}=local")
    if value == "auto":
        if not (running := node_cluster()):
            raise ConnectionError(
                f"{origin}=auto: no Ray cluster runs on this node ({node_cluster_file()} is "
                "absent: start one with `.venv/bin/ray start --head`, or give the head's address)"
            )
        return RaySource(running, f"{origin}=auto, {node_cluster_file()}")
    if value.startswith(("http://", "https://")):
        raise ConnectionError(
            f"{origin}={value} is a dashboard (Ray Jobs) address; a driver joins the cluster at "
            "its GCS address (HEAD:6379). Submit with `ray job submit --address "
            f"{value} -- ...` (the job then finds its cluster), or set {origin} to HEAD:6379"
        )
    return RaySource(value, origin)


def check_answers(source: RaySource, timeout_s: float = 5.0) -> None:
    """Refuse, within ``timeout_s``, an address at which nothing answers (a dead cluster, a stale
    ``RAY_ADDRESS`` or ``ray_current_cluster``), naming it and where it came from; ``ray.init``
    itself would retry for minutes."""
    if source.address is None:
        return
    hostport = source.address.removeprefix("ray://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConnectionError(
            f"{source.origin}: {source.address!r} is not a Ray address (HOST:PORT, "
            "ray://HOST:PORT, auto or local)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        hint = (
            " (a cluster `ray start` ran on this node and that is gone: `ray stop` clears it, "
            "or pass --address local)"
            if "ray_current_cluster" in source.origin
            else ""
        )
        raise ConnectionError(
            f"no Ray cluster answers at {source.address} (from {source.origin}): {e}{hint}"
        ) from None


def connect(
    address: str | RaySource | None,
    num_cpus: int | None = None,
    log_to_driver: bool = True,
    object_store_memory: int | None = None,
    dashboard: bool = True,
    announce: bool = True,
) -> dict[str, Any]:
    """``ray.init`` the Ray that ``find_ray(address)`` names (or ``address``, resolved already):
    an existing cluster, or a new local one; returns its resources. ``announce``: print which,
    as one line ("joined the Ray cluster at ... (from RAY_ADDRESS): 3 nodes, 4 CPUs, 0 GPUs" or
    "started a local Ray: 2 CPUs").

    The local-only settings apply only to a Ray started here: ``num_cpus``,
    ``object_store_memory`` (the object store's cap in MiB), the dashboard (bound to 127.0.0.1;
    ``RAY_DASHBOARD_HOST`` changes that) and the workers' niceness. ``dashboard=False``: a local
    Ray without the dashboard and its State API (preparation, which runs plain tasks, saves its
    processes' memory; Ray Train needs them).

    A local Ray is always a new one of this process (``address="local"``), and every process of it
    is told its own dashboard (``RAY_API_SERVER_ADDRESS``): Ray's State API, which Ray Train's
    placement-group cleaner queries, otherwise looks for "the" local Ray and fails with "Found
    multiple active Ray instances" when another sweep or training runs on the same machine.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    token_notice()
    if not (sys.stdout.isatty() and sys.stderr.isatty()):  # no colour codes in a file or pipe:
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # the workers' line prefixes (a user's 1
        plain_ray_messages()  # wins) and Ray's own dashboard line
    own_ray_line()
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    source = address if isinstance(address, RaySource) else find_ray(address)
    check_answers(source)
    if os.environ.get(API_ENV) and os.environ.get(API_ENV) == os.environ.get(OURS_ENV):
        del os.environ[API_ENV]  # set by an earlier connect (here or in a parent): stale
    if os.environ.get(ADDRESS_ENV, source.address) not in (source.address, "local"):
        # another Ray than the one chosen (the flag won): not for this process's later Ray
        # calls (the State API reads it) nor for the processes it starts
        del os.environ[ADDRESS_ENV]
    if source.local:
        context = _start_local(num_cpus, log_to_driver, object_store_memory, dashboard)
    else:
        context = _join(source, log_to_driver)
    quiet_teardown()
    resources = ray.cluster_resources()
    if announce:
        print(ray_line(source, resources, len(alive_nodes()), context), flush=True)
    return resources


def _join(source: RaySource, log_to_driver: bool) -> Any:
    """``ray.init`` of the cluster at ``source.address``; its context."""
    import ray

    try:
        return ray.init(
            address=source.address, log_to_driver=log_to_driver, runtime_env=runtime_env()
        )
    except ConnectionError as e:
        where = f"{source.address} ({source.origin})"
        raise ConnectionError(f"could not join Ray at {where}: {e}") from e


def _start_local(
    num_cpus: int | None, log_to_driver: bool, object_store_mb: int | None, dashboard: bool
) -> Any:
    """``ray.init`` of a new local Ray with the local-only settings; its context."""
    import ray

    kwargs: dict[str, Any] = {
        "log_to_driver": log_to_driver,
        "runtime_env": runtime_env(),
        "num_cpus": num_cpus,
        "object_store_memory": object_store_mb * 2**20 if object_store_mb else None,
        "_system_config": local_system_config(),
    }
    if not dashboard:
        return ray.init(address="local", include_dashboard=False, **kwargs)
    host = os.environ.get("RAY_DASHBOARD_HOST", "127.0.0.1")
    port = _free_port(host)
    api = f"http://{_url_host(host)}:{port}"
    kwargs["runtime_env"]["env_vars"][API_ENV] = api
    context = ray.init(address="local", dashboard_host=host, dashboard_port=port, **kwargs)
    os.environ[API_ENV] = os.environ[OURS_ENV] = api  # this process's own State API calls
    return context


def ray_line(source: RaySource, resources: dict[str, float], nodes: int, context: Any) -> str:
    """The console's line saying which Ray this command runs on."""
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    dashboard = getattr(context, "dashboard_url", None)
    if dashboard and "://" not in dashboard:
        dashboard = f"http://{dashboard}"
    board = f"; dashboard {dashboard}" if dashboard else ""
    if source.local:
        why = f" ({source.origin})" if source.origin else ""
        gpu = f", {gpus:g} GPUs" if gpus else ""
        return f"started a local Ray{why}: {cpus:g} CPUs{gpu}{board}"
    return (
        f"joined the Ray cluster at {source.address} (from {source.origin}): {nodes} node"
        f"{'s' if nodes != 1 else ''}, {cpus:g} CPUs, {gpus:g} GPUs{board}"
    )


# Ray starts its worker processes at nice 15 (its ``worker_niceness``), which keeps a laptop's
# driver responsive but here lowers the training itself: next to any process at nice 0 (a build,
# a second job, a busy loop), a trial's workers got about 3% of a core (measured on 2 cores, every
# trial about 30x slower, until Tune's and the tests' timeouts fired). The workers are the job, so
# a local Ray runs them at the driver's priority, as Ray's own job manager does for job drivers.
# A user's ``RAY_worker_niceness`` wins; a cluster (``address``) keeps its own setting.
NICENESS_ENV = "RAY_worker_niceness"


def local_system_config() -> dict[str, Any]:
    """Ray's ``_system_config`` for a local Ray of ours: its workers at nice 0."""
    return {} if NICENESS_ENV in os.environ else {"worker_niceness": 0}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PlainText(logging.Filter):
    """Strips terminal colour codes from a record (Ray colours its dashboard link whatever the
    console is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = ANSI.sub("", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(ANSI.sub("", a) if isinstance(a, str) else a for a in record.args)
        return True


TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


class TokenNotice(logging.Filter):
    """Ray's notice that a new local Ray turned token authentication on, said as what it means
    here: the sweep's own Ray, reachable only with the token Ray stored for this user."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Token authentication is enabled"):
            record.msg = (
                "Ray: token authentication is on for this local Ray (the token is in "
                "~/.ray/auth_token; nothing to do; RAY_AUTH_MODE=disabled turns it off)"
            )
            record.args = ()
        return True


def token_notice() -> None:
    """Ray's token notice said as ``TokenNotice`` says it (once per process)."""
    log = logging.getLogger(TOKEN_LOGGER)
    if not any(isinstance(f, TokenNotice) for f in log.filters):
        log.addFilter(TokenNotice())


def drop_sigterm_tracebacks(lines: list[str]) -> list[str]:
    """``lines`` of a worker's stderr without the traceback of Ray's SIGTERM handler raised
    inside a callback whose exceptions Python ignores.

    Ray ends an actor it no longer needs (a trial's, Train's queue actor) with SIGTERM, and its
    handler (``sigterm_handler``) raises ``SystemExit`` wherever the main thread is. Inside a
    weakref callback or finalizer Python cannot propagate it and prints ``Exception ignored
    in: ...``, the traceback and ``SystemExit: 1``; the process still exits as Ray meant it to
    (its shutdown and MLflow's last writes run from ``atexit`` either way). Only such a block
    whose frames name ``sigterm_handler`` and which ends in ``SystemExit`` is dropped; every
    other line, other ignored exceptions included, is kept in order."""
    out: list[str] = []
    block: list[str] | None = None
    for line in lines:
        if line.startswith("Exception ignored in"):
            out += block or []
            block = [line]
        elif block is not None:
            block.append(line)
            if line.startswith("SystemExit"):
                if not any("sigterm_handler" in b for b in block):
                    out += block
                block = None
        else:
            out.append(line)
    return out + (block or [])


def short_raylet_death(lines: list[str]) -> list[str]:
    """``lines`` of a raylet's messages with a dead raylet's report cut to its first sentence:
    Ray follows it with the last 20 lines of that raylet's log (kept in the node's log folder);
    the run's own line names the node and what happens next (``recsys.train.nodes``)."""
    out: list[str] = []
    tail = False
    for line in lines:
        if line.startswith("Raylet is terminated"):
            out.append(line.split(" Possible reasons")[0] + " (its log: the node's raylet.out)")
            tail = True
        elif tail and (not line.strip() or line.startswith((" ", "\t"))):
            continue
        else:
            tail = False
            out.append(line)
    return out


class QuietTeardown:
    """Ray's handler that prints workers' lines on the driver, minus the SIGTERM tracebacks
    (``drop_sigterm_tracebacks``) of actors Ray ends."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def __call__(self, data: dict[str, Any]) -> None:
        if data.get("pid") == "raylet":
            data = {**data, "lines": short_raylet_death(list(data.get("lines", [])))}
        if data.get("is_err"):
            lines = drop_sigterm_tracebacks(list(data.get("lines", [])))
            if not lines:
                return
            data = {**data, "lines": lines}
        self.handler(data)


def short_raylet_messages(printer: Any) -> Any:
    """Ray's printer of the cluster's error messages (``print_to_stdstream``), with a dead
    raylet's report cut short (``short_raylet_death``)."""
    if getattr(printer, "recsys_short", False):
        return printer

    def short(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if data.get("pid") == "raylet":
            data = {**data, "lines": short_raylet_death(list(data.get("lines", [])))}
        return printer(data, *args, **kwargs)

    short.recsys_short = True  # type: ignore[attr-defined]
    return short


def quiet_teardown() -> None:
    """Wrap the driver's printing of workers' lines in ``QuietTeardown``, and of the cluster's
    error messages in ``short_raylet_messages`` (once)."""
    import ray._private.worker as ray_worker

    if hasattr(ray_worker, "print_to_stdstream"):
        ray_worker.print_to_stdstream = short_raylet_messages(ray_worker.print_to_stdstream)
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:  # moved: Ray's own printing, tracebacks and all
        return
    with dispatcher._lock:
        dispatcher.handlers = [
            (
                name,
                QuietTeardown(h)
                if name == "ray_print_logs" and not isinstance(h, QuietTeardown)
                else h,
            )
            for name, h in dispatcher.handlers
        ]


RAY_LINES = ("Started a local Ray instance", "Connected to Ray cluster", "Connecting to existing")


class OwnRayLine(logging.Filter):
    """Drops Ray's own lines about starting or joining a Ray: ``connect`` says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(RAY_LINES)


def own_ray_line() -> None:
    """Ray's start and join lines dropped (``OwnRayLine``), once per process."""
    log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, OwnRayLine) for f in log.filters):
        log.addFilter(OwnRayLine())


def plain_ray_messages() -> None:
    """Ray's driver-side messages without colour codes (``PlainText``), once per process."""
    log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, PlainText) for f in log.filters):
        log.addFilter(PlainText())


def start_train_coordinator(timeout_s: float = 300.0) -> None:
    """Start Ray's AutoscalingCoordinator actor (one per cluster, detached) and wait until it runs,
    before any Ray Train run asks it for resources.

    Every Train V2 controller sends it a resource request at start and gives the call 5 s
    (``AUTOSCALING_REQUESTS_GET_TIMEOUT_S``); the first request also creates the actor, which
    needs a new worker process. On 2 busy cores that took 27 s (2.1 s idle), the request timed out
    and the controller printed a traceback to the console ("safe to ignore", says its text).
    Started here, with time to come up, it answers in milliseconds. A Ray without this actor
    (its module moved) is left as it is: Train then starts it itself, as before."""
    import ray

    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    actor = get_or_create_autoscaling_coordinator()
    # still starting after timeout_s: Train's first request may time out and retry, as without this
    with contextlib.suppress(ray.exceptions.GetTimeoutError):
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)


API_ENV = "RAY_API_SERVER_ADDRESS"
# the value connect() gave API_ENV: processes started from here inherit both, and a later connect
# (here or in them) knows the address is a stale one of ours, not the user's
OURS_ENV = "RECSYS_LOCAL_RAY_API_SERVER"


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return int(s.getsockname()[1])


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def node_slots(nodes: list[dict[str, float]], cpus: float, gpus: float) -> list[int]:
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs each node can hold."""
    out = []
    for node in nodes:
        fit = math.floor(node.get("CPU", 0) / cpus + 1e-9) if cpus else math.inf
        if gpus:
            fit = min(fit, math.floor(node.get("GPU", 0) / gpus + 1e-9))
        out.append(int(fit) if fit != math.inf else 0)
    return out


def node_share(nodes: list[dict[str, float]], num_workers: int, cpus: float, gpus: float,
               concurrent: int) -> tuple[int, int]:  # fmt: skip
    """Where ``concurrent`` trainings of ``num_workers`` workers (``cpus`` CPUs, ``gpus`` GPUs
    each) share the ``nodes``: a training's workers on one node (its ``local_world_size``), and
    every worker the trainings may place on the node that holds the most (their
    ``node_workers``, among whom a node's memory is divided: ``WorkerEnv``)."""
    slots = max(node_slots(nodes, cpus, gpus), default=1)
    local = max(1, min(num_workers, slots))
    return local, max(local, min(slots, concurrent * local))


def placeable_workers(nodes: list[dict[str, float]], cpus: float, gpus: float) -> int:
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs the nodes can hold at once."""
    return sum(node_slots(nodes, cpus, gpus))


def placement_strategy(num_workers: int, slots: list[int]) -> str:
    """Ray's placement for a trial's workers, so that every node holds the same number of them
    (TorchRec plans for one ``local_world_size``): ``STRICT_PACK`` (one node) when a node can
    hold them all, else ``PACK`` over whole nodes, which needs a multiple of the node size.
    Ray's default ``PACK`` alone is best effort and may split a trial 1 + 3 when other trials
    hold part of a node; the workers also check their placement at start
    (``recsys.distributed.env.check_placement``)."""
    biggest = max(slots, default=0)
    if num_workers <= biggest:
        return "STRICT_PACK"
    if biggest == 0 or num_workers % biggest:
        raise ConfigError(
            f"num_workers={num_workers} do not fit one node (at most {biggest} such workers per "
            f"node) and cannot fill whole nodes evenly: use at most {biggest}, or a multiple of "
            f"{biggest} (TorchRec needs the same number of workers on every node)"
        )
    return "PACK"


def check_fits(
    num_workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
    nodes: list[dict[str, float]],
    extra_cpus: float = 0.0,
) -> None:
    """Refuse a worker group (plus ``extra_cpus`` for a driver) that the nodes cannot hold."""
    if num_workers < 1:
        raise ConfigError(f"num_workers={num_workers}: a trial needs at least one worker")
    fit = placeable_workers(nodes, cpus_per_worker, gpus_per_worker)
    total_cpu = sum(n.get("CPU", 0) for n in nodes)
    total_gpu = sum(n.get("GPU", 0) for n in nodes)
    need_cpu = num_workers * cpus_per_worker + extra_cpus
    if fit < num_workers or need_cpu > total_cpu + 1e-9:
        raise ConfigError(
            f"one trial needs {num_workers} workers x ({cpus_per_worker} CPU, "
            f"{gpus_per_worker} GPU) + {extra_cpus} CPU for its driver = {need_cpu} CPU, "
            f"{num_workers * gpus_per_worker} GPU; the cluster has {total_cpu:g} CPU, "
            f"{total_gpu:g} GPU on {len(nodes)} node(s) and can place {fit} such workers. "
            "Lower --num-workers / --cpus-per-worker, or add nodes."
        )
    placement_strategy(num_workers, node_slots(nodes, cpus_per_worker, gpus_per_worker))


def wait_for_fit(
    num_workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
    extra_cpus: float,
    wait_s: float,
    poll_s: float = 2.0,
    report_every_s: float = 30.0,
) -> None:
    """``check_fits`` on the alive nodes; where they cannot hold the group and ``wait_s`` > 0
    (``--wait-for-nodes``: an autoscaling cluster, KubeRay), ask Ray's autoscaler for it
    (``request_resources``: a cluster without one ignores that) and check again every ``poll_s``
    until it fits, saying where it stands every ``report_every_s``; after ``wait_s`` the refusal
    stands, with the time waited. The request is withdrawn at the end either way."""

    def check() -> None:
        nodes = alive_nodes()
        check_fits(num_workers, cpus_per_worker, gpus_per_worker, nodes, extra_cpus=extra_cpus)

    if num_workers < 1 or wait_s <= 0:
        return check()
    try:
        _wait_for_fit(check, (num_workers, cpus_per_worker, gpus_per_worker, extra_cpus),
                      wait_s, poll_s, report_every_s)  # fmt: skip
    finally:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])  # the request withdrawn: a refused sweep keeps no nodes


def _wait_for_fit(
    check: Any, group: tuple[int, float, float, float], wait_s: float, poll_s: float,
    report_every_s: float,
) -> None:  # fmt: skip
    """``wait_for_fit``'s loop: ``check()`` until it passes or ``wait_s`` passed."""
    import time

    start = last = time.monotonic()
    asked = False
    while True:
        try:
            check()
            break
        except ConfigError as e:
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise ConfigError(
                    f"{e} (waited {waited:.0f} s for nodes: --wait-for-nodes)"
                ) from None
            if not asked:
                request_nodes(*group)
                asked = True
                print(f"waiting up to {wait_s:g} s for nodes (--wait-for-nodes): {e}", flush=True)
            elif time.monotonic() - last >= report_every_s:
                last = time.monotonic()
                print(f"  still waiting for nodes, {waited:.0f} s of {wait_s:g} s: {e}", flush=True)
        time.sleep(poll_s)
    if asked:
        print(f"nodes came after {time.monotonic() - start:.0f} s: one trial fits", flush=True)


def request_nodes(num_workers: int, cpus: float, gpus: float, extra_cpus: float) -> None:
    """Ask Ray's autoscaler (Ray's own, KubeRay's) for one trial's worker group and driver."""
    from ray.autoscaler.sdk import request_resources

    worker = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    request_resources(bundles=[worker] * num_workers + [{"CPU": extra_cpus}] * bool(extra_cpus))


def host_memory_bytes() -> int:
    """The memory a process on this machine can use: physical memory, capped by the container's
    cgroup limit where there is one (cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``).
    The one rule for host memory: workers plan with it, and the sweep's feasibility check
    measures it on the cluster's nodes (``node_host_memory``)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(physical, int(text))
    return physical


def node_host_memory(cpus: float, gpus: float, timeout_s: float = 120.0) -> int:
    """The smallest ``host_memory_bytes`` of the alive nodes that can hold a worker of ``cpus``
    CPUs and ``gpus`` GPUs, each measured on its node by a task that takes no CPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    slots = node_slots([n["Resources"] for n in nodes], cpus, gpus)
    probe = ray.remote(num_cpus=0)(host_memory_bytes)
    refs = [
        probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n, s in zip(nodes, slots, strict=True)
        if s
    ]
    return min(ray.get(refs, timeout=timeout_s), default=0)


def alive_nodes() -> list[dict[str, float]]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]
