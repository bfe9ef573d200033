"""Running a preparation's tasks: in this process (``workers=0``), or as Ray tasks on a local Ray
or a cluster, with the first failure in input order raised as a loop would raise it.

Large results (a piece's statistics) can stay in Ray's object store (``map_keep``) and be merged
by a tree of tasks (``tree_merge``): the driver never holds them all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from recsys.data.errors import DataError


class Executor:
    """Runs a function over many argument tuples in this process (``workers=0``) or as Ray
    tasks (one CPU each). The first failing call in input order raises, as it would in a loop:
    later calls are cancelled, a ``DataError`` comes back as it was raised."""

    def __init__(self, workers: int | None, address: str | None, object_store_mb: int | None,
                 progress: bool) -> None:  # fmt: skip
        self.local = workers == 0 and address is None
        self.progress = progress
        self.started = False
        if not self.local:
            import ray

            from recsys.runtime.cluster import connect

            self.started = not ray.is_initialized()
            connect(address or "local", num_cpus=None if address else workers, log_to_driver=False,
                    object_store_memory=object_store_mb, dashboard=False)  # fmt: skip

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()

    def put(self, obj: Any) -> Any:
        """``obj`` for the tasks: stored once in Ray's object store (read without copies)."""
        if self.local:
            return obj
        import ray

        return ray.put(obj)

    def map(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], what: str) -> list[Any]:
        """``[fn(*args) for args in calls]``, with a progress bar of tasks done."""
        return [r[0] for r in self._run(fn, calls, what, split=False)]

    def map_keep(
        self, fn: Callable[..., tuple[Any, Any]], calls: list[tuple[Any, ...]], what: str
    ) -> list[tuple[Any, Any]]:
        """As ``map`` for a ``fn`` returning ``(large, small)``: the small results come back,
        the large ones stay where the tasks left them (Ray: object references, which later
        tasks take as arguments; the driver never holds them all)."""
        return self._run(fn, calls, what, split=True)

    def get(self, obj: Any) -> Any:
        if self.local:
            return obj
        import ray

        return ray.get(obj)

    def _run(
        self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], what: str, split: bool
    ) -> list[tuple[Any, Any]]:
        from tqdm import tqdm

        with tqdm(total=len(calls), desc=what, unit="piece", disable=not self.progress,
                  file=sys.stderr, leave=False) as bar:  # fmt: skip
            if self.local:
                out = []
                for args in calls:
                    r = fn(*args)
                    out.append(r if split else (r, None))
                    bar.update(1)
                return out
            return self._gather(fn, calls, bar, split)

    def _gather(
        self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], bar: Any, split: bool
    ) -> list[tuple[Any, Any]]:
        import ray

        remote = ray.remote(num_cpus=1, max_retries=0, num_returns=2 if split else 1)(fn)
        started = [remote.remote(*args) for args in calls]
        refs = [r[1] if split else r for r in started]  # waited on and fetched
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending, failed, error = list(refs), len(refs), None
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                    bar.update(1)
                except ray.exceptions.RayTaskError as e:
                    if i < failed:  # an earlier piece's error wins: cancel everything after it
                        failed, error = i, e.cause if isinstance(e.cause, DataError) else e
                        for later in [r for r in pending if index[r] > i]:
                            ray.cancel(later)
                        pending = [r for r in pending if index[r] < i]
        if error is not None:
            raise error
        if split:
            return [(started[i][0], results[i]) for i in range(len(refs))]
        return [(results[i], None) for i in range(len(refs))]


def tree_merge(ex: Executor, items: list[Any], merge: Callable[[Any, Any], Any]) -> Any:
    """``items`` (values or object references) merged pairwise by a tree of merge tasks
    (``merge`` is associative); the result is fetched."""
    level = items
    while len(level) > 1:
        pairs = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        merged = [big for big, _ in ex.map_keep(_with_nothing(merge), pairs, "merge")]
        level = merged + ([level[-1]] if len(level) % 2 else [])
    return ex.get(level[0])


def _with_nothing(fn: Callable[..., Any]) -> Callable[..., tuple[Any, None]]:
    def run(*args: Any) -> tuple[Any, None]:
        return fn(*args), None

    run.__name__ = getattr(fn, "__name__", "merge")
    return run
