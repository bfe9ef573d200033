"""Check that the pinned stack imports and that FBGEMM runs: ``python -m recsys.runtime.env_check``.

Exits non-zero with a message naming the broken piece. Used by ``scripts/setup.sh`` to prove an
install, and handy on a new cluster node. With a GPU present it also runs FBGEMM's CUDA kernels
(a table-batched embedding forward and backward with the fused optimizer): an install whose CUDA
kernels cannot load, or the CPU build of FBGEMM on a GPU host, fails here, not in a trial.
"""

from __future__ import annotations

import importlib.metadata as md
import sys


def installed(dist: str) -> str | None:
    """Version of an installed distribution, or None."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_fbgemm_variant() -> str:
    """Name the one installed FBGEMM distribution; both at once share a folder and break it."""
    gpu, cpu = installed("fbgemm-gpu"), installed("fbgemm-gpu-cpu")
    if gpu and cpu:
        raise SystemExit(
            f"both fbgemm-gpu {gpu} and fbgemm-gpu-cpu {cpu} are installed; they write the same "
            "fbgemm_gpu/ folder. Uninstall both and re-run scripts/setup.sh."
        )
    if not (gpu or cpu):
        raise SystemExit("no FBGEMM installed (fbgemm-gpu or fbgemm-gpu-cpu); run scripts/setup.sh")
    return f"fbgemm-gpu {gpu}" if gpu else f"fbgemm-gpu-cpu {cpu}"


def check_gpu() -> str:
    """Run FBGEMM on every visible GPU; a description of them, or raise SystemExit."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    if installed("fbgemm-gpu") is None:
        raise SystemExit("a GPU is present but fbgemm-gpu-cpu is installed: run "
                         "RECSYS_FBGEMM=cuda bash scripts/setup.sh")  # fmt: skip
    names = []
    for i in range(torch.cuda.device_count()):
        device = torch.device("cuda", i)
        try:
            lengths = torch.tensor([1, 2, 3], dtype=torch.int64, device=device)
            offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
            tbe = SplitTableBatchedEmbeddingBagsCodegen(
                [(100, 16, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)],
                optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                device=device,
            )
            before = tbe.split_embedding_weights()[0].clone()
            out = tbe(torch.tensor([1, 2, 3, 4, 5, 6], device=device), offsets)
            out.sum().backward()  # the fused optimizer updates the rows in backward
            torch.cuda.synchronize(device)
        except Exception as e:
            raise SystemExit(f"FBGEMM's CUDA kernels failed on {device}: {e}") from e
        if offsets.tolist() != [0, 1, 3, 6] or torch.equal(
            before, tbe.split_embedding_weights()[0]
        ):
            raise SystemExit(f"FBGEMM gave wrong results on {device}")
        names.append(torch.cuda.get_device_name(device))
    return ", ".join(names)


def main() -> None:
    variant = check_fbgemm_variant()
    import torch

    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
        import torchrec
    except (ImportError, OSError) as e:
        raise SystemExit(
            f"torchrec/fbgemm_gpu failed to import with torch {torch.__version__}: {e}"
        ) from e
    lengths = torch.tensor([1, 2, 3], dtype=torch.int64)
    offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    if offsets.tolist() != [0, 1, 3, 6]:
        raise SystemExit(f"FBGEMM op gave wrong offsets: {offsets.tolist()}")
    import mlflow
    import ray

    if torch.cuda.is_available():
        print(f"FBGEMM CUDA kernels ran on: {check_gpu()}", file=sys.stderr)
    cuda = torch.version.cuda or "none"
    print(
        f"ok: torch {torch.__version__} (cuda {cuda}, {torch.cuda.device_count()} GPUs), "
        f"torchrec {torchrec.__version__}, {variant}, ray {ray.__version__}, "
        f"mlflow {mlflow.__version__}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
