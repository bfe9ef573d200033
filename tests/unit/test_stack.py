"""The supported torch / torchrec / FBGEMM pairs, the refusal of any other torch, and FBGEMM's
compatibility notice dropped for supported pairs only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from recsys.runtime import stack

STACK_PY = os.path.join(os.path.dirname(stack.__file__), "stack.py")


@pytest.mark.parametrize(
    "torch_version, pins",
    [
        ("2.13.0", "torch==2.13.0 torchrec==1.8.0 fbgemm==1.8.0"),
        ("2.13.0+cpu", "torch==2.13.0 torchrec==1.8.0 fbgemm==1.8.0"),
        ("2.11.0+cu130", "torch==2.11.0 torchrec==1.6.1 fbgemm==1.6.0"),
        ("2.11.2", "torch==2.11.0 torchrec==1.6.1 fbgemm==1.6.0"),
    ],
)
def test_a_supported_torch_gets_its_pair(torch_version, pins):
    out = subprocess.run([sys.executable, STACK_PY, "pair", torch_version],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == pins


@pytest.mark.parametrize("torch_version", ["2.12.0", "2.9.1+cu126", "3.0.0", "nightly"])
def test_any_other_torch_is_refused_naming_the_supported_ones(torch_version):
    out = subprocess.run([sys.executable, STACK_PY, "pair", torch_version],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    if torch_version != "nightly":
        assert f"torch {torch_version} is not supported" in out.stderr
    assert "torch 2.13.0, torch 2.11.0" in out.stderr or "cannot read" in out.stderr


def test_the_table_lists_every_pair():
    text = stack.table()
    assert "| 2.13.0 | 1.8.0 | 1.8.0 |" in text and "| 2.11.0 | 1.6.1 | 1.6.0 |" in text


def test_pairs():
    assert stack.is_supported("2.11.0+cu130", "1.6.0")
    assert stack.is_supported("2.13.0+cpu", "1.8.0+cpu")
    assert not stack.is_supported("2.13.0", "1.6.0")
    assert not stack.is_supported("2.12.0", "1.7.0")


def emit(message: str) -> list[str]:
    """What the root logger passes on for ``message`` with the project's filter installed."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger()
    handler = Keep()
    root.addHandler(handler)
    try:
        logging.warning(message)
    finally:
        root.removeHandler(handler)
    return seen


def test_fbgemms_compat_notice_is_dropped_for_a_supported_pair_only(monkeypatch):
    stack.quiet_fbgemm_compat_notice()  # (recsys/__init__ did it already; once is enough)
    notice = "\n  _fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM;\n"
    (filt,) = [f for f in logging.getLogger().filters if isinstance(f, stack.CompatNoticeFilter)]
    monkeypatch.setattr(filt, "_supported", None)
    monkeypatch.setattr(stack, "installed_versions", lambda: ("2.11.0+cu130", "1.6.0"))
    assert emit(notice) == []
    assert emit("something else") == ["something else"]
    monkeypatch.setattr(filt, "_supported", None)
    monkeypatch.setattr(stack, "installed_versions", lambda: ("2.12.0", "1.6.0"))
    assert emit(notice) == [notice]


def test_project_requirements_leave_the_paired_three_to_the_pair():
    out = subprocess.run([sys.executable, STACK_PY, "requirements", "--build", "dev"],
                         capture_output=True, text=True)  # fmt: skip
    reqs = out.stdout.split()
    assert out.returncode == 0 and "torchmetrics==1.0.3" in reqs and "mlflow==3.17.2" in reqs
    assert "pytest>=8" in reqs and "setuptools>=77" in reqs  # the extra, the build system
    assert not [r for r in reqs if r.startswith(("torch=", "torchrec", "fbgemm"))], reqs
    assert "setuptools>=77" not in stack.project_requirements(["dev"])


def test_a_cuda_index_that_lacks_a_wheel_is_named_before_pip_runs(tmp_path, capsys):
    """The CUDA setup checks the PyTorch index's project pages for the exact wheels of the
    pair (this Python, this machine) and names the one it lacks."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    arch = os.uname().machine
    wheels = stack.cuda_wheels("2.13.0", "cu128")
    assert wheels == [f"torch-2.13.0+cu128-{tag}-{tag}-manylinux_*_{arch}.whl",
                      f"fbgemm_gpu-1.8.0+cu128-{tag}-{tag}-manylinux_*_{arch}.whl"]  # fmt: skip

    def page(project, *files):
        (tmp_path / project).mkdir(exist_ok=True)
        links = "".join(f'<a href="../../files/{f.replace("+", "%2B")}#sha256=0">{f}</a>'
                        for f in files)  # fmt: skip
        (tmp_path / project / "index.html").write_text(f"<html><body>{links}</body></html>")

    page("torch", f"torch-2.13.0+cu128-{tag}-{tag}-manylinux_2_28_{arch}.whl",
         f"torch-2.12.0+cu128-{tag}-{tag}-manylinux_2_28_{arch}.whl")  # fmt: skip
    page("fbgemm-gpu", f"fbgemm_gpu-1.8.0+cu126-{tag}-{tag}-manylinux_2_28_{arch}.whl",
         f"fbgemm_gpu-1.8.0+cu128-cp39-cp39-manylinux_2_28_{arch}.whl")  # fmt: skip
    index = tmp_path.as_uri()
    assert stack.index_lacks(index, wheels) == [wheels[1]]
    assert stack.main(["cuda-wheels", "2.13.0", "cu128", index]) == 1
    assert wheels[1] in capsys.readouterr().err
    page("fbgemm-gpu", f"fbgemm_gpu-1.8.0+cu128-{tag}-{tag}-manylinux_2_28_{arch}.whl")
    assert stack.main(["cuda-wheels", "2.13.0", "cu128", index]) == 0
