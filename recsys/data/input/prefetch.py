"""Batches made ahead of the training step in a background thread.

TorchRec's train pipeline pulls the next batch before it launches the current forward, so the host
work of a batch (the shuffled gather from memory-mapped files, ids modulo table rows, the QR split,
pinning) sits on the step's critical path when it runs on the training thread. ``Prefetcher``
runs the source iterator in one background thread, ``depth`` batches ahead, through a bounded
queue: batches come out in the source's order, so the data order (and exact resume, whose data
position is the trainer's count of consumed rows, not the stream's) is unchanged. The numpy
gathers and copies release the GIL, so the thread overlaps the step's compute.

On a GPU worker the thread first makes the worker's GPU its current device (as torch's own
``DataLoader`` pin thread does): pinning and any CUDA call in the thread would otherwise go to
GPU 0, creating a context there for every worker of the node.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


class _End:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Prefetcher(Generic[T]):
    """Iterate ``source`` in a background thread, at most ``depth`` items ahead; an exception of
    the source is raised by ``next`` in the caller's thread. ``close`` stops the thread.
    ``device``: the worker's device; a CUDA device becomes the thread's current device."""

    def __init__(self, source: Iterator[T], depth: int, device: torch.device | None = None
                 ) -> None:  # fmt: skip
        if depth < 1:
            raise ValueError(f"prefetch depth {depth}: must be >= 1")
        self.source, self.device = source, device
        self.queue: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="recsys-prefetch", daemon=True)
        self.thread.start()

    def _put(self, item: T | _End) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            for item in self.source:
                if not self._put(item):
                    return
            self._put(_End())
        except BaseException as e:  # raised again in the consumer's thread
            self._put(_End(e))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        item = self.queue.get()
        if isinstance(item, _End):
            self.queue.put(item)  # later calls end the same way
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    def close(self) -> None:
        self.stopping.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=10)
