"""Storage every node sees: before a sweep launches on a cluster of several nodes, each node is
asked what it finds at the ``--storage`` and ``--data`` paths, and a path some node sees
differently from the driver is refused, naming the node.

A local path on a cluster must be one shared file system mounted at the same path on every node
(NFS, ...): Ray Train's workers write checkpoints into ``--storage`` on whichever node they run,
and the driver reads them back. A folder that exists on each node but is each node's own disk is
the usual mistake, and Ray only shows it late (a trial's checkpoint the driver cannot find).

How a node is asked: the driver writes a marker file with a random token into the ``--storage``
folder (removed afterwards), and takes a digest of what the ``--data`` path holds (the file its
caller names as standing for the folder, a prepared folder's ``meta.json``:
``recsys.data.dataset.run_paths``; else the folder's listing; it may be read-only, so nothing is
written there); then one task per alive node (no CPU, pinned to the node) reads the same files
and returns what it saw.
An identical copy of ``--data`` at the same path on every node passes, as Ray can use it so.
Object store URIs are not checked here (``recsys.runtime.storage.check_storage`` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from dataclasses import dataclass, replace
from typing import Any

from recsys.configlib import ConfigError
from recsys.runtime.storage import is_uri

MARKER = ".recsys-node-check-"  # + a random token: the file the driver writes into --storage
WRITTEN = frozenset(
    {"--storage", "--out"}
)  # flags whose folder is written to (a marker, then checkpoints)
HEAD_BYTES = 4 << 20  # how much of a file its digest reads (with its size)
HINT = (
    "--storage and --data must be on storage every node mounts at the same path (NFS or another "
    "shared file system) or an object store URI (s3://...); --data may also be an identical copy "
    "at the same path on every node"
)


@dataclass(frozen=True)
class Probe:
    """One path to check: the file (or, with ``listing``, the folder) every node reads, and the
    digest of what the driver read there."""

    flag: str  # the command-line flag it came from, as errors name it
    path: str  # the folder or file the flag names, absolute
    target: str  # what a node reads: the marker, a prepared folder's meta.json, or ``path``
    what: str  # ``target`` in a few words, for the error
    expected: str = ""  # the driver's digest of ``target``
    listing: bool = False  # ``target`` is a folder: its entries' names and sizes are compared
    writable: bool = False  # the node must also be able to write ``target``'s folder


@dataclass(frozen=True)
class Seen:
    """What one node (or the driver) found at a probe's target: a digest, or why none."""

    digest: str = ""
    problem: str = ""


Answers = dict[str, list[Seen] | str]  # by node id: what it saw per probe, or why no answer


def check_nodes_see(
    paths: dict[str, str], files: dict[str, str] | None = None, timeout_s: float = 120.0
) -> None:
    """Refuse, with a ``ConfigError``, a local path of ``paths`` (flag -> path) that some alive
    node of the connected Ray cluster sees differently from the driver (missing, other content,
    not readable, ``--storage`` not writable), or nodes that do not answer within ``timeout_s``;
    each such node is named by its IP and node id. ``files`` (flag -> file): the file whose
    digest stands for the flag's folder (a prepared folder's ``meta.json``); a folder without
    one is compared by its listing. Object store URIs are skipped; a cluster of one node, the
    driver's own, returns at once. ``--storage`` is created if missing; Ray must be
    initialised."""
    import ray

    local = {flag: local_path(path) for flag, path in paths.items() if not is_uri(path)}
    stands = {flag: local_path(file) for flag, file in (files or {}).items() if flag in local}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    own = ray.get_runtime_context().get_node_id()
    if not local or [n["NodeID"] for n in nodes] in ([], [own]):  # the driver's node alone
        return
    markers: list[str] = []
    try:
        probes = [probe(flag, path, markers, stands.get(flag)) for flag, path in local.items()]
        answers = ask(nodes, probes, timeout_s)
    finally:
        for marker in markers:
            with contextlib.suppress(OSError):
                os.remove(marker)
    problems = [text for i, p in enumerate(probes) if (text := trouble(p, i, nodes, answers))]
    if problems:
        raise ConfigError("\n".join([*problems, HINT]))


def local_path(path: str) -> str:
    """A local path (``file://`` dropped) made absolute, as every node must find it."""
    return os.path.abspath(path.removeprefix("file://"))


