"""How ``kglightning serve`` stops on SIGTERM (docker stop, kill, a test's terminate) and after a failed start.

Python runs a signal handler in the main thread between two bytecodes, and an exception it raises is lost where the
interpreter ignores exceptions: a callback run around ``fork`` (``logging`` registers one, and LitServe forks its
API servers while it starts), a ``__del__``, a weakref callback. A SIGTERM landing there used to be printed as
"Exception ignored" and the server went on serving. :class:`SigtermStop` therefore raises again, once a second,
until the stop is under way, and keeps quiet about an interrupt of its own that Python dropped. It also waits while
the main thread starts a process: raised between the child's start and its registration (``multiprocessing``'s
``BaseProcess.start``), the interrupt would leave a child no one stops (a spawned worker then died on a half-sent
start with a traceback, or lived on).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = ["SigtermInterrupt", "SigtermStop", "stop_workers"]

# functions that stop the server: a SIGTERM arriving while one of them runs is not raised again
_STOPPING = frozenset({"_perform_graceful_shutdown", "stop_workers"})
_PROCESS_FILE = multiprocessing.process.__file__  # BaseProcess.start: the child runs, not yet in active_children()


class SigtermInterrupt(KeyboardInterrupt):
    """The interrupt :class:`SigtermStop` raises (LitServe stops on it as on Ctrl-C)."""


class SigtermStop:
    """The SIGTERM handler of the serving process ``main_pid``.

    The first SIGTERM refuses new requests (``closing``, which the forked API servers see, answer 503), waits for the
    requests in flight (at most ``timeout`` and 5 s), then raises ``KeyboardInterrupt`` so that LitServe stops as on
    Ctrl-C (or, while the workers load, ``kglightning serve`` stops them). Until :meth:`done` is called, or while a
    stopping function runs, the interrupt is raised again every ``retry`` seconds, in case it was raised where Python
    drops exceptions. Forked processes inherit the handler and ignore the signal: LitServe's queue manager then
    outlives a SIGTERM sent to the whole process group, and an API server, whose uvicorn passes the signal on once it
    has shut down, ends quietly. (The inference workers are spawned, and SIGTERM ends them.)
    """

    def __init__(self, server: Any, closing: Any, timeout: float, main_pid: int, retry: float = 1.0) -> None:
        self.server, self.closing, self.timeout, self.main_pid, self.retry = server, closing, timeout, main_pid, retry
        self.signalled = threading.Event()  # a SIGTERM came
        self.stopped = threading.Event()  # the stop is under way or over: no more interrupts
        self.dropped = 0  # interrupts Python dropped (each raised again)

    def install(self) -> None:
        """Handle SIGTERM with this object, and count, rather than print as "Exception ignored" with a traceback, an
        interrupt of its own that Python dropped (``sys.unraisablehook``; other exceptions are printed as before)."""
        previous = sys.unraisablehook

        def unraisable(info: Any) -> None:
            if isinstance(info.exc_value, SigtermInterrupt):
                self.dropped += 1
            else:
                previous(info)

        sys.unraisablehook = unraisable
        signal.signal(signal.SIGTERM, self)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.main_pid or self.stopped.is_set() or _stopping(frame):
            return
        if not self.signalled.is_set():
            self.signalled.set()
            try:
                self._drain()
            finally:  # also when a second SIGTERM cut the wait short
                threading.Thread(target=self._again, args=(signum,), name="serve-sigterm", daemon=True).start()
        if _starting_a_process(frame):
            return  # raised again by the retry once the child is registered (and stop_workers can end it)
        raise SigtermInterrupt(f"signal {signum}")

    def done(self) -> None:
        """The server has stopped, or its stop is under way outside the functions this module knows."""
        self.stopped.set()

    def _drain(self) -> None:
        self.closing.set()
        deadline = time.monotonic() + self.timeout + 5.0
        busy = self.server.active_requests or 0
        if busy:
            print(f"SIGTERM: answering the {busy} request(s) in flight, refusing new ones (503)", file=sys.stderr)
        while (self.server.active_requests or 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.02)

    def _again(self, signum: int) -> None:
        main = threading.main_thread().ident
        while not self.stopped.wait(self.retry):
            signal.pthread_kill(main, signum)  # runs __call__ in the main thread, which raises again


def _stopping(frame: FrameType | None) -> bool:
    return _in_frames(frame, lambda code: code.co_name in _STOPPING)


def _starting_a_process(frame: FrameType | None) -> bool:
    return _in_frames(frame, lambda code: code.co_name == "start" and code.co_filename == _PROCESS_FILE)


def _in_frames(frame: FrameType | None, match: Callable[[CodeType], bool]) -> bool:
    while frame is not None:
        if match(frame.f_code):
            return True
        frame = frame.f_back
    return False


def stop_workers(server: Any) -> None:
    """End what LitServe started when ``run`` stopped before serving (a SIGTERM while the workers load, a worker
    that failed): its inference workers, then its queue manager, before they are left to find each other gone (a
    worker whose manager is gone prints a traceback of its own). A manager interrupted while it started never
    registered its own shutdown and ignores SIGTERM (see :class:`SigtermStop`): it is killed."""
    # LitServe lists a launch's workers once all of them have started: a stop in between leaves some unlisted
    workers = list(getattr(server, "inference_workers", None) or [])
    workers += [c for c in multiprocessing.active_children() if c.name == "inference-worker" and c not in workers]
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(5)
    manager = getattr(getattr(server, "transport_config", None), "manager", None)
    shutdown = getattr(manager, "shutdown", None)  # set once the manager has started
    if callable(shutdown):
        shutdown()
    for child in multiprocessing.active_children():
        child.join(1)
        if child.is_alive():
            child.kill()
            child.join(1)
