"""gpu-check's verdict is honest on a host with fewer GPUs than some items need, and every item
names a GPU test that exists (collected here, on CPU, where they are skipped)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "gpu_check", os.path.join(ROOT, "scripts", "gpu_check.py")
)
assert spec and spec.loader
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_items_needing_more_gpus_make_the_verdict_incomplete_not_passed():
    line, code = gpu_check.verdict([("PASS", 1), ("SKIP", 2), ("PASS", 1)], gpus=1)
    assert code == 3 and line.startswith("gpu-check: INCOMPLETE: 2 passed, 0 failed, 1 not run")
    assert "needs 2 GPUs" in line
    line, code = gpu_check.verdict([("PASS", 1), ("SKIP", 2), ("FAIL", 1)], gpus=1)
    assert code == 1 and line.startswith("gpu-check: FAILED")
    assert gpu_check.verdict([("PASS", 1), ("PASS", 2)], gpus=2) == (
        "gpu-check: passed: 2 passed, 0 failed, 0 not run, on 2 GPU(s)", 0)  # fmt: skip
    assert gpu_check.verdict([], gpus=1)[1] == 1


def test_a_machine_without_gpus_lists_every_item_with_the_gpus_it_needs():
    out = subprocess.run(["bash", os.path.join(ROOT, "run.sh"), "gpu-check"], capture_output=True,
                         text=True, env={**os.environ, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 1 and "nothing was run" in out.stderr
    lines = out.stdout.splitlines()
    assert lines == [f"NOT RUN  {name} ({need} GPU)" for name, need, _ in gpu_check.ITEMS]
    assert any("within 1e-6" in line for line in lines)  # the resume items say their tolerance


def test_one_gpu_has_a_variant_of_every_kind_of_item():
    one = " ".join(name for name, need, _ in gpu_check.ITEMS if need == 1)
    for kind in ("resume", "export", "Pipeline", "killed", "smoke sweep"):
        assert kind in one, kind


def test_every_item_names_a_test_that_exists():
    nodes = [what for _, _, what in gpu_check.ITEMS if what not in gpu_check.RUNNERS]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *nodes],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "no tests ran" not in out.stdout and "ERROR" not in out.stdout


def test_every_item_is_a_pytest_node_or_has_a_runner():
    for _, _, what in gpu_check.ITEMS:
        assert what in gpu_check.RUNNERS or what.startswith(gpu_check.TESTS), what


def test_one_gpu_measures_the_throughput_against_torchrecs_dlrm():
    """The throughput item needs one GPU, runs the harness at the Kaggle shape on cuda:0 (the
    defaults: no ``--tiny``, no cap) and writes its figures under ``runs/gpu-check``; its
    arguments are the harness's own."""
    [(name, need)] = [(n, g) for n, g, what in gpu_check.ITEMS if what == "throughput"]
    assert need == 1 and "Kaggle" in name and "TorchRec's DLRM" in name
    cmd = gpu_check.throughput_command("OUT")
    assert cmd[:3] == [sys.executable, "-m", "benchmarks.gpu_throughput"]
    from benchmarks.gpu_throughput import parse_args

    args = parse_args(cmd[3:])
    assert (args.device, args.tiny, args.cap, args.out) == ("cuda", False, None, "OUT")
    assert os.path.relpath(gpu_check.FIGURES, ROOT) == os.path.join("runs", "gpu-check")


def test_a_figures_command_passes_with_its_verdict_and_fails_with_its_error(tmp_path):
    ok = [sys.executable, "-c", "print('table'); print('ours / x: 0.95x (goal >= 0.9: met)')"]
    log = tmp_path / "ok.log"
    assert gpu_check.run_figures(ok, str(log)) == ("PASS", "ours / x: 0.95x (goal >= 0.9: met)")
    assert "table" in log.read_text()
    bad = [sys.executable, "-c", "import sys; print('half'); sys.exit('no GPU here')"]
    assert gpu_check.run_figures(bad, None) == ("FAIL", "exit 1: no GPU here")


def test_each_item_keeps_its_output_under_a_name_of_its_own():
    names = [gpu_check.slug(name) for name, _, _ in gpu_check.ITEMS]
    assert len(set(names)) == len(names)
    assert all(n and all(c.isalnum() or c == "-" for c in n) for n in names), names


def test_logs_without_a_folder_is_refused_before_anything_runs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "--logs"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "--logs needs a folder" in out.stderr
