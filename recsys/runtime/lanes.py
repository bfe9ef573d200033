"""Work done a few items at a time in threads of one process (``in_lanes``): the references of a
sweep side by side (``recsys.tune.baselines``), a retrain's trainings at once
(``recsys.lifecycle.retrain``). Each item's work waits on Ray (a Tune experiment, a training), so
threads are enough; Ray decides where the work runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def in_lanes(
    fn: Callable[[T], None],
    items: Sequence[T],
    together: int,
    name: str = "lane",
    *,
    caller: bool = True,
    keep_going: bool = True,
) -> None:
    """``fn`` of every item, ``together`` at a time, started in ``items``' order; after every
    lane has ended, re-raises the first interrupt a lane raised, else the first error.

    With ``together`` <= 1 every item runs in the caller's thread, one after another, and the
    first error goes on up at once. Otherwise each lane is a daemon thread ``<name>-<k>`` (a
    driver's exit ends it), and with ``caller`` the caller's thread is one of them. Without
    ``caller`` the caller only waits: Ray Train's ``fit()`` in the main thread takes SIGINT for
    its own run and keeps it after, so that a Ctrl-C while the main thread waited on the other
    lanes would reach a run that has ended. ``keep_going``: after an item's error the lanes go
    on with the items left (else they start none further, and those running end). An interrupt
    (``KeyboardInterrupt``, ``SystemExit``) starts no further item, and in the caller's thread
    (its lane, or its wait) goes on up at once."""
    if together <= 1:
        for item in items:
            fn(item)
        return
    todo: list[T] = list(items)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def lane(in_caller: bool = False) -> None:
        while True:
            with lock:
                if not todo:
                    return
                item = todo.pop(0)
            try:
                fn(item)
            except Exception as e:  # (re-raised in the caller's thread once all have ended)
                with lock:
                    errors.append(e)
                    if not keep_going:
                        todo.clear()
            except BaseException as e:
                with lock:
                    todo.clear()
                    if not in_caller:
                        errors.append(e)
                if in_caller:
                    raise
                return

    lanes = min(together, len(todo))
    threads = [threading.Thread(target=lane, name=f"{name}-{k}", daemon=True)
               for k in range(1 if caller else 0, lanes)]  # fmt: skip
    try:  # (from the first start: an interrupt here starts nothing further)
        for t in threads:
            t.start()
        if caller:
            lane(in_caller=True)
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # (in steps: an interrupt reaches the caller's thread at once)
    except BaseException:
        with lock:
            todo.clear()
        raise
    if errors:
        raise next((e for e in errors if not isinstance(e, Exception)), errors[0])
