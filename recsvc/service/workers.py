"""`recsvc serve`: one server in this process, or ``--workers N`` forked processes sharing the port
(``SO_REUSEPORT``) and the ledger, supervised by this one: it forwards SIGTERM, replaces a worker
that dies, and stops on a crash loop.

This module stays light at import time (stdlib + grpc): the parent forks its workers before any
gRPC server, thread pool, polars pool or SQLite connection exists, and each worker then builds its
own server (:func:`recsvc.service.server.serve_one`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from recsvc.ledger import is_postgres
from recsvc.service.aioserver import check_port_free
from recsvc.service.config import ServerConfig, host_port
from recsvc.service.server import ready_file, serve_one
from recsvc.service.shutdown import StopSignal, drain_limit, exit_with_parent

log = logging.getLogger("recsvc.service")

KILL_AFTER_S = 5.0  # the parent's SIGKILL comes this long after a worker's own drain watchdog was due


def serve(config: ServerConfig) -> int:
    """The `recsvc serve` entry point: blocks until SIGTERM/SIGINT, then drains; exit code."""
    config.check()
    if config.listen.workers == 1:
        return serve_one(config)
    return _serve_workers(config)


def _serve_workers(config: ServerConfig) -> int:
    """Forks ``workers`` processes that share the port via SO_REUSEPORT and the SQLite ledger.

    The parent holds no gRPC state; it serves the aggregated metrics (Prometheus multiprocess
    mode), forwards SIGTERM to the workers and exits 0 when they all drained cleanly.
    """
    metrics_dir = None
    if config.listen.metrics_port is not None:
        if "prometheus_client" in sys.modules:
            raise RuntimeError(
                "multi-worker metrics need PROMETHEUS_MULTIPROC_DIR set before prometheus_client is imported"
            )
        metrics_dir = tempfile.mkdtemp(prefix="recsvc-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return _fork_workers(config)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _fork_workers(config: ServerConfig) -> int:
    # Checks that need no gRPC/polars state run here, before any fork and before the ledger
    # exists; the rest (artifact, mechanism policy) runs in the workers, which report failures.
    from recsvc.ledger import sqlite as ledger_mod
    from recsvc.service import auth

    auth.check_server_files(config.auth.tls_cert, config.auth.tls_key, config.auth.client_ca)
    auth.Authenticator.of(config.auth)
    check_port_free(config.listen.host, config.listen.port)
    if config.listen.metrics_port:
        check_port_free(config.listen.metrics_host, config.listen.metrics_port)
    pg = is_postgres(config.ledger.location)
    if not pg:
        ledger_mod.check_path(config.ledger.location)
    created = not pg and not Path(config.ledger.location).exists()
    # Create (or migrate) the file in WAL mode and the fingerprint key once, before the workers
    # race: every worker must key its fingerprints with the same secret. (PostgreSQL: check that
    # the database is reachable and agrees on the settings, before forking.)
    ledger = config.ledger.open(pool_size=1)
    ledger.close()
    served: list[bool] = []
    try:
        return _run_workers(config, served)
    except BaseException:
        if created and not served:  # no worker ever listened: remove what this start created
            ledger_mod.remove_files(config.ledger.location)
            if ledger.key_created:
                config.ledger.key_path.unlink(missing_ok=True)
        raise


def _fork_worker(config: ServerConfig, parent: int, ready_w: int, err_w: int | None, closing: list[int]) -> int:
    """Forks one worker serving ``config``; it writes a byte to ``ready_w`` once it listens, and a
    bad configuration's one line to ``err_w`` (None: to the log). ``closing``: the parent's pipe
    ends the child must not hold."""
    pid = os.fork()
    if pid == 0:  # child: never returns into the parent's code
        exit_with_parent(parent)  # SIGTERM: the worker drains
        for fd in closing:
            os.close(fd)
        code = 1
        try:
            code = serve_one(config, ready_w)
        except ValueError as exc:  # bad configuration: one clear line for the parent to raise
            if err_w is None:
                log.error("worker failed to start: %s", exc)
            else:
                os.write(err_w, (str(exc).replace("\n", " ")[:3000] + "\n").encode())
        except BaseException:
            log.exception("worker failed")
        finally:
            os._exit(code)
    return pid


def _run_workers(config: ServerConfig, served: list[bool]) -> int:
    """Forks the workers and supervises them; appends to ``served`` once they all listen."""
    worker_config = config.replace(workers=1, reuse_port=True, metrics_port=None)
    read_fd, write_fd = os.pipe()
    err_read, err_write = os.pipe()
    parent = os.getpid()
    pids = [
        _fork_worker(worker_config, parent, write_fd, err_write, [read_fd, err_read])
        for _ in range(config.listen.workers)
    ]
    os.close(write_fd)
    os.close(err_write)
    stop = StopSignal.install()
    ready = 0
    while ready < config.listen.workers:  # EOF before N bytes: a worker died while starting
        chunk = os.read(read_fd, config.listen.workers)
        if not chunk:
            break
        ready += len(chunk)
    os.close(read_fd)
    if ready < config.listen.workers:
        _terminate(pids)
        for pid in pids:
            os.waitpid(pid, 0)
        errors = os.read(err_read, 65536).decode(errors="replace").splitlines()
        os.close(err_read)
        if errors:
            raise ValueError(errors[0])
        raise RuntimeError(f"only {ready} of {config.listen.workers} workers started; see the log above")
    os.close(err_read)
    served.append(True)
    print(
        f"recsvc serve: listening on {host_port(config.listen.host, config.listen.port)} "
        f"({config.listen.workers} workers)",
        flush=True,
    )
    if config.listen.metrics_port is not None:
        from recsvc.service.metrics import serve_metrics_http

        try:
            mport = serve_metrics_http(config.listen.metrics_port, config.listen.metrics_host).server_port
        except ValueError:
            _terminate(pids)
            raise
        print(f"recsvc serve: metrics on http://{host_port(config.listen.metrics_host, mport)}/metrics", flush=True)
    with ready_file(config.listen.ready_file, config.listen.host, config.listen.port):
        return _supervise(config, pids, stop, _Replacements(worker_config, parent))


# A worker that crashes is replaced; more than RESTARTS replacements within RESTART_WINDOW_S
# (a crash loop: the cause is not one call) stop the server instead.
RESTARTS, RESTART_WINDOW_S = 5, 60.0


class _Replacements:
    """Forks workers in place of crashed ones. The others serve meanwhile, so nobody waits for a
    replacement to listen; its readiness pipe stays open (a write to a closed one fails) until
    the worker is reaped."""

    def __init__(self, config: ServerConfig, parent: int) -> None:
        self.config, self.parent = config, parent
        self._ready: dict[int, int] = {}

    def fork(self) -> int:
        ready_r, ready_w = os.pipe()
        pid = _fork_worker(self.config, self.parent, ready_w, None, [ready_r, *self._ready.values()])
        os.close(ready_w)
        self._ready[pid] = ready_r
        return pid

    def reaped(self, pid: int) -> None:
        fd = self._ready.pop(pid, None)
        if fd is not None:
            os.close(fd)


def _supervise(config: ServerConfig, pids: list[int], stop: StopSignal, replacements: _Replacements) -> int:
    """Reaps the workers and replaces one that crashed; on SIGTERM/SIGINT, or a crash loop, stops
    the others. A worker still alive ``KILL_AFTER_S`` after its own watchdog should have ended it
    gets SIGKILL. 0 when every worker alive at the stop exited 0."""
    alive, restarts = set(pids), deque[float]()
    forwarded = 0  # stop signals already passed on
    kill_at: float | None = None
    clean, stopping = True, False
    while alive:
        if stop.count > forwarded:
            forwarded, stopping = stop.count, True
            kill_at = _stop_workers(config, sorted(alive), kill_at)
        if kill_at is not None and time.monotonic() > kill_at:
            log.error("workers %s did not exit after SIGTERM; killing them", sorted(alive))
            _terminate(sorted(alive), signal.SIGKILL)
            kill_at = float("inf")
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.1)
            continue
        if pid not in alive:  # not a worker
            continue
        alive.discard(pid)
        replacements.reaped(pid)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            continue
        if stopping:
            clean = False
            continue
        now = time.monotonic()
        while restarts and now - restarts[0] > RESTART_WINDOW_S:
            restarts.popleft()
        if len(restarts) >= RESTARTS:
            log.error(
                "worker %d exited with %d: %d crashes within %g s; stopping the others",
                pid,
                code,
                RESTARTS + 1,
                RESTART_WINDOW_S,
            )
            clean, stopping = False, True
            kill_at = _stop_workers(config, sorted(alive), kill_at)
            continue
        restarts.append(now)
        new = replacements.fork()
        alive.add(new)
        log.error("worker %d exited with %d; worker %d replaces it", pid, code, new)
    return 0 if clean else 1


def _stop_workers(config: ServerConfig, pids: list[int], kill_at: float | None) -> float:
    """SIGTERM to ``pids``; returns when to SIGKILL them (the earliest deadline already set stays)."""
    _terminate(pids)
    deadline = time.monotonic() + drain_limit(config.drain.grace, config.drain.delay) + KILL_AFTER_S
    return deadline if kill_at is None else min(kill_at, deadline)


def _terminate(pids: list[int], sig: int = signal.SIGTERM) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
