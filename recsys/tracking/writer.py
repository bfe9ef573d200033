"""MLflow writes done in order by a thread of their own (``Writer``), so that the loop that
makes them never waits for the store: a sweep's driver logs its trials' reports so
(``recsys.tune.driver_log``).

A write that meets an unreachable store (``recsys.tracking.store.unreachable``) is tried again,
after 1, 2, 4 .. 30 s, in front of the later ones: a warning says so once, and another when the
store answers again. A write that fails otherwise (MLflow refused it: a run deleted in its UI) is
dropped with a warning naming it, so that it does not hold the others forever.
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
        self._added = self._done = 0  # calls queued, calls done (in order)
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, name: str, call: Callable[[], None]) -> int:
        """Queue ``call`` (``name``: what it writes, for a warning); its number."""
        with self._cv:
            self._added += 1
            self._calls.append((self._added, name, call))
            self._closed = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="mlflow-writer", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()
            return self._added

    def pending(self) -> int:
        """How many calls are not done yet."""
        with self._cv:
            return self._added - self._done

    def wait(self, seq: int | None = None, timeout: float | None = None) -> bool:
        """Wait until the calls up to number ``seq`` (None: every call queued so far) are done,
        at most ``timeout`` seconds; whether they are."""
        with self._cv:
            last = self._added if seq is None else seq
            return self._cv.wait_for(lambda: self._done >= last, timeout)

    def close(self) -> None:
        """The thread ends once the calls queued are done."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def running(self) -> bool:
        with self._cv:
            return self._thread is not None

    def _work(self) -> None:
        failing_since: float | None = None
        delay = RETRY_S[0]
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._calls) or self._closed)
                if not self._calls:
                    self._thread = None
                    return
                seq, name, call = self._calls[0]
            try:
                call()
            except Exception as e:
                if unreachable(e):
                    if failing_since is None:
                        failing_since = time.monotonic()
                        log.warning(
                            "MLflow %s unreachable (%s): %d %s wait, tried again until the "
                            "store answers; the work goes on", self.uri, short(e),
                            self.pending(), self.what,
                        )  # fmt: skip
                    time.sleep(delay)
                    delay = min(2 * delay, RETRY_S[1])
                    continue
                log.warning("MLflow %s refused %s (%s): dropped", self.uri, name, short(e))
            if failing_since is not None:
                log.warning("MLflow %s: reachable again after %.0f s; the %s that waited are "
                            "being written", self.uri, time.monotonic() - failing_since,
                            self.what)  # fmt: skip
                failing_since, delay = None, RETRY_S[0]
            with self._cv:
                self._calls.popleft()
                self._done = seq
                self._cv.notify_all()
