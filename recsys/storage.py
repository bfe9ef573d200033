"""Where a sweep's files live: a local (or mounted) folder, or an object store URI.

A URI is anything with a scheme (``s3://bucket/sweeps``), opened with pyarrow's file systems as
Ray Train and Tune open it. An S3-compatible store other than AWS is named the way pyarrow and
Ray take it: ``AWS_ENDPOINT_URL`` (or ``?endpoint_override=host:port&scheme=http`` on the URI),
with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in the environment of the driver and of
every Ray node. The helpers here are the few file operations the sweep driver and the export do
themselves (``sweep.json``, a checkpoint's sharding plan, downloading a checkpoint to export
it); everything else goes through Ray.
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

from recsys.configlib import ConfigError


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def join(base: str, *parts: str) -> str:
    """``os.path.join`` for folders, a ``/`` join for URIs (a ``?query`` stays at the end)."""
    if not is_uri(base):
        return os.path.join(base, *parts)
    head, sep, query = base.partition("?")
    return posixpath.join(head, *parts) + sep + query


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's ``(FileSystem, path)`` for ``uri``, as Ray resolves it."""
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(uri)


def as_uri(fs: Any, path: str) -> str:
    """A path on ``fs`` (as Ray's ``Checkpoint.path`` gives it: without the scheme) as a URI a
    later process opens again (a local path stays a path)."""
    import pyarrow.fs

    if isinstance(fs, pyarrow.fs.LocalFileSystem) or is_uri(path):
        return path
    return f"{fs.type_name}://{path}"


def exists(path: str) -> bool:
    if not is_uri(path):
        return os.path.exists(path)
    import pyarrow.fs

    fs, p = filesystem(path)
    return bool(fs.get_file_info(p).type != pyarrow.fs.FileType.NotFound)


def read_text(path: str) -> str:
    if not is_uri(path):
        with open(path) as f:
            return f.read()
    fs, p = filesystem(path)
    with fs.open_input_stream(p) as f:
        return bytes(f.read()).decode()


def write_text(path: str, text: str) -> None:
    """Write ``text`` whole: a local file through a temporary name and a rename, an object in
    one upload (an object store shows an object only once its upload completed)."""
    if not is_uri(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return
    fs, p = filesystem(path)
    with fs.open_output_stream(p) as f:
        f.write(text.encode())


@contextlib.contextmanager
def local_folder(path: str, need_bytes: int = 0) -> Iterator[str]:
    """``path`` as a local folder: itself, or a download of the URI into a temporary folder
    (its free space checked against the folder's size first), removed afterwards."""
    if not is_uri(path):
        yield path
        return
    import pyarrow.fs

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
