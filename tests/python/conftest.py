"""Fixtures that start the real fusedserve binary on CPU and connect the Python client.

FUSEDSERVE_BIN names the binary (ctest sets it to the built target). The
server listens on free loopback ports, keeps its tuning cache in a temporary
directory, and its log is printed when it fails to come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import List, Optional

import pytest

SOURCE_DIR = Path(os.environ.get("FUSEDSERVE_SOURCE_DIR", Path(__file__).resolve().parents[2]))

try:
    import fusedserve_client  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:
    # Run by hand from a checkout: use the package beside the sources (its
    # stubs generated with clients/python/generate_stubs.sh).
    sys.path.insert(0, str(SOURCE_DIR / "clients" / "python"))

from fusedserve_client import FusedServeClient  # noqa: E402

START_TIMEOUT_S = float(os.environ.get("FUSEDSERVE_TEST_START_TIMEOUT", "120"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One fusedserve process on loopback ports."""

    def __init__(self, binary: str, workdir: Path, extra_flags: Optional[List[str]] = None):
        self.binary = binary
        self.workdir = workdir
        self.extra_flags = extra_flags or []
        self.proc: Optional[subprocess.Popen] = None
        self.port = self.metrics_port = 0
        self.log_path = workdir / "server.log"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, attempts: int = 3) -> "ServerProcess":
        # A free port can be taken by someone else between our probe and the
        # server's bind; try again with new ports when the process dies early.
        for attempt in range(attempts):
            self.port, self.metrics_port = free_port(), free_port()
            cmd = [self.binary, "serve",
                   f"--listen=127.0.0.1:{self.port}",
                   f"--metrics_listen=127.0.0.1:{self.metrics_port}",
                   "--device=cpu",
                   f"--tuning_cache={self.workdir / 'tuning_cache.json'}",
                   *self.extra_flags]
            self.log = open(self.log_path, "ab")
            self.log.write(f"\n$ {' '.join(cmd)}\n".encode())
            self.log.flush()
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir)
            try:
                self._wait_serving()
                return self
            except RuntimeError:
                if self.proc.poll() is None or attempt == attempts - 1:
                    self.stop()
                    raise
        raise AssertionError("unreachable")

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with FusedServeClient(self.target) as c:
            last = "no answer"
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"fusedserve exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
                try:
                    last = c.health(timeout=1.0)
                    if last == "SERVING":
                        return
                except Exception as e:  # not listening yet
                    last = str(e)
                time.sleep(0.1)
        raise RuntimeError(f"fusedserve not SERVING after {START_TIMEOUT_S:.0f} s (last: {last}):\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            assert r.status == 200, r.status
            return r.read().decode("utf-8")

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None) is not None and not self.log.closed:
            self.log.close()


@pytest.fixture(scope="session")
def server_bin() -> str:
    path = os.environ.get("FUSEDSERVE_BIN")
    if not path:
        pytest.skip("FUSEDSERVE_BIN is not set (ctest sets it; by hand: FUSEDSERVE_BIN=build-cpu/fusedserve)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"FUSEDSERVE_BIN={path} is not an executable file")
    return path


@pytest.fixture(scope="session")
def server(server_bin, tmp_path_factory) -> ServerProcess:
    proc = ServerProcess(server_bin, tmp_path_factory.mktemp("fusedserve")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def client(server) -> FusedServeClient:
    with FusedServeClient(server.target, timeout=60.0) as c:
        yield c
