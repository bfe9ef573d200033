"""The checks only a GPU host can run, one line each: ``./run.sh gpu-check`` (which first sets up
the CUDA stack and runs FBGEMM's CUDA kernels through ``python -m recsys.env_check``).

    ./run.sh gpu-check            # every item; exit status 1 if any failed
    ./run.sh gpu-check resume     # only the items whose name contains "resume"

Items that need more GPUs than the machine has are reported as skipped, not failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests/gpu/test_gpu.py::"
ITEMS = [
    ("NCCL sharded == unsharded, row/table/column-wise + QR, debug gather (2 GPUs)",
     TESTS + "test_nccl_sharded_matches_unsharded_row_and_table_wise[plain]"),
    ("TrainPipelineSparseDist on CUDA streams == unsharded (2 GPUs)",
     TESTS + "test_nccl_sharded_matches_unsharded_row_and_table_wise[pipeline]"),
    ("exact resume on NCCL, fp32 / fp16 / bf16 tables, CUDA RNG restored (2 GPUs)",
     TESTS + "test_nccl_resume_is_exact"),
    ("export of a GPU-trained checkpoint (2 GPUs)",
     TESTS + "test_export_of_a_gpu_trained_checkpoint"),
    ("Ray Train worker killed, restart from its checkpoint on NCCL (2 GPUs)",
     TESTS + "test_killed_gpu_worker_restarts_from_last_checkpoint"),
    ("the planner is told this GPU's memory (1 GPU)", TESTS + "test_the_planner_sees_this_gpu"),
]  # fmt: skip


def run_pytest(node: str) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    text = out.stdout + out.stderr
    last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
    if out.returncode == 0 and " passed" in last[0] and "skipped" not in last[0]:
        return "PASS", last[0]
    if out.returncode == 0 and "skipped" in last[0]:
        reason = [line for line in text.splitlines() if line.startswith("SKIPPED")][:1]
        return "SKIP", (reason or last)[0]
    failed = [line for line in text.splitlines() if line.startswith(("E ", "FAILED"))]
    return "FAIL", (failed or last)[-1][:300]


def smoke_sweep(gpus: int) -> tuple[str, str]:
    workers = min(2, gpus)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--smoke-test",
            "--gpus", "--num-workers", str(workers), "--cpus-per-worker", "1", "--name",
            "gpu-smoke", "--storage", os.path.join(tmp, "runs"),
            "--tracking-uri", f"sqlite:///{tmp}/mlflow.db",
        ]  # fmt: skip
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    ok = out.returncode == 0 and "best trials" in out.stdout
    tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or [""]
    return ("PASS" if ok else "FAIL"), f"{workers} worker(s) per trial; {tail[0][:300]}"


def main(argv: list[str]) -> int:
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("gpu-check: torch sees no GPU; nothing was run", file=sys.stderr)
        return 1
    wanted = [a.lower() for a in argv]
    items: list[tuple[str, object]] = [(name, node) for name, node in ITEMS]
    items.append((f"2-trial smoke sweep with --gpus ({gpus} GPU(s) here)", smoke_sweep))
    results = []
    for name, what in items:
        if wanted and not any(w in name.lower() for w in wanted):
            continue
        t0 = time.time()
        status, detail = smoke_sweep(gpus) if callable(what) else run_pytest(str(what))
        results.append(status)
        print(f"{status}  {name}  [{time.time() - t0:.0f}s]  {detail}", flush=True)
    failed = results.count("FAIL")
    print(f"gpu-check: {results.count('PASS')} passed, {failed} failed, "
          f"{results.count('SKIP')} skipped on {gpus} GPU(s)")  # fmt: skip
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
