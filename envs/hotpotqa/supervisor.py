"""Several retriever server workers over one socket, forked from one loaded index.

`Supervisor` binds the listening socket and forks ``workers`` processes from the process
that loaded (and warmed) the `Retriever`, so every worker shares the index pages (mapped
read-only when the index came from a directory: ``load_retriever(dir, mmap=True)``) and
the compiled numba kernels, and none pays the load or the compile again. Each worker runs
the uvicorn server of `trace_gym.envs.hotpotqa.server` (micro-batching its own requests)
on the shared socket, where the kernel hands each new connection to one worker, and on a
private loopback port that the supervisor health-checks.

The supervisor starts the workers and waits until each reports ready; every
``health_interval_s`` it reaps workers that exited and asks each live one for ``GET
/health`` on its private port; a worker that exited, or failed ``health_failures`` checks
in a row, is killed and forked again. `stop()` (or SIGTERM / SIGINT to `serve_forever`)
sends SIGTERM, waits ``stop_grace_s`` for uvicorn's graceful shutdown, then SIGKILLs.

No worker outlives the supervisor, however it ends: each worker watches the read end of a
lifeline pipe whose only write end is the supervisor's, and exits when it reads EOF (the
kernel closes that end when the supervisor dies, SIGKILL included); on Linux each worker
also asks for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.client
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Retriever
from trace_gym.envs.hotpotqa.server import ServerLimits, uvicorn_config

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["Supervisor", "SupervisorOptions", "WorkerFailed"]

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


class WorkerFailed(TraceGymError, RuntimeError):
    """A worker did not come up (it exited or stayed silent past ``start_timeout_s``)."""


@dataclass(frozen=True)
class SupervisorOptions:
    """How many workers, and how the supervisor watches them."""

    #: worker processes serving the socket
    workers: int = 1
    #: seconds between health checks of each worker
    health_interval_s: float = 2.0
    #: seconds a worker's /health may take before the check counts as failed
    health_timeout_s: float = 5.0
    #: failed checks in a row before a worker is killed and forked again
    health_failures: int = 3
    #: seconds a new worker has to report ready
    start_timeout_s: float = 60.0
    #: seconds between SIGTERM and SIGKILL when stopping
    stop_grace_s: float = 10.0

    def __post_init__(self):
        for name in ("workers", "health_failures"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("health_interval_s", "health_timeout_s", "start_timeout_s", "stop_grace_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass
class _Worker:
    slot: int
    pid: int
    status_fd: int  # read end; the worker writes its private port there once it serves
    started: float
    port: int = 0
    failures: int = 0


class Supervisor:
    """Forks, health-checks and stops the workers serving `retriever` on one socket."""

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 8000,
        limits: ServerLimits | None = None,
        options: SupervisorOptions | None = None,
    ):
        limits = limits or ServerLimits()
        options = options or SupervisorOptions()
        if not retriever.forkable:
            raise ConfigError(
                f"the {retriever.kind} retriever cannot be shared by forked workers; "
                "serve it in one process (serving it through the supervisor is not supported)"
            )
        self.retriever = retriever
        self.limits = limits
        self.options = options
        self.sockets = _listening_sockets(host, port, options.workers)
        #: the first of the listening sockets (the port they share)
        self.socket = self.sockets[0]
        self.workers: dict[int, _Worker] = {}
        #: workers forked again after they exited or failed their health checks
        self.restarts = 0
        self._pid = os.getpid()
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._stopping = False

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Fork every worker and wait until all serve (`WorkerFailed` if one does not)."""
        for slot in range(self.options.workers):
            self._fork(slot)
        for w in list(self.workers.values()):
            self._wait_ready(w)

    def serve_forever(self) -> None:
        """Start the workers if needed, then watch them until SIGTERM, SIGINT or `stop()`."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        try:
            if not self.workers:
                self.start()
            while not self._stopping:
                self.check()
                deadline = time.monotonic() + self.options.health_interval_s
                while not self._stopping and time.monotonic() < deadline:
                    time.sleep(0.05)
                    self._reap()
        finally:
            self.stop()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def check(self) -> None:
        """One watch pass: fork again the workers that exited or fail their health checks."""
        self._reap()
        for w in list(self.workers.values()):
            if self._healthy(w):
                w.failures = 0
                continue
            w.failures += 1
            if w.failures >= self.options.health_failures:
                log.warning(
                    "worker %d (pid %d) failed %d health checks; restarting it",
                    w.slot,
                    w.pid,
                    w.failures,
                )
                self._kill(w)
                self._restart(w.slot)

    def stop(self) -> None:
        """SIGTERM every worker, SIGKILL those still alive after ``stop_grace_s``; close the socket."""
        self._stopping = True
        for w in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.options.stop_grace_s
        while self.workers and time.monotonic() < deadline:
            self._reap(restart=False)
            time.sleep(0.02)
        for w in list(self.workers.values()):
            self._kill(w)
        if self._lifeline_w >= 0:
            os.close(self._lifeline_w)  # any worker still unreaped exits on EOF
            self._lifeline_w = -1
        for sock in self.sockets:
            sock.close()

    def status(self) -> dict[str, Any]:
        """The workers (slot -> pid, private port, failed checks) and the restart count."""
        return {
            "workers": {
                w.slot: {"pid": w.pid, "port": w.port, "failures": w.failures}
                for w in self.workers.values()
            },
            "restarts": self.restarts,
        }

    # ------------------------------------------------------------------ workers
    def _fork(self, slot: int) -> _Worker:
        if self._stopping:
            raise WorkerFailed("the supervisor is stopping")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker; never returns
            code = 1
            try:
                os.close(r)
                self._become_worker(slot, w)
                code = 0
            except BaseException:  # noqa: B036  (a worker reports and exits; it never unwinds into the parent's code)
                log.exception("retriever worker %d failed", slot)
            finally:
                os._exit(code)
        os.close(w)
        worker = _Worker(slot, pid, r, time.monotonic())
        self.workers[slot] = worker
        return worker

    def _become_worker(self, slot: int, status_fd: int) -> None:
        _die_with_parent(self._pid, self._lifeline_r, self._lifeline_w)
        for other in self.workers.values():
            with contextlib.suppress(OSError):
                os.close(other.status_fd)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # uvicorn installs its own while serving
        for sock in self.sockets:
            if sock is not self.sockets[slot]:
                sock.close()
        self.retriever.after_fork()
        _serve_worker(self.retriever, self.sockets[slot], self.limits, slot, status_fd)

    def _wait_ready(self, w: _Worker) -> None:
        buf = b""
        deadline = w.started + self.options.start_timeout_s
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([w.status_fd], [], [], max(left, 0))
            chunk = os.read(w.status_fd, 64) if ready else b""
            if not chunk:
                self._kill(w)
                why = (
                    "exited" if ready else f"was not ready within {self.options.start_timeout_s} s"
                )
                raise WorkerFailed(f"retriever worker {w.slot} {why}; see its log above")
            buf += chunk
        w.port = int(buf.split(b"\n")[0])

    def _healthy(self, w: _Worker) -> bool:
        conn = http.client.HTTPConnection(
            "127.0.0.1", w.port, timeout=self.options.health_timeout_s
        )
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            return resp.status == 200 and json.loads(resp.read()).get("pid") == w.pid
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _reap(self, *, restart: bool = True) -> None:
        for w in list(self.workers.values()):
            try:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = w.pid, 0
            if pid == 0:
                continue
            self._forget(w)
            if restart and not self._stopping:
                log.warning(
                    "worker %d (pid %d) exited (status %d); restarting it", w.slot, pid, status
                )
                self._restart(w.slot)

    def _restart(self, slot: int) -> None:
        self.restarts += 1
        self._wait_ready(self._fork(slot))

    def _kill(self, w: _Worker) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(w.pid, 0)
        self._forget(w)

    def _forget(self, w: _Worker) -> None:
        if self.workers.get(w.slot) is w:
            del self.workers[w.slot]
        with contextlib.suppress(OSError):
            os.close(w.status_fd)


def _listening_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """One listening socket per worker slot on one port (SO_REUSEPORT), where Linux spreads
    new connections evenly over them; elsewhere one socket that every worker accepts on.

    The supervisor keeps them all open: while a worker restarts, the connections the kernel
    gives its socket wait in that socket's backlog instead of being refused.
    """
    if n == 1 or not sys.platform.startswith("linux"):
        return [socket.create_server((host, port), backlog=2048)] * n
    first = socket.create_server((host, port), backlog=2048, reuse_port=True)
    port = first.getsockname()[1]
    return [first] + [
        socket.create_server((host, port), backlog=2048, reuse_port=True) for _ in range(n - 1)
    ]


def _die_with_parent(parent: int, lifeline_r: int, lifeline_w: int) -> None:
    """Make this forked worker exit when `parent` dies, by any signal."""
    os.close(lifeline_w)  # the supervisor's end must be the only one
    # TRACE_GYM_NO_PDEATHSIG=1 leaves the lifeline alone on guard (the tests show it suffices)
    if sys.platform.startswith("linux") and os.environ.get("TRACE_GYM_NO_PDEATHSIG") != "1":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            try:
                if not os.read(lifeline_r, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _serve_worker(
    retriever: Retriever, shared: socket.socket, limits: ServerLimits, slot: int, status_fd: int
) -> None:
    """Serve on `shared` and on a private loopback port; write that port to `status_fd` once up."""
    import uvicorn

    private = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(retriever, limits, worker=slot))

    async def run() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[shared, private]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            os.write(status_fd, f"{private.getsockname()[1]}\n".encode())
        await task

    try:
        from uvloop import run as run_loop
    except ImportError:
        run_loop = asyncio.run
    run_loop(run())
