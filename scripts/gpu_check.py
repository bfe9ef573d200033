"""The checks only a GPU host can run, one line each: ``./run.sh gpu-check`` (which first sets up
the CUDA stack and runs FBGEMM's CUDA kernels through ``python -m recsys.runtime.env_check``).

    ./run.sh gpu-check            # every item; exit status 1 if any failed
    ./run.sh gpu-check resume     # only the items whose name contains "resume"
    python scripts/gpu_check.py --list   # every item and the GPUs it needs (any machine)
    ./run.sh gpu-check --logs DIR  # also keep each item's whole output in DIR/NN-<item>.log
    ./run.sh gpu-check throughput  # only the throughput figures (runs/gpu-check/gpu-throughput.*)

Every item names the GPUs it needs. Items that need more GPUs than the machine has are not run
(``SKIP``), and the verdict is then ``INCOMPLETE``, never ``passed``: one GPU runs one rank (NCCL
refuses two ranks on one device), so a one-GPU host checks the one-rank variants only.

The throughput item (``benchmarks/gpu_throughput.py``) measures our training step against
TorchRec's own DLRM at the Criteo Kaggle shape and writes the figures, as JSON and as the Markdown
that BENCHMARKS.md's GPU section takes, to ``runs/gpu-check/`` (``FIGURES``). It passes where both
models trained; its goal (ours / TorchRec's >= 0.9) is a benchmark's, said in its line, never a
failure here.

Exit status: 0 every item passed, 1 an item failed (or no GPU), 3 incomplete (none failed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests/gpu/test_gpu.py::"
# what the exact-resume items hold a GPU run to; why: GPU_RESUME_ATOL in tests/distributed/common.py
# (deterministic kernels set by the worker; headroom for NCCL's reduction order on a new
# communicator; half tables round stochastically)
RESUME_TOL = "weights, loss and AUC within 1e-6, fp16/bf16 tables within 1 ulp"
ITEMS = [  # (what it checks, GPUs it needs, pytest node or a name in RUNNERS)
    ("NCCL sharded == unsharded, row/table/column-wise + QR, debug gather", 2,
     TESTS + "test_nccl_sharded_matches_unsharded_row_and_table_wise[plain]"),
    ("TrainPipelineSparseDist on CUDA streams == unsharded", 2,
     TESTS + "test_nccl_sharded_matches_unsharded_row_and_table_wise[pipeline]"),
    ("TrainPipelineSparseDist on CUDA streams == plain steps, one rank", 1,
     TESTS + "test_one_gpu_pipeline_equals_plain_steps"),
    ("exact resume on NCCL, fp32 / fp16 / bf16 tables, CUDA RNG restored (" + RESUME_TOL + ")", 2,
     TESTS + "test_nccl_resume_is_exact"),
    ("exact resume with FBGEMM's embedding Adam (step counter restored; " + RESUME_TOL + ")", 2,
     TESTS + "test_nccl_resume_is_exact_with_embedding_adam"),
    ("exact resume on one rank, row-wise Adagrad and embedding Adam (" + RESUME_TOL + ")", 1,
     TESTS + "test_one_gpu_resume_is_exact"),
    ("export of a GPU-trained checkpoint", 2, TESTS + "test_export_of_a_gpu_trained_checkpoint"),
    ("export of a one-GPU checkpoint", 1, TESTS + "test_export_of_a_one_gpu_checkpoint"),
    ("Ray Train worker killed, restart from its checkpoint on NCCL", 2,
     TESTS + "test_killed_gpu_worker_restarts_from_last_checkpoint"),
    ("Ray Train worker killed on one GPU, restart from its checkpoint", 1,
     TESTS + "test_killed_worker_on_one_gpu_restarts_from_last_checkpoint"),
    ("the planner is told this GPU's memory", 1, TESTS + "test_the_planner_sees_this_gpu"),
    ("2-trial smoke sweep with --gpus", 1, "smoke"),
    ("throughput: our training step vs TorchRec's DLRM at the Criteo Kaggle shape (26 tables, "
     "dim 128, batch 16k, dot), samples/s and their ratio", 1, "throughput"),
]  # fmt: skip
FIGURES = os.path.join(ROOT, "runs", "gpu-check")  # where the throughput item writes its figures


def verdict(results: list[tuple[str, int]], gpus: int) -> tuple[str, int]:
    """The summary line and exit status of ``(status, gpus needed)`` per item run or not."""
    statuses = [s for s, _ in results]
    passed, failed, skipped = (statuses.count(k) for k in ("PASS", "FAIL", "SKIP"))
    counts = f"{passed} passed, {failed} failed, {skipped} not run, on {gpus} GPU(s)"
    if failed or not results:
        return f"gpu-check: FAILED: {counts}", 1
    if skipped:
        need = max(n for s, n in results if s == "SKIP")
        return f"gpu-check: INCOMPLETE: {counts}; the rest needs {need} GPUs", 3
    return f"gpu-check: passed: {counts}", 0


def run_pytest(node: str, log: str | None) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    text = out.stdout + out.stderr
    keep(log, text)
    last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
    if out.returncode == 0 and " passed" in last[0] and "skipped" not in last[0]:
        return "PASS", last[0]
    if out.returncode == 0 and "skipped" in last[0]:
        reason = [line for line in text.splitlines() if line.startswith("SKIPPED")][:1]
        return "SKIP", (reason or last)[0]
    failed = [line for line in text.splitlines() if line.startswith(("E ", "FAILED"))]
    return "FAIL", (failed or last)[-1][:300]


def keep(log: str | None, text: str) -> None:
    """Write an item's whole output to ``log`` (``--logs``), if asked."""
    if log is not None:
        with open(log, "w") as f:
            f.write(text)


