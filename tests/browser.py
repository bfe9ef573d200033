"""A real browser for the tests: headless Chromium (Debian's ``chromium``) driven over the
DevTools protocol, through a minimal WebSocket client of the standard library (no Selenium, no
Playwright, no driver download).

    with Chromium(width=1600, height=1000) as page:
        page.open(url, local_storage={"key_v1": "true"})
        names = page.wait_for("[...document.querySelectorAll('.ag-row')].length || null")
        page.screenshot("shot.png")

Used by ``tests/ray/test_sweep.py`` (the MLflow UI on the sweep's printed link) and by
``scripts/mlflow_screenshot.py`` (the screenshot in docs/results.md). ``./run.sh test`` installs
Debian's ``chromium`` where it can (``scripts/test_services.sh``, unless ``RECSYS_NO_APT=1``);
without it the browser tests are skipped, saying why (``missing``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.servers import stop_group

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ENV = "RECSYS_CHROMIUM"  # a browser binary to use instead of the first of NAMES on PATH


def binary() -> str | None:
    if os.environ.get(ENV):
        return shutil.which(os.environ[ENV])
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def missing() -> str | None:
    """Why no headless Chromium can be had here, or None when it can."""
    if binary() is not None:
        return None
    where = f"none of {', '.join(NAMES)} on PATH"
    if os.environ.get(ENV):
        where = f"${ENV} ({os.environ[ENV]}) is not a program"
    if os.environ.get("RECSYS_NO_APT") == "1":
        return (
            f"no Chromium ({where}) and RECSYS_NO_APT=1 kept ./run.sh test from installing it: "
            "unset RECSYS_NO_APT, or install Debian's chromium, to run this"
        )
    return f"no Chromium ({where}); ./run.sh test installs Debian's chromium where apt-get can run"


class _WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: text frames out (masked), text frames
    in (any length, fragmented or not), pings answered."""

    def __init__(self, url: str, timeout: float) -> None:
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            .encode()
        )  # fmt: skip
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the WebSocket: {head[:300]!r}")

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the browser closed the DevTools connection")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _frame(self, opcode: int, data: bytes) -> None:
        n, mask = len(data), os.urandom(4)
        if n < 126:
            head = struct.pack(">BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, n)
        keys = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(data, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")
        self.sock.sendall(head + mask + masked)

    def send(self, text: str) -> None:
        self._frame(0x1, text.encode())

    def recv(self) -> str:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else b""
            payload = self._take(n)
            if mask:
                keys = (mask * (n // 4 + 1))[:n]
                payload = bytes(a ^ b for a, b in zip(payload, keys, strict=True))
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the browser closed the DevTools connection")
            if opcode == 0x9:
                self._frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Chromium:
    """A headless Chromium of its own (a fresh profile in a temporary folder, a session of its
    own: ``close`` ends it and everything it started) and its one page, driven over DevTools."""

    def __init__(self, width: int = 1600, height: int = 1000, timeout: float = 60.0) -> None:
        found = binary()
        assert found, missing()
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="recsys-chromium-")
        self.log = os.path.join(self.profile, "chromium.log")
        cmd = [found, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--no-default-browser-check", "--disable-extensions",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--mute-audio", "--hide-scrollbars", f"--window-size={width},{height}",
               f"--user-data-dir={self.profile}", "--remote-debugging-address=127.0.0.1",
               "--remote-debugging-port=0", "about:blank"]  # fmt: skip
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._id = 0
        try:
            self.ws = _WebSocket(self._page_socket(), timeout)
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=1, mobile=False)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _page_socket(self) -> str:
        """The DevTools WebSocket of the browser's first page (the port it chose is written to
        ``DevToolsActivePort`` in its profile)."""
        active = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited ({self.proc.returncode}): {self._log_tail()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                port = int(Path(active).read_text().split()[0])
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.2)
        raise RuntimeError(f"chromium's DevTools did not come up: {self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log).read_text(errors="replace")[-2000:]
        return ""

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events in between are dropped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"DevTools {method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def open(self, url: str, local_storage: dict[str, str] | None = None) -> None:
        """Navigate to ``url``; ``local_storage``: entries set before the page's own scripts
        run (its origin's), on this and every later page."""
        if local_storage:
            sets = "".join(
                f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                for k, v in local_storage.items()
            )
            script = f"try {{{sets}}} catch (e) {{}}"
            self.call("Page.addScriptToEvaluateOnNewDocument", source=script)
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        out = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"in the page: {out['exceptionDetails']}")
        return out.get("result", {}).get("value")

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''") or "")

    def wait_for(self, expression: str, timeout: float | None = None, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; its value. A timeout names ``what`` (or the
        expression) and shows the page's text."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            with contextlib.suppress(RuntimeError):  # (the page may be between documents)
                if value := self.evaluate(expression):
                    return value
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the page never showed {what or expression!r}; its text:\n{self.text()[:3000]}"
                )
            time.sleep(0.25)

    def screenshot(self, path: str) -> None:
        """A PNG of the viewport."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            stop_group(self.proc, timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


# The MLflow UI (3.17). Its runs table is an AG Grid: one `.ag-row` per run (`row-id`: the run's
# id), split over a pinned and a scrolled container, each cell with its column's `col-id`
# (attributes.`Run Name`, metrics.`best_val_auc`, params.`optim.lr`); header cells likewise.
_RUNS_TABLE = """(column => {
  const rows = {}, headers = {};
  for (const h of document.querySelectorAll('.ag-header-cell[col-id]'))
    headers[h.getAttribute('col-id')] = h.innerText.trim();
  for (const row of document.querySelectorAll('.ag-row[row-id]')) {
    const cells = rows[row.getAttribute('row-id')] ||= {};
    cells.index = Number(row.getAttribute('row-index'));
    for (const cell of row.querySelectorAll('.ag-cell[col-id]'))
      cells[cell.getAttribute('col-id')] = cell.innerText.trim();
  }
  const ready = column in headers && Object.values(rows).some(r => column in r);
  return ready ? {rows, headers, title: document.title} : null;
})"""
# the assistant's panel (opened on a first visit) and the shared view's banner: closed for a picture
_PANELS = ("mlflow.assistant.chat_panel.close", "mlflow.experiment_page.shared_view.dismiss")


def runs_table(page: Chromium, column: str, timeout: float | None = None) -> dict[str, Any]:
    """The MLflow UI's runs table as the page shows it, once it shows ``column`` (a ``col-id``):
    ``{"title": ..., "headers": {col-id: text}, "rows": {run id: {col-id: text, "index": row}}}``
    (only the rows and columns the grid has drawn: a wide enough page draws them all)."""
    found = page.wait_for(f"{_RUNS_TABLE}({json.dumps(column)})", timeout, f"a {column} column")
    return dict(found)


def close_panels(page: Chromium) -> None:
    """Close the MLflow UI's assistant panel and shared-view banner, where shown."""
    for component in _PANELS:
        page.evaluate(f"document.querySelector('[data-component-id=\"{component}\"]')?.click()")
