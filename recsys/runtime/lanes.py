"""Work done a few items at a time in threads of one process (``in_lanes``): the references of a
sweep side by side (``recsys.tune.baselines``), a retrain's trainings at once
(``recsys.lifecycle.retrain``). Each item's work waits on Ray (a Tune experiment, a training), so
threads are enough; Ray decides where the work runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def in_lanes(fn: Callable[[T], None], items: Sequence[T], together: int,
             name: str = "lane") -> None:  # fmt: skip
    """``fn`` of every item, ``together`` at a time (the caller's thread one lane, each other
    lane a daemon thread ``<name>-<k>``: a driver's exit ends it), started in ``items``' order;
    after all of them have ended, re-raises the first error any raised. An interrupt
    (``KeyboardInterrupt``, ``SystemExit``) starts no further item, and in the caller's lane goes
    on up at once."""
    if together <= 1:
        for item in items:
            fn(item)
        return
    todo: list[T] = list(items)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def lane(caller: bool = False) -> None:
        while True:
            with lock:
                if not todo:
                    return
                item = todo.pop(0)
            try:
                fn(item)
            except Exception as e:  # (re-raised in the caller's thread once all have ended)
                errors.append(e)
            except BaseException as e:
                with lock:
                    todo.clear()
                if caller:
                    raise
                errors.append(e)
                return

    threads = [threading.Thread(target=lane, name=f"{name}-{k}", daemon=True)
               for k in range(1, min(together, len(todo)))]  # fmt: skip
    for t in threads:
        t.start()
    lane(caller=True)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
