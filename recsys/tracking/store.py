"""The MLflow store behind a tracking URI: opening it, an old schema named, whether it is
reachable, and waiting it out while it is not (a tracking server restarting).

A fresh SQLite store is created by whichever process opens it first, and MLflow's store does that
without a lock: two processes opening a new ``mlflow.db`` at once (the sweep and ``mlflow ui``, two
sweeps, a sweep's trials) race in its schema migration ("duplicate column name: step").
``open_store`` opens SQLite stores under a file lock beside the database (our processes take
turns, whatever spelling of the path they use) and retries with backoff when the race happens
anyway against a process that takes no lock, saying so.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from filelock import FileLock
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)
T = TypeVar("T")


OLD_SCHEMA = "out-of-date database schema"
RACES = ("duplicate column", "already exists", "database is locked", OLD_SCHEMA)
STALE_SCHEMA_S = 2.0  # the same old schema revision this long: an old store, not a migration


def raise_if_old_schema(uri: str, error: Exception) -> None:
    """An SQL store (SQLite, PostgreSQL...) made by an older MLflow is named with the user's
    step (a backup, then its upgrade); nothing here migrates a store."""
    if OLD_SCHEMA in str(error):
        raise old_schema_error(uri, error) from None


def old_schema_error(uri: str, error: Exception) -> ConnectionError:
    import mlflow

    found = re.search(r"found version (\w+), but expected (\w+)", str(error))
    revisions = f" (schema revision {found[1]}, this MLflow expects {found[2]})" if found else ""
    return ConnectionError(
        f"MLflow store {uri} was made by an older MLflow than this one ({mlflow.__version__})"
        f"{revisions}: back it up, then run `mlflow db upgrade {uri}`; recsys-sweep does not "
        "migrate a store itself"
    )


OPENED: set[str] = set()  # the SQLite stores this process has opened: each once


def open_store(uri: str, attempts: int = 8) -> None:
    """Create (or check) the store behind a ``sqlite:`` URI before anything writes to it, once a
    process. A store whose schema is older than this MLflow's (and stays so: not a migration in
    flight in another process) is an error naming ``mlflow db upgrade``."""
    if not uri.startswith("sqlite:"):
        return
    path = os.path.abspath(uri.split(":///", 1)[1])
    if path in OPENED:
        return
    # MLflow's SQL store's imports (about a second) outside the lock: two trials starting at once
    # each waited for the other's imports
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    seen: dict[str, float] = {}  # an error's message -> when first seen
    with FileLock(path + ".init-lock"):
        for attempt in range(attempts):
            try:
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
                OPENED.add(path)
                return
            except Exception as e:
                since = seen.setdefault(str(e), time.monotonic())  # (names an old revision)
                stale = OLD_SCHEMA in str(e) and time.monotonic() - since >= STALE_SCHEMA_S
                if stale or attempt == attempts - 1 or not any(r in str(e) for r in RACES):
                    raise_if_old_schema(uri, e)
                    raise
                first = str(e).strip().splitlines()[0][:200]
                log.warning(
                    "MLflow store %s: creating it raced another process (%s); retrying", path, first
                )
                time.sleep(0.25 * 2**attempt)


WAIT_ENV = "RECSYS_TRACKING_WAIT_S"  # how long a trial waits for an unreachable store (600 s)
UNREACHABLE = ("Max retries exceeded", "Connection refused", "Connection aborted", "timed out",
               "failed with exception", "error code 502", "error code 503", "error code 504",
               "could not connect", "server closed the connection",
               "database is locked")  # fmt: skip


def unreachable(error: Exception) -> bool:
    """An error of a store that is down or restarting (not of the request itself)."""
    return isinstance(error, (ConnectionError, TimeoutError)) or any(
        word in str(error) for word in UNREACHABLE
    )


def short(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else repr(error)


def waited(uri: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, waited out while the store ``uri`` is unreachable (a server restarting), up to
    ``RECSYS_TRACKING_WAIT_S`` seconds, with one warning: what a trial cannot go on without
    (its run) waits instead of failing the trial."""
    deadline = time.monotonic() + float(os.environ.get(WAIT_ENV, "600"))
    delay, warned = 1.0, False
    while True:
        try:
            return call()
        except Exception as e:
            if not unreachable(e) or time.monotonic() + delay > deadline:
                raise
            if not warned:
                wait = os.environ.get(WAIT_ENV, "600")
                log.warning("MLflow %s unreachable (%s): %s waits for it (up to %s s)",
                            uri, short(e), what, wait)  # fmt: skip
                warned = True
            time.sleep(delay)
            delay = min(2 * delay, 10.0)


def refused_credentials(message: str, uri: str) -> bool:
    """Whether an error's ``message`` says the store ``uri`` refused the credentials: an HTTP
    401 or 403, or MLflow's codes for it; the URI left out (its port may hold "401" or "403")."""
    text = message.replace(uri.rstrip("/"), "")
    if re.search(r"(?<![\w.:])(401|403)(?![\w.])", text):
        return True
    return any(code in text for code in ("UNAUTHENTICATED", "PERMISSION_DENIED"))


def check_reachable(client: Any, uri: str) -> None:
    """Fail fast, naming the URI, when the store cannot be reached (credentials refused: named
    with the variables that give them)."""
    saved = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        client.search_experiments(max_results=1)
    except Exception as e:
        raise_if_old_schema(uri, e)
        if refused_credentials(str(e), uri):
            raise ConnectionError(
                f"MLflow tracking store {uri} refused the credentials (set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
                f"MLFLOW_TRACKING_TOKEN): {str(e)[:300]}"
            ) from None
        raise ConnectionError(f"MLflow tracking store {uri} is unreachable: {e}") from None
    finally:
        if saved is None:
            del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = saved
