"""The torch / torchrec / FBGEMM versions that go together, and which one a host gets.

Standard library only: ``scripts/setup.sh`` runs this file with the host's Python before anything
is installed (``python3 recsys/runtime/stack.py pair 2.11.0+cu130``), and ``recsys/__init__.py``
reads it.

    python3 recsys/runtime/stack.py pair 2.11.0+cu130  # torch==2.11.0 torchrec==1.6.1 fbgemm==1.6.0
    python3 recsys/runtime/stack.py pair 2.9.1    # exit 2: unsupported, naming the supported ones
    python3 recsys/runtime/stack.py table         # the README's table of pairs
    python3 recsys/runtime/stack.py requirements dev   # pyproject's requirements but the paired 3
    python3 recsys/runtime/stack.py cuda-wheels 2.13.0 cu128 [INDEX_URL]   # the CUDA wheels setup
                                   # needs; with an index: exit 1 naming any it lacks

Only the first two numbers of a torch version choose the pair; the local part (``+cu130``,
``+cpu``) is the host's build of it. FBGEMM's compiled operators are built against one torch
minor version: against another they fail to load (undefined symbols) or load and misbehave, so
anything else is refused rather than guessed.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Stack:
    """One supported combination and how it is tested."""

    torch: str
    torchrec: str
    fbgemm: str
    tested: str  # where this pair's CPU suite runs
    note: str = ""


PINNED = "2.13"
STACKS = {
    "2.13": Stack("2.13.0", "1.8.0", "1.8.0", "CI, every run (`./run.sh test`)"),
    "2.11": Stack(
        "2.11.0",
        "1.6.1",
        "1.6.0",
        "`./run.sh test-compat 2.11` (not in CI)",
        "vendor images with CUDA 13 (torch 2.11.0+cu130); there is no torchrec 1.6.0",
    ),
}


class UnsupportedTorch(ValueError):
    """A torch version no supported stack pairs with."""


def minor(version: str) -> str:
    """``2.11`` of ``2.11.0+cu130``."""
    m = re.match(r"^(\d+)\.(\d+)", version.strip())
    if not m:
        raise UnsupportedTorch(f"cannot read a torch version from {version!r}")
    return f"{m.group(1)}.{m.group(2)}"


def pair_for(torch_version: str) -> Stack:
    """The stack for a torch version (any patch or local build of a supported minor)."""
    key = minor(torch_version)
    if key not in STACKS:
        known = ", ".join(f"torch {s.torch}" for s in STACKS.values())
        raise UnsupportedTorch(
            f"torch {torch_version} is not supported: FBGEMM's operators are built for one torch "
            f"version each and the supported pairs are {known}. Install one of them, or let "
            "setup install the pinned one (RECSYS_TORCH=pinned)"
        )
    return STACKS[key]


def is_supported(torch_version: str, fbgemm_version: str) -> bool:
    """Whether this torch and FBGEMM are one of the supported pairs."""
    try:
        stack = pair_for(torch_version)
    except UnsupportedTorch:
        return False
    return fbgemm_version.split("+")[0] == stack.fbgemm


def installed_versions() -> tuple[str, str]:
    """The installed torch's and FBGEMM's versions ('' where missing)."""
    found = []
    for names in (("torch",), ("fbgemm-gpu", "fbgemm-gpu-cpu")):
        version = ""
        for name in names:
            try:
                version = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
        found.append(version)
    return found[0], found[1]


class CompatNoticeFilter(logging.Filter):
    """FBGEMM 1.4+ logs "_fbgemm_torch_compat_table has no entry for <version>" on the root
    logger once per library it loads (14 lines per process for 1.6.0): its table stops at 1.3.
    For a pair this project supports (tested here) the notice says nothing, so it is dropped;
    for any other pair it stays."""

    NOTICE = "_fbgemm_torch_compat_table has no entry for"

    def __init__(self) -> None:
        super().__init__()
        self._supported: bool | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.NOTICE not in str(record.msg):
            return True
        if self._supported is None:
            self._supported = is_supported(*installed_versions())
        return not self._supported


def quiet_fbgemm_compat_notice() -> None:
    """Install ``CompatNoticeFilter`` on the root logger, once (before FBGEMM is imported)."""
    root = logging.getLogger()
    if not any(isinstance(f, CompatNoticeFilter) for f in root.filters):
        root.addFilter(CompatNoticeFilter())


PAIRED = ("torch=", "torchrec", "fbgemm-gpu")  # chosen per torch, not taken from pyproject.toml


def project_requirements(extras: list[str], build: bool = False) -> list[str]:
    """The project's requirements (core, the given extras, and with ``build`` its build system's)
    except torch, torchrec and FBGEMM, whose versions follow the torch (``pair_for``)."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "pyproject.toml",
    )
    with open(path, "rb") as f:
        pyproject = tomllib.load(f)
    reqs = list(pyproject["project"]["dependencies"])
    for extra in extras:
        reqs += pyproject["project"]["optional-dependencies"][extra]
    if build:
        reqs += pyproject["build-system"]["requires"]  # an editable install, offline
    return [r for r in reqs if not r.lower().replace(" ", "").startswith(PAIRED)]


