"""A ``wmrl-serve`` subprocess for tests (issue 28): start on a free loopback port, stop, never leak."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """A ``wmrl-serve`` subprocess on 127.0.0.1 (any free port)."""

    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "wrappers.serving.cli", "--port", "0", "--max-turns", "1", *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if "serving" in line or not line:
                break
        assert "on http://" in line, f"server did not start: {line!r}"
        self.url = line.strip().rsplit(" ", 1)[-1]
        self.ws_url = self.url.replace("http://", "ws://") + "/ws"
        # drain the server's output (a full pipe would block it); stop() reads what it kept
        self.output: list[str] = []
        self._drain = threading.Thread(target=lambda: self.output.extend(self.proc.stdout or ()), daemon=True)
        self._drain.start()
        for _ in range(100):
            try:
                if requests.get(f"{self.url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)

    def get(self, path: str) -> dict:
        response = requests.get(self.url + path, timeout=30)
        assert response.ok, response.text
        return response.json()

    def post(self, path: str, **body) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=120)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop the server; returns what it printed after its start line."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        self._drain.join(timeout=10)
        rest = "".join(self.output)
        if sig == signal.SIGTERM:  # uvicorn re-raises the signal after a graceful shutdown
            assert rc in (0, -signal.SIGTERM), rest
            assert "wmrl-serve: stopped (0 sessions left" in rest, rest
        return rest


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:  # nothing left running
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=10)
