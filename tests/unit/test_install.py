"""Setup's choice of stack before anything is installed, and the offline wheelhouse's parts.

The whole offline path (build a wheelhouse, join its parts, set up a fresh venv with no index, run
checks there) takes ~3 min and ~500 MB: ``./run.sh test-offline``, not in every CI run."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setup(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "setup.sh")],
        env={**os.environ, "RECSYS_VENV": str(tmp_path / "venv"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unsupported_torch_is_refused_before_anything_is_made(tmp_path):
    out = setup(tmp_path, RECSYS_TORCH="2.12")
    assert out.returncode == 1
    assert "torch 2.12 is not supported" in out.stderr and "torch 2.11.0" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_a_preinstalled_torch_that_is_not_there_is_named(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    out = setup(tmp_path, RECSYS_TORCH="preinstalled", RECSYS_PYTHON=str(bare / "bin" / "python"))
    assert out.returncode == 1
    assert f"RECSYS_TORCH=preinstalled, but {bare}/bin/python cannot import torch" in out.stderr
    assert not (tmp_path / "venv").exists()


def parts(tmp_path):
    """A wheelhouse's parts as scripts/wheelhouse.sh --part-mb writes them (two fake wheels)."""
    house = tmp_path / "house" / "wheels"
    house.mkdir(parents=True)
    for name in ("a-1.0-py3-none-any.whl", "b-2.0-py3-none-any.whl"):
        (house / name).write_bytes(os.urandom(300_000))
    out = tmp_path / "parts"
    out.mkdir()
    with tarfile.open(tmp_path / "all.tar", "w") as tar:
        tar.add(house, arcname="wheels")
    data = (tmp_path / "all.tar").read_bytes()
    sums = []
    for i in range(0, len(data), 200_000):
        name = f"wheels.tar.part{i // 200_000:03d}"
        (out / name).write_bytes(data[i : i + 200_000])
        sums.append(f"{hashlib.sha256(data[i : i + 200_000]).hexdigest()}  {name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return house, out


def join(parts_dir, out) -> subprocess.CompletedProcess:
    script = os.path.join(ROOT, "scripts", "wheelhouse.sh")
    return subprocess.run(["bash", script, "--join", str(parts_dir), str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_parts_join_into_the_wheelhouse(tmp_path):
    house, parts_dir = parts(tmp_path)
    out = join(parts_dir, tmp_path / "joined")
    assert out.returncode == 0, out.stderr
    for wheel in house.iterdir():
        assert (tmp_path / "joined" / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()


def test_a_damaged_or_missing_part_unpacks_nothing(tmp_path):
    _, parts_dir = parts(tmp_path)
    (parts_dir / "wheels.tar.part001").write_bytes(b"x" * 10)
    out = join(parts_dir, tmp_path / "joined")
    assert out.returncode == 1 and "missing or damaged" in out.stderr
    assert not (tmp_path / "joined").exists() and not (tmp_path / "joined.partial").exists()
    (parts_dir / "wheels.tar.part001").unlink()
    assert join(parts_dir, tmp_path / "joined").returncode == 1


def test_a_new_venv_is_made_and_set_up_past_its_creation(tmp_path):
    """Setup reaches the install after creating the venv (a failing test in a shell function's
    last line once ended it there, exit 1, silently). With an empty wheelhouse the install stops
    at the first package it lacks, naming it: everything before it ran."""
    house = tmp_path / "house"
    house.mkdir()
    out = setup(tmp_path, RECSYS_WHEELHOUSE=str(house), RECSYS_FBGEMM="cpu")
    assert (tmp_path / "venv" / "bin" / "python").exists()
    assert "torch 2.13.0 (pinned): torchrec==1.8.0, FBGEMM 1.8.0 (cpu)" in out.stderr
    assert out.returncode != 0 and "No matching distribution found for" in out.stderr


def test_the_postgresql_install_says_what_and_why_first_and_can_be_skipped():
    """``./run.sh test`` installs Debian's postgresql for the tests' tracking server: it says so
    (package, size, purpose, how to skip) before apt-get runs, and RECSYS_NO_APT=1 leaves before
    any apt-get (this machine may have PostgreSQL already, so the script is read, not run)."""
    with open(os.path.join(ROOT, "scripts", "test_services.sh")) as f:
        script = f.read()
    first_apt = script.index("apt-get update")
    said = script.index('log "installing PostgreSQL (Debian package postgresql, about')
    assert said < first_apt and "RECSYS_NO_APT=1 to skip" in script[said:first_apt]
    assert "127.0.0.1" in script[said:first_apt]
    no_apt = script.index("if [[ ${RECSYS_NO_APT:-} == 1 ]]; then")
    assert no_apt < first_apt and "exit 0" in script[no_apt:first_apt]


def test_without_postgresql_the_skip_reason_names_recsys_no_apt_when_set(monkeypatch):
    from tests import servers

    monkeypatch.setattr(servers, "pg_bin", lambda: None)
    monkeypatch.setenv("RECSYS_NO_APT", "1")
    why = servers.missing()
    assert why and "PostgreSQL not found" in why and "RECSYS_NO_APT=1 kept ./run.sh test" in why
    monkeypatch.delenv("RECSYS_NO_APT")
    why = servers.missing()
    assert why and "RECSYS_NO_APT" not in why and "installs Debian's postgresql" in why
