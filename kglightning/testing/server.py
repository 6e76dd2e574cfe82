"""``kglightning serve`` in a subprocess, for the tests, CI's smoke check and the load benchmark: started on a free
port, waited on until ``/health`` answers, stopped with SIGTERM (as ``docker stop`` does) and its worker processes
waited for. Imports ``httpx`` (the test extra) and ``psutil`` (installed with peft and torch-geometric) when used.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["ServerProcess", "free_port"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A running ``python -m kglightning serve ARGS --port PORT``.

    Args:
        args: the options after ``serve`` (``--port`` is added).
        cwd: its working folder.
        log: the file its stdout and stderr go to (quoted when it fails to start).
        env: its environment (default: this process's).
        timeout: seconds to wait for ``/health`` before giving up.

    Raises:
        RuntimeError: the server exited, or did not answer in time, with the end of its log.
    """

    def __init__(
        self, args: list[str], cwd: str | os.PathLike, log: Path, env: dict[str, str] | None = None,
        timeout: float = 300.0,
    ) -> None:  # fmt: skip
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log)
        self._log = self.log.open("w")
        cmd = [sys.executable, "-m", "kglightning", "serve", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._log, stderr=self._log)
        start = time.monotonic()
        while True:
            if self.proc.poll() is not None or time.monotonic() - start > timeout:
                self.stop()
                raise RuntimeError(f"the server did not start:\n{self.log.read_text()[-6000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.ready_seconds = round(time.monotonic() - start, 1)

    def _tree(self) -> list[Any]:
        import psutil

        if self.proc.poll() is not None:
            return []
        main = psutil.Process(self.proc.pid)
        return [main, *main.children(recursive=True)]

    def rss_mb(self) -> float:
        """The resident memory of the server and its workers, in MiB."""
        return round(sum(p.memory_info().rss for p in self._tree()) / 2**20, 1)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user and system) used so far by the server's processes: ``workers``, the spawned processes
        that score requests, and ``http``, the others (its HTTP servers, LitServe's queue manager, the main
        process). Take two readings around a load and subtract."""
        import psutil

        seen = {"workers": 0.0, "http": 0.0}
        for p in self._tree():
            try:
                t = p.cpu_times()
                spawned = "spawn_main" in " ".join(p.cmdline())  # how multiprocessing's spawn starts a process
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # it ended between the listing and the reading
                continue
            seen["workers" if spawned else "http"] += t.user + t.system
        return seen

    def stop(self) -> list[Any]:
        """SIGTERM, then wait for the server and its workers; returns the processes still running after that
        (killed), which a graceful shutdown leaves none of."""
        import psutil

        workers = self._tree()[1:]
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        _, alive = psutil.wait_procs(workers, timeout=30)
        for p in alive:
            p.kill()
        self._log.close()
        return alive

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
