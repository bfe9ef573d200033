"""MLflow writes done in order by a thread of their own (``Writer``), so that the loop that
makes them never waits for the store: a sweep's driver logs its trials' reports so
(``recsys.tune.driver_log``).

A write that meets an unreachable store (``recsys.tracking.store.unreachable``) is tried again,
after 1, 2, 4 .. 30 s, in front of the later ones: a warning says so once, and another when the
store answers again. Its calls must raise what MLflow did not take (a ``strict`` ``Tracker``).
A write that fails otherwise (MLflow refused it: a run deleted in its UI) is dropped with a
warning naming it, so that it does not hold the others forever. ``abandon`` gives up on what is
left.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from recsys.tracking.store import short, unreachable

log = logging.getLogger(__name__)

RETRY_S = (1.0, 30.0)  # the first and the longest wait before a write is tried again


class Writer:
    """Calls done in order by one thread, each tried again while the store ``uri`` is
    unreachable. ``add`` queues a call and returns its number; ``wait`` waits for the calls up
    to a number; ``close`` lets the thread end once nothing is left (a later ``add`` starts
    another). ``what`` names the writes in the warnings."""

    def __init__(self, uri: str, what: str) -> None:
        self.uri, self.what = uri, what
        self._calls: collections.deque[tuple[int, str, Callable[[], None]]] = collections.deque()
        self._added = self._done = 0  # calls queued, calls done or given up (in order)
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing_since: float | None = None  # the store unreachable at the head call

    def add(self, name: str, call: Callable[[], None]) -> int:
        """Queue ``call`` (``name``: what it writes, for a warning); its number."""
        with self._cv:
            self._added += 1
            self._calls.append((self._added, name, call))
            self._closed = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mlflow-writer", daemon=True)
                self._thread.start()
            self._cv.notify_all()
            return self._added

    def pending(self) -> int:
        """How many calls are not done yet."""
        with self._cv:
            return self._added - self._done

    def failing(self) -> bool:
        """Whether the call at the head met an unreachable store (and waits to be tried again)."""
        with self._cv:
            return self._failing_since is not None

    def wait(
        self, seq: int | None = None, timeout: float | None = None, settle: bool = False
    ) -> bool:
        """Wait until the calls up to number ``seq`` (None: every call queued so far) are done,
        at most ``timeout`` seconds (``settle``: or until the store is found unreachable);
        whether they are done."""
        with self._cv:
            last = self._added if seq is None else seq
            self._cv.wait_for(
                lambda: self._done >= last or (settle and self._failing_since is not None),
                timeout,
            )
            return self._done >= last

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread end once the calls queued are done; wait up to ``timeout`` for it."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def abandon(self) -> int:
        """Give up on the calls not done (the one in progress may still land); how many."""
        with self._cv:
            left = self._added - self._done
            self._calls.clear()
            self._done = self._added
            self._cv.notify_all()
        self.close()
        return left

    def running(self) -> bool:
        with self._cv:
            return self._thread is not None

    def _run(self) -> None:
        try:
            self._work()
        finally:  # (ended by an error of its own: a later ``add`` starts another thread)
            with self._cv:
                if self._thread is threading.current_thread():
                    self._thread = None
                    self._failing_since = None
                self._cv.notify_all()

    def _work(self) -> None:
        delay = RETRY_S[0]
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._calls) or self._closed)
                if not self._calls:  # (closed: ``add`` sees no thread from here on)
                    self._thread = None
                    return
                seq, name, call = self._calls[0]
            try:
                call()
            except Exception as e:
                if unreachable(e):
                    self._unreachable(e)
                    self._pause(seq, delay)
                    delay = min(2 * delay, RETRY_S[1])
                    continue
                log.warning("MLflow %s: could not write %s (%s): dropped", self.uri, name, short(e))
            delay = RETRY_S[0]
            with self._cv:
                if self._failing_since is not None:
                    log.warning("MLflow %s: reachable again after %.0f s; the %s that waited "
                                "are being written", self.uri,
                                time.monotonic() - self._failing_since, self.what)  # fmt: skip
                    self._failing_since = None
                if self._calls and self._calls[0][0] == seq:  # (not abandoned meanwhile)
                    self._calls.popleft()
                    self._done = seq
                self._cv.notify_all()

    def _pause(self, seq: int, delay: float) -> None:
        """Wait ``delay`` seconds before call ``seq`` is tried again (less, if it is abandoned)."""
        with self._cv:
            self._cv.wait_for(lambda: not self._calls or self._calls[0][0] != seq, delay)

    def _unreachable(self, error: Exception) -> None:
        with self._cv:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "MLflow %s unreachable (%s): %d %s wait, tried again until the store "
                    "answers; the work goes on", self.uri, short(error),
                    self._added - self._done, self.what,
                )  # fmt: skip
            self._cv.notify_all()