def probe(flag: str, path: str, markers: list[str], file: str | None = None) -> Probe:
    """The driver's side of checking ``path``: for a written flag, a marker file with a random
    token put into the folder (created if missing; its name appended to ``markers``); for the
    others, the digest of what the path holds (of ``file``, where one stands for the folder). A
    path the driver itself cannot use is refused."""
    if flag in WRITTEN:
        token = secrets.token_hex(8)
        target = os.path.join(path, MARKER + token)
        what = f"marker file {os.path.basename(target)}"
        markers.append(target)
        try:
            os.makedirs(path, exist_ok=True)
            with open(target, "x") as f:
                f.write(token)
        except OSError as e:
            raise ConfigError(f"{flag}={path}: the driver cannot write there: {e}") from e
        return seen_by_driver(Probe(flag, path, target, what, writable=True))
    if file is not None:
        return seen_by_driver(Probe(flag, path, file, os.path.basename(file)))
    if os.path.isdir(path):
        return seen_by_driver(Probe(flag, path, path, "the folder's listing", listing=True))
    return seen_by_driver(Probe(flag, path, path, "the file"))


def seen_by_driver(p: Probe) -> Probe:
    """``p`` with the driver's digest of its target; refused if the driver cannot read it."""
    seen = look(p)
    if seen.problem:
        raise ConfigError(f"{p.flag}={p.path}: on the driver: {seen.problem}")
    return replace(p, expected=seen.digest)


def look(p: Probe) -> Seen:
    """What this machine finds at ``p.target`` (run on the driver and, as a task, on each node)."""
    try:
        digest = listing_digest(p.target) if p.listing else file_digest(p.target)
    except FileNotFoundError:
        return Seen(problem=missing(p))
    except PermissionError as e:
        return Seen(problem=f"permission denied reading {p.target} (as uid {os.getuid()}): {e}")
    except OSError as e:
        return Seen(problem=f"cannot read {p.target}: {e}")
    folder = p.target if p.listing else os.path.dirname(p.target)
    if p.writable and not os.access(folder, os.W_OK):
        return Seen(digest, f"{folder} is there but not writable (as uid {os.getuid()})")
    return Seen(digest)


def missing(p: Probe) -> str:
    """Why ``p.target`` is not found here, in words: no folder at all, or no such file in it."""
    folder = p.target if p.listing else os.path.dirname(p.target)
    if p.listing or not os.path.isdir(folder):
        return f"missing: no folder {folder}"
    return f"missing: {folder} is there but has no {os.path.basename(p.target)} (another folder)"


def file_digest(path: str) -> str:
    """SHA-256 of a file's size and first ``HEAD_BYTES`` bytes (all of a meta.json or marker)."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
        size = os.fstat(f.fileno()).st_size
    return hashlib.sha256(f"{size}:".encode() + head).hexdigest()


def listing_digest(folder: str) -> str:
    """SHA-256 of a folder's entries, each name with its size (a file's) or ``/`` (a folder)."""
    with os.scandir(folder) as entries:
        rows = sorted(
            f"{e.name}/" if e.is_dir() else f"{e.name}:{e.stat().st_size}" for e in entries
        )
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def look_all(probes: list[Probe]) -> list[Seen]:
    """A node's answer: what it sees for each probe."""
    return [look(p) for p in probes]


def ask(nodes: list[dict[str, Any]], probes: list[Probe], timeout_s: float) -> Answers:
    """Each node's answer by node id: one ``Seen`` per probe, or as text a task's failure or its
    silence for ``timeout_s`` (such a task is cancelled)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(look_all)
    refs = {
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(probes): n["NodeID"]
        for n in nodes
    }
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
    silent = f"did not answer within {timeout_s:g} s (its check task never ran or never returned)"
    return {**{refs[ref]: silent for ref in pending}, **{refs[ref]: answer(ref) for ref in ready}}


def answer(ref: Any) -> list[Seen] | str:
    """A finished task's result, or what made it fail (the error's last line)."""
    import ray

    try:
        return list(ray.get(ref))
    except ray.exceptions.RayError as e:
        return f"the check task failed: {str(e).strip().splitlines()[-1][:300]}"


def trouble(p: Probe, index: int, nodes: list[dict[str, Any]], answers: Answers) -> str:
    """The error's part for probe ``p`` (the ``index``-th): each node that does not see what the
    driver sees, and what it saw; ``""`` when every node does."""
    lines = []
    for node in nodes:
        got = answers[node["NodeID"]]
        text = got if isinstance(got, str) else verdict(p, got[index])
        if text:
            lines.append(f"  {node_name(node)}: {text}")
    if not lines:
        return ""
    head = f"{p.flag}={p.path}: {len(lines)} of {len(nodes)} nodes do not see what the driver "
    return head + f"sees there ({p.what}):\n" + "\n".join(lines)


def verdict(p: Probe, seen: Seen) -> str:
    """What is wrong with a node's ``seen`` against the driver's digest (``""``: nothing)."""
    if seen.problem:
        return seen.problem
    if seen.digest != p.expected:
        return f"different content: its {p.what} differs from the driver's (another folder?)"
    return ""


def node_name(node: dict[str, Any]) -> str:
    """A node as the error names it: its IP and the first 8 characters of its node id."""
    return f"{node.get('NodeManagerAddress', '?')} (node {str(node['NodeID'])[:8]})"
