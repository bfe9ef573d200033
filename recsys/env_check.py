"""Check that the pinned stack imports and that FBGEMM runs: ``python -m recsys.env_check``.

Exits non-zero with a message naming the broken piece. Used by ``scripts/setup.sh`` to prove an
install, and handy on a new cluster node.
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

    cuda = torch.version.cuda or "none"
    print(
        f"ok: torch {torch.__version__} (cuda {cuda}, {torch.cuda.device_count()} GPUs), "
        f"torchrec {torchrec.__version__}, {variant}, ray {ray.__version__}, "
        f"mlflow {mlflow.__version__}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
