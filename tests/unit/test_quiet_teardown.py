"""The console. The traceback Python prints when Ray's SIGTERM handler raises ``SystemExit``
inside a weakref callback (an actor Ray ends while its main thread runs one) is dropped from the
workers' lines the driver prints; every other line, other ignored exceptions included, is kept.
Ray's token notice is one line that says what it means."""

from __future__ import annotations

import subprocess
import sys

from recsys.runtime.cluster import QuietTeardown, drop_sigterm_tracebacks

# a process with a SIGTERM handler like Ray's worker's (raises SystemExit), which receives the
# SIGTERM while its main thread runs a WeakSet's removal callback, as a Ray actor may
SIGTERM_IN_CALLBACK = """
import gc, os, signal, sys, weakref

def sigterm_handler(signum, frame):
    sys.exit(1)

signal.signal(signal.SIGTERM, sigterm_handler)

class Item:
    pass

def callback(ref):
    print("before", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # delivered while this callback runs
    for _ in range(1000):
        pass

item = Item()
ref = weakref.ref(item, callback)
del item
gc.collect()
print("kept: a line of its own", file=sys.stderr, flush=True)
"""


def sigterm_lines(handler_name: str) -> list[str]:
    code = SIGTERM_IN_CALLBACK.replace("sigterm_handler", handler_name)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stderr.splitlines()


def test_the_sigterm_traceback_is_dropped_and_the_rest_kept():
    lines = sigterm_lines("sigterm_handler")
    assert any(line.startswith("Exception ignored in") for line in lines), lines
    assert any(line.startswith("SystemExit") for line in lines), lines
    kept = drop_sigterm_tracebacks(lines)
    assert kept == ["before", "kept: a line of its own"], kept


def test_another_ignored_exception_is_kept():
    lines = sigterm_lines("another_handler")  # not Ray's handler: the block stays
    assert drop_sigterm_tracebacks(lines) == lines
    value_error = ["Exception ignored in: <function f>", "Traceback (most recent call last):",
                   '  File "x.py", line 1, in f', "ValueError: boom", "next line"]  # fmt: skip
    assert drop_sigterm_tracebacks(value_error) == value_error


def test_the_driver_prints_the_rest_of_a_batch_and_nothing_for_a_dropped_one():
    printed: list[list[str]] = []
    quiet = QuietTeardown(lambda data: printed.append(data["lines"]))
    lines = sigterm_lines("sigterm_handler")
    quiet({"is_err": True, "lines": lines, "pid": 1})
    own = ("before", "kept: a line of its own")
    quiet({"is_err": True, "lines": [x for x in lines if x not in own]})
    quiet({"is_err": False, "lines": ["stdout line"]})
    assert printed == [["before", "kept: a line of its own"], ["stdout line"]]


def test_rays_token_notice_says_what_it_means():
    """Ray's own warning (its function, its logger) comes out as one line a user can act on."""
    import logging

    from ray._private.authentication import authentication_token_setup as setup

    from recsys.runtime.cluster import token_notice

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    token_notice()
    keep = Keep()
    setup.logger.addHandler(keep)  # (Ray's loggers may not propagate to the root)
    try:
        setup._warn_token_auth_enabled()
    finally:
        setup.logger.removeHandler(keep)
    (record,) = keep.records
    assert record.getMessage() == (
        "Ray: token authentication is on for this local Ray (the token is in "
        "~/.ray/auth_token; nothing to do; RAY_AUTH_MODE=disabled turns it off)"
    )


def test_a_dead_raylets_report_is_one_line():
    from recsys.runtime.cluster import short_raylet_death

    lines = [
        "Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL "
        "by the user. Last 20 lines of the Raylet logs:",
        "    [2026-11-27 13:11:15,586 I 14680 14680] (raylet) accessor.cc:475: Received ...",
        "    [2026-11-27 13:11:18,081 I 14680 14680] (raylet) worker_pool.cc:564: Started ...",
        "",
        "The node with node id: 6bca and address: 127.0.0.3 has been marked dead",
    ]
    assert short_raylet_death(lines) == [
        "Raylet is terminated. Termination is unexpected. (its log: the node's raylet.out)",
        "The node with node id: 6bca and address: 127.0.0.3 has been marked dead",
    ]