def table() -> str:
    """The supported pairs as a Markdown table."""
    rows = ["| torch | torchrec | fbgemm-gpu / fbgemm-gpu-cpu | tested by | note |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for key, s in STACKS.items():
        note = s.note or ("the pinned stack" if key == PINNED else "")
        rows.append(f"| {s.torch} | {s.torchrec} | {s.fbgemm} | {s.tested} | {note} |")
    return "\n".join(rows)


def cuda_wheels(torch_version: str, cuda: str) -> list[str]:
    """The wheel files a CUDA install of ``torch_version``'s pair needs from the PyTorch index
    ``cuda`` (``cu128``), for this Python and machine: ``torch-2.13.0+cu128-cp312-cp312-
    manylinux_*_x86_64.whl`` and ``fbgemm_gpu-1.8.0+cu128-...`` (``*``: any manylinux level)."""
    s = pair_for(torch_version)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    arch = os.uname().machine
    return [f"{name}-{version}+{cuda}-{tag}-{tag}-manylinux_*_{arch}.whl"
            for name, version in (("torch", s.torch), ("fbgemm_gpu", s.fbgemm))]  # fmt: skip


def index_lacks(index: str, wheels: list[str]) -> list[str]:
    """The ``wheels`` (``cuda_wheels`` patterns) that the index's project pages (PEP 503:
    ``INDEX/torch/``, ``INDEX/fbgemm-gpu/``; a ``file://`` index: their ``index.html``) do not
    list. A page that cannot be read raises ``OSError``."""
    import fnmatch
    import urllib.parse
    import urllib.request

    lacking = []
    for pattern in wheels:
        project = pattern.split("-")[0].replace("_", "-")
        url = f"{index.rstrip('/')}/{project}/"
        if url.startswith("file:"):
            url += "index.html"
        with urllib.request.urlopen(url, timeout=30) as page:
            html = page.read().decode("utf-8", "replace")
        names = {urllib.parse.unquote(h.split("#")[0].rsplit("/", 1)[-1])
                 for h in re.findall(r'href="([^"]+)"', html)}  # fmt: skip
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            lacking.append(pattern)
    return lacking


def check_cuda_index(torch_version: str, cuda: str, index: str) -> int:
    """``cuda-wheels``' check: 0 when ``index`` lists every wheel (or cannot be read: pip then
    says why), 1 naming the ones it lacks."""
    wheels = cuda_wheels(torch_version, cuda)
    try:
        lacking = index_lacks(index, wheels)
    except OSError as e:
        print(f"note: could not read {index} to check for {wheels} ({e}); pip will try",
              file=sys.stderr)  # fmt: skip
        return 0
    if lacking:
        print(f"error: {index} has no {' or '.join(lacking)}: that index does not build this "
              f"torch for this Python and machine; pick another RECSYS_CUDA (docs/install.md)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        print(table())
        return 0
    if len(argv) == 2 and argv[0] == "pair":
        try:
            s = pair_for(argv[1])
        except UnsupportedTorch as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"torch=={s.torch} torchrec=={s.torchrec} fbgemm=={s.fbgemm}")
        return 0
    if argv[:1] == ["requirements"]:
        extras = [a for a in argv[1:] if a != "--build"]
        print("\n".join(project_requirements(extras, build="--build" in argv)))
        return 0
    if argv[:1] == ["cuda-wheels"] and len(argv) in (3, 4):
        if len(argv) == 4:
            return check_cuda_index(argv[1], argv[2], argv[3])
        print("\n".join(cuda_wheels(argv[1], argv[2])))
        return 0
    print("usage: stack.py pair TORCH_VERSION | table | requirements [--build] EXTRA... | "
          "cuda-wheels TORCH_VERSION CUDA [INDEX_URL]", file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
