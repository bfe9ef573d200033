"""Where a sweep's files live: a local (or mounted) folder, or an object store URI.

A URI is anything with a scheme (``s3://bucket/sweeps``), opened with pyarrow's file systems as
Ray Train and Tune open it. An S3-compatible store other than AWS is named the way pyarrow and
Ray take it, in the environment of the driver and of every Ray node: ``AWS_ENDPOINT_URL``, with
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (a URI's ``?query`` is refused: the checkpoint
URIs recorded in MLflow would lose it). The helpers here are the few file operations the sweep
driver and the export do themselves (``sweep.json``, downloading a checkpoint to export it),
and the file system Ray is given (``ray_storage``).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow.fs

from recsys.configlib import ConfigError


def is_uri(path: str) -> bool:
    """Whether ``path`` is an object store URI (``s3://...``); a ``file://`` URI is a local path.
    The one test of it: every command and layer asks this, or ``resolved``."""
    return "://" in path and not path.startswith("file://")


def resolved(path: str) -> str:
    """A storage or data path as every command takes it: an object store URI as it is; a
    ``file://`` URI or a plain path as an absolute local path (Ray's workers start elsewhere)."""
    return path if is_uri(path) else os.path.abspath(path.removeprefix("file://"))


def join(base: str, *parts: str) -> str:
    """``os.path.join`` for folders, a ``/`` join for URIs (a ``?query`` stays at the end)."""
    if not is_uri(base):
        return os.path.join(base, *parts)
    head, sep, query = base.partition("?")
    return posixpath.join(head, *parts) + sep + query


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's ``(FileSystem, path)`` for ``uri``, as Ray resolves it."""
    return pyarrow.fs.FileSystem.from_uri(uri)


def as_uri(fs: Any, path: str) -> str:
    """A path on ``fs`` (as Ray's ``Checkpoint.path`` gives it: without the scheme) as a URI a
    later process opens again (a local path stays a path)."""
    if isinstance(fs, pyarrow.fs.LocalFileSystem) or is_uri(path):
        return path
    if isinstance(fs, pyarrow.fs.PyFileSystem) and isinstance(fs.handler, RetryingHandler):
        fs = fs.handler.fs
    return f"{fs.type_name}://{path}"


def exists(path: str) -> bool:
    if not is_uri(path):
        return os.path.exists(path)
    fs, p = filesystem(path)
    return bool(fs.get_file_info(p).type != pyarrow.fs.FileType.NotFound)


def read_text(path: str) -> str:
    if not is_uri(path):
        with open(path) as f:
            return f.read()
    fs, p = filesystem(path)
    with fs.open_input_stream(p, compression=None) as f:
        return bytes(f.read()).decode()


def write_text(path: str, text: str) -> None:
    """Write ``text`` whole: a local file through a temporary name and a rename, an object in
    one upload (an object store shows an object only once its upload completed)."""
    if not is_uri(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        return
    fs, p = filesystem(path)
    with fs.open_output_stream(p, compression=None) as f:
        f.write(text.encode())


@contextlib.contextmanager
def local_folder(path: str, need_bytes: int = 0) -> Iterator[str]:
    """``path`` as a local folder: itself, or a download of the URI into a temporary folder
    (its free space checked against the folder's size first), removed afterwards."""
    if not is_uri(path):
        yield path
        return
    fs, p = filesystem(path)
    files = fs.get_file_info(pyarrow.fs.FileSelector(p, recursive=True, allow_not_found=True))
    size = sum(f.size or 0 for f in files if f.type == pyarrow.fs.FileType.File)
    if not files:
        raise FileNotFoundError(f"{path}: no such folder (or it is empty) in the object store")
    tmp = tempfile.mkdtemp(prefix="recsys-download-")
    try:
        free = shutil.disk_usage(tmp).free
        if free < size + need_bytes:
            raise OSError(
                f"downloading {path} ({size / 2**30:.2f} GiB) into {tmp}: only "
                f"{free / 2**30:.2f} GiB free; set TMPDIR to a larger local disk"
            )
        pyarrow.fs.copy_files(p, tmp, source_filesystem=fs)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_storage(storage: str, flag: str = "--storage") -> None:
    """Before anything launches: an object store URI must name a bucket that exists and that
    these credentials may write. A 5-byte object ``.recsys-write-check`` is written under the
    prefix and left there (removing it would leave an empty "folder" marker in its place, which
    some S3-compatible stores turn into a file that blocks the prefix). The error names the URI,
    the endpoint and what failed. A local folder is created."""
    if not is_uri(storage):
        os.makedirs(storage, exist_ok=True)
        return
    if "?" in storage:  # (checkpoint URIs recorded in MLflow would lose the query)
        raise ConfigError(
            f"{flag}={storage}: name the store's endpoint and options in the environment "
            "(AWS_ENDPOINT_URL, ...), not in the URI's query"
        )
    try:
        fs, path = filesystem(storage)
    except Exception as e:  # (a malformed URI, an unknown scheme)
        raise ConfigError(f"{flag}={storage}: {e}") from e
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "the provider's default endpoint")
    bucket = path.split("/", 1)[0]
    try:
        with fs.open_output_stream(posixpath.join(path, ".recsys-write-check")) as f:
            f.write(b"check")
    except Exception as e:
        raise ConfigError(
            f"{flag}={storage}: cannot write to bucket {bucket!r} at {endpoint}: "
            f"{_reason(str(e))} (check that the bucket exists and AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY may write it; an S3-compatible store needs AWS_ENDPOINT_URL)"
        ) from e


def _reason(message: str) -> str:
    """What failed, out of the AWS SDK's message (its error name and first sentence); a store
    that refuses the SDK's streamed checksums (HTTP 411) gets the setting that turns them off."""
    if "MissingContentLength" in message or "HTTP status 411" in message:
        return (
            "the store refuses streamed uploads (HTTP 411 MissingContentLength): set "
            "AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED, as S3-compatible stores other than "
            "AWS need with current AWS SDKs"
        )
    found = re.search(r"AWS Error (\w+)[^:]*operation: ([^.;(]*)", message)
    if found:
        return f"{found.group(1)}: {found.group(2).strip()}"
    return message.splitlines()[0][:300]


# --- the store as Ray sees it: every operation retried while the store cannot be reached ------

PATIENCE_ENV = "RECSYS_STORE_PATIENCE_S"  # how long an operation on the store is retried
DEFAULT_PATIENCE_S = 300.0
TRANSIENT = ("NETWORK_CONNECTION", "SLOW_DOWN", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE",
             "REQUEST_TIMEOUT", "THROTTLING", "curlCode", "Could not connect", "Connection reset",
             "HTTP status 5", "HTTP status 429", "timed out")  # fmt: skip


def patience_s() -> float:
    return float(os.environ.get(PATIENCE_ENV, DEFAULT_PATIENCE_S))


def retried(what: str, fn: Any, patience: float, log: Any = print, sleep: Any = None) -> Any:
    """``fn()``, tried again after an ``OSError`` that says the store could not be reached or
    was overloaded (``TRANSIENT``: a network error, a 5xx or 429 answer) for up to ``patience``
    seconds: 2 s between the first tries, doubling up to 30 s, one line per failure naming
    ``what`` and the error. Any other error (a missing object or bucket, refused credentials,
    a bad request) is the store's answer and raised at once."""
    import time

    deadline, wait = time.monotonic() + patience, 2.0
    while True:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except OSError as e:
            message = str(e)
            if not any(s in message for s in TRANSIENT) or time.monotonic() + wait > deadline:
                raise
            log(f"{what}: {message.splitlines()[0][:200]}; retry in {wait:.0f} s")
            (sleep or time.sleep)(wait)
            wait = min(2 * wait, 30.0)


class _Spool:
    """A file written to a local temporary file, uploaded whole (with retries) on ``close``: a
    write to the store either lands complete or is retried from the start."""

    def __init__(self, handler: RetryingHandler, path: str, metadata: Any) -> None:
        self.handler, self.path, self.metadata = handler, path, metadata
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close)
        self.closed = False

    def write(self, data: bytes) -> int:
        return self.file.write(data)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.file.tell()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.handler.upload(self.file, self.path, self.metadata)
        finally:
            self.file.close()


