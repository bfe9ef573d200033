"""Run a function on N ranks in processes of their own (as TorchRec's multi-process tests do):
gloo on CPU, or NCCL with rank ``r`` on ``cuda:r`` (the ``gpu`` tests).

The ranks are forked from a server process that imported torch, TorchRec and the trainer once
(multiprocessing's ``forkserver``, ``PRELOAD``), not started anew: a spawned rank spent seconds of
CPU importing them before its first line, in every one of the suite's many multi-rank tests. The
server runs no torch op before it forks; each rank takes the caller's environment and working
directory as they are at the call, though what the imports read of the environment (thread
counts, ``TORCH_*``) is as it was when the server started. NCCL ranks are spawned: importing
FBGEMM asks CUDA whether a GPU is there, and a CUDA process must not fork."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# what the fork server imports once; its ranks find them imported
PRELOAD = ["torch", "torchrec", "torchrec.distributed", "recsys.train.trainer",
           "tests.distributed.common"]  # fmt: skip


def _worker(
    rank: int, world: int, port: int, backend: str, fn: Callable[..., Any], args: tuple, q: Any,
    env: dict[str, str], cwd: str,
) -> None:  # fmt: skip
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world)
        # plain pickle: tensors travel as bytes, not as shared memory the child would take along
        q.put((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 300,
    backend: str = "gloo",
) -> list:
    """``[fn(rank, world_size, *args) for each rank]``; a rank's exception fails the caller."""
    if backend == "nccl":  # importing FBGEMM asks CUDA whether it is there: no fork after it
        ctx = mp.get_context("spawn")
    else:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
    q = ctx.Queue()
    port = free_port()
    env, cwd = dict(os.environ), os.getcwd()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, backend, fn, args, q, env, cwd))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            try:
                rank, status, value = q.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise AssertionError(f"ranks died or hung (exit codes {dead})") from None
                continue
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]