def smoke_sweep(gpus: int, log: str | None) -> tuple[str, str]:
    workers = min(2, gpus)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
            "--gpus", "--num-workers", str(workers), "--cpus-per-worker", "1", "--name",
            "gpu-smoke", "--storage", os.path.join(tmp, "runs"),
            "--tracking-uri", f"sqlite:///{tmp}/mlflow.db",
        ]  # fmt: skip
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    keep(log, out.stdout + out.stderr)
    ok = out.returncode == 0 and "best trials" in out.stdout
    tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or [""]
    return ("PASS" if ok else "FAIL"), f"{workers} worker(s) per trial; {tail[0][:300]}"


def throughput_command(out: str) -> list[str]:
    """The throughput item's command: the Kaggle shape on cuda:0, figures written to ``out``."""
    return [sys.executable, "-m", "benchmarks.gpu_throughput", "--device", "cuda", "--out", out]


def run_figures(cmd: list[str], log: str | None) -> tuple[str, str]:
    """Run a figures command: PASS with its last line (the verdict) where it exits 0, else FAIL
    with its last line of output."""
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    text = out.stdout + out.stderr
    keep(log, text)
    if out.returncode == 0:
        last = [line for line in out.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
        return "PASS", last[0][:300]
    last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
    return "FAIL", f"exit {out.returncode}: {last[0][:300]}"


def throughput(gpus: int, log: str | None) -> tuple[str, str]:
    """The throughput figures on cuda:0 (one GPU whatever the host has), written to FIGURES."""
    status, detail = run_figures(throughput_command(FIGURES), log)
    where = os.path.relpath(FIGURES, ROOT)
    return status, f"{detail}; figures in {where}/" if status == "PASS" else detail


RUNNERS = {"smoke": smoke_sweep, "throughput": throughput}  # the items that are not pytest nodes


def slug(name: str) -> str:
    """A file name's worth of an item's name: ``NCCL sharded == ...`` -> ``nccl-sharded-...``."""
    return "-".join(re.findall(r"[a-z0-9]+", name.lower()))[:60]


def listing() -> str:
    """Every item with the GPUs it needs, as a machine without GPUs prints them."""
    return "\n".join(f"NOT RUN  {name} ({need} GPU)" for name, need, _ in ITEMS)


def main(argv: list[str]) -> int:
    if argv == ["--list"]:  # what a GPU host would run (no torch needed)
        print(listing())
        return 0
    if "--logs" in argv and argv.index("--logs") + 1 == len(argv):
        print("gpu-check: --logs needs a folder (--logs DIR)", file=sys.stderr)
        return 2
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print(listing())
        print("gpu-check: torch sees no GPU; nothing was run", file=sys.stderr)
        return 1
    logs = None
    if "--logs" in argv:
        i = argv.index("--logs")
        logs, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
        os.makedirs(logs, exist_ok=True)
    wanted = [a.lower() for a in argv]
    results: list[tuple[str, int]] = []
    for n, (name, need, what) in enumerate(ITEMS):
        if wanted and not any(w in name.lower() for w in wanted):
            continue
        t0 = time.time()
        log = None if logs is None else os.path.join(logs, f"{n:02d}-{slug(name)}.log")
        if need > gpus:
            status, detail = "SKIP", f"needs {need} GPUs, this machine has {gpus}"
        elif what in RUNNERS:
            status, detail = RUNNERS[what](gpus, log)
        else:
            status, detail = run_pytest(what, log)
        results.append((status, need))
        print(f"{status}  {name} ({need} GPU)  [{time.time() - t0:.0f}s]  {detail}", flush=True)
    line, code = verdict(results, gpus)
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