class RetryingHandler(pyarrow.fs.FileSystemHandler):  # type: ignore[misc]
    """A pyarrow ``FileSystemHandler`` over an object store's file system whose every
    operation is ``retried`` while the store cannot be reached, for ``patience`` seconds;
    writes are spooled locally and uploaded whole (``_Spool``). Ray Train and Tune get it as
    their ``storage_filesystem`` (``ray_storage``), so the controller's state, Tune's
    experiment state and the workers' checkpoint uploads all wait out an outage."""

    def __init__(self, fs: Any, patience: float) -> None:
        self.fs, self.patience = fs, patience

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingHandler) and self.fs.equals(other.fs)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> Any:
        return RetryingHandler, (self.fs, self.patience)

    def _do(self, what: str, fn: Any) -> Any:
        return retried(f"{self.fs.type_name} store, {what}", fn, self.patience)

    def get_type_name(self) -> str:
        return f"retrying-{self.fs.type_name}"

    def normalize_path(self, path: str) -> str:
        return str(self.fs.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> Any:
        return self._do(f"info of {paths[:1]}", lambda: self.fs.get_file_info(paths))

    def get_file_info_selector(self, selector: Any) -> Any:
        return self._do(f"listing {selector.base_dir}", lambda: self.fs.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._do(f"creating {path}", lambda: self.fs.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self._do(f"deleting {path}", lambda: self.fs.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._do(
            f"emptying {path}",
            lambda: self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok),
        )

    def delete_root_dir_contents(self) -> None:
        self._do(
            "emptying the root", lambda: self.fs.delete_dir_contents("/", accept_root_dir=True)
        )

    def delete_file(self, path: str) -> None:
        self._do(f"deleting {path}", lambda: self.fs.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self._do(f"moving {src}", lambda: self.fs.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._do(f"copying {src}", lambda: self.fs.copy_file(src, dest))

    def open_input_stream(self, path: str) -> Any:
        return self._do(
            f"reading {path}", lambda: self.fs.open_input_stream(path, compression=None)
        )

    def open_input_file(self, path: str) -> Any:
        return self._do(f"reading {path}", lambda: self.fs.open_input_file(path))

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        import pyarrow as pa

        return pa.PythonFile(_Spool(self, path, metadata), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise OSError(f"{path}: appending is not supported by an object store")

    def upload(self, spool: Any, path: str, metadata: Any) -> None:
        def put() -> None:
            spool.seek(0)
            with self.fs.open_output_stream(path, compression=None, metadata=metadata) as out:
                shutil.copyfileobj(spool, out, 16 << 20)

        self._do(f"writing {path}", put)


def ray_storage(path: str) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` for Ray Train's and Tune's run configs: a local
    folder as it is (``None``: Ray's own); an object store URI as the path in its file system
    and that file system wrapped in a ``RetryingHandler`` (``RECSYS_STORE_PATIENCE_S``)."""
    if not is_uri(path):
        return path, None
    fs, inner = filesystem(path)
    return inner, pyarrow.fs.PyFileSystem(RetryingHandler(foreground(fs), patience_s()))


def foreground(fs: Any) -> Any:
    """``fs`` writing in the calling thread: an S3 file system's background writes run on
    Arrow's IO thread pool, whose threads are the very ones that close a ``_Spool`` inside
    ``copy_files``; each would wait on a write queued behind the others (a deadlock)."""
    if not isinstance(fs, pyarrow.fs.S3FileSystem):
        return fs
    rebuild, (kwargs,) = fs.__reduce__()
    return rebuild({**kwargs, "background_writes": False})
