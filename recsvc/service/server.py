"""Starting, draining and multi-process serving of the PrivateSelection gRPC server.

This module stays light at import time (stdlib + grpc): with ``--workers N`` the parent forks
its workers before any gRPC server, thread pool, polars pool or SQLite connection exists, and
each worker then builds its own server on the same port with ``SO_REUSEPORT``.

In-process API (used by the demo and tests)::

    handle = start(ServerConfig.of("artifacts/ml-100k", port=0))
    ... Client(f"127.0.0.1:{handle.port}") ...
    handle.stop(grace=5)
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsvc.ledger import Ledger, LedgerObserver, is_postgres, open_ledger
from recsvc.service.aioserver import EventLoop, Health, bind, build, check_port_free
from recsvc.service.auth import SERVICE_NAME, Authenticator
from recsvc.service.config import ServerConfig, host_port
from recsvc.service.shutdown import DrainWatchdog, StopSignal, drain_limit, exit_with_parent

log = logging.getLogger("recsvc.service")
PROBE_INTERVAL_S = 1.0  # how often a replica checks that its PostgreSQL ledger answers (health)
KILL_AFTER_S = 5.0  # the parent's SIGKILL comes this long after a worker's own drain watchdog was due


@dataclass
class ServerHandle:
    """A running in-process server. ``stop`` drains it (health NOT_SERVING, then grace)."""

    server: Any  # grpc.aio.Server, driven through ``loop``
    port: int
    health: Health
    ledger: Any
    servicer: Any
    metrics_port: int | None = None
    metrics_server: Any = None
    loop: EventLoop | None = None
    pools: tuple[Any, ...] = ()  # the request threads and the heavy queue, shut down after the server
    _stopped: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None

    def stop(self, grace: float | None = 5.0, drain_delay: float = 0.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._watcher is not None:
            self._watcher.join()
        assert self.loop is not None
        self.health.enter_graceful_shutdown()  # every service → NOT_SERVING
        if drain_delay > 0:
            time.sleep(drain_delay)  # let load balancers see NOT_SERVING before the port closes
        self.loop.call(self.server.stop(grace))  # refuses new calls; in-flight calls get `grace` seconds
        for pool in self.pools:  # work a cancelled call left running ends before the ledger closes
            pool.shutdown()
        self.servicer.selector.heavy.shutdown()
        self.loop.close()
        self.ledger.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()

    def wait(self) -> None:
        while not self._stopped.wait(1.0):
            pass


def start(config: ServerConfig) -> ServerHandle:
    """Builds and starts one server in this process (no signal handling).

    Every check that can fail on bad configuration (artifact, mechanism policy, TLS files, ledger
    path, gRPC port, metrics port) runs before the ledger is opened; a ledger file this call
    created is removed again if the start fails, so a failed start changes nothing.
    """
    config.check()
    from grpc_health.v1 import health_pb2

    from recsvc.artifact import load_artifact
    from recsvc.ledger import fingerprint
    from recsvc.ledger import sqlite as ledger_mod
    from recsvc.service import auth
    from recsvc.service.selection import warm_kernels
    from recsvc.service.servicer import SelectionServicer

    artifact = load_artifact(config.artifacts)
    creds = auth.server_credentials(config.auth.tls_cert, config.auth.tls_key, config.auth.client_ca)
    authenticator = _authenticator(config)
    pg = is_postgres(config.ledger.location)
    if not pg:  # a PostgreSQL ledger is checked by connecting to it, below
        ledger_mod.check_path(config.ledger.location)
        fingerprint.check(config.ledger.key_path)
    servicer = SelectionServicer(artifact, None, config.policy)  # the ledger is attached once every check passed
    loop = EventLoop()
    try:
        server, health_servicer, pools = loop.call(build(config, servicer, authenticator))
        port = loop.call(bind(server, config, creds))
    except BaseException:
        loop.close()
        raise
    health_status = Health(loop, health_servicer)
    metrics_server = None
    ledger = None
    created = not pg and not Path(config.ledger.location).exists()
    try:
        if config.listen.metrics_port is not None:
            from recsvc.service import metrics

            metrics_server = metrics.serve_metrics_http(config.listen.metrics_port, config.listen.metrics_host)
        settings = config.ledger
        ledger = open_ledger(
            settings.location,
            settings.budget,
            settings.key_path,
            pool_size=settings.pool,
            waits=settings.waits,
            window=settings.window,
            observer=ledger_observer(),
            mechanism_of=stored_mechanism,
        )
        servicer.ledger = ledger
        loop.call(server.start())
        for name in ("", SERVICE_NAME):
            health_status.set(name, health_pb2.HealthCheckResponse.SERVING)
    except BaseException:
        loop.call(server.stop(None))
        for pool in pools:
            pool.shutdown()
        loop.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        if ledger is not None:
            ledger.close()
        if created:  # nothing was served from it: remove what this start created
            ledger_mod.remove_files(config.ledger.location)
            if ledger is not None and ledger.key_created:
                config.ledger.key_path.unlink(missing_ok=True)
        raise
    metrics_port = None if metrics_server is None else int(metrics_server.server_port)
    if config.selection.allow_non_private:
        log.warning(
            "--allow-non-private: this server accepts rnmh, which is NOT differentially private; "
            "every rnmh answer is labelled mechanism=rnmh. Use it for reference experiments only"
        )
    log.info(
        "serving %s on %s (%s, %s, default mechanism %s, auto → %s, budget ε=%g per user %s, ledger %s, "
        "fingerprint key %s)",
        SERVICE_NAME,
        host_port(config.listen.host, port),
        "TLS" if creds else "plaintext",
        authenticator.describe(),
        servicer.default_mechanism,
        servicer.selector.auto_description,
        config.ledger.budget,
        config.ledger.window.per,
        getattr(ledger, "where", config.ledger.location),
        config.ledger.key_path,
    )
    handle = ServerHandle(
        server, port, health_status, ledger, servicer, metrics_port, metrics_server, loop=loop, pools=pools
    )
    # Once it listens, not before: the first call is right without the kernels, only slower.
    threading.Thread(target=warm_kernels, name="recsvc-warm-kernels", daemon=True).start()
    # Every store: health also reports a stuck charge pipeline (Ledger.stalled), SQLite's too.
    handle._watcher = threading.Thread(target=_watch_ledger, args=(handle,), name="recsvc-ledger-probe", daemon=True)
    handle._watcher.start()
    return handle


def ledger_observer() -> LedgerObserver:
    """The ledger's callbacks, wired to this process's Prometheus metrics."""
    from recsvc.service import metrics

    return LedgerObserver(relocked=metrics.RELOCKED.inc)


def stored_mechanism(response: bytes) -> str:
    """The mechanism a stored answer (a serialized SelectResponse) names; '' if it is not one.
    The ledger's migrations recover the mechanism of charges stored without it with this."""
    from google.protobuf.message import DecodeError

    from recsvc.v1 import selection_pb2

    try:
        return selection_pb2.SelectResponse.FromString(response).mechanism
    except (DecodeError, UnicodeDecodeError):
        return ""


def ledger_healthy(ledger: Ledger) -> bool:
    """Whether the ledger can charge now: its database answers and no commit is stuck
    (:meth:`recsvc.ledger.Ledger.stalled`)."""
    return ledger.reachable() and not ledger.stalled()


def _watch_ledger(handle: ServerHandle) -> None:
    """Health follows the ledger: NOT_SERVING while its database does not answer or its charge
    pipeline is stuck (a load balancer then sends requests to a replica that can charge them),
    SERVING again once it can charge."""
    from grpc_health.v1 import health_pb2

    serving = True
    while not handle._stopped.wait(PROBE_INTERVAL_S):
        ok = ledger_healthy(handle.ledger)
        if ok != serving and not handle._stopped.is_set():
            status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", SERVICE_NAME):
                handle.health.set(name, status)
            log.warning(
                "ledger %s %s: health %s",
                getattr(handle.ledger, "where", "?"),
                "can charge again" if ok else "does not answer or its charges are stuck",
                "SERVING" if ok else "NOT_SERVING",
            )
            serving = ok


def _authenticator(config: ServerConfig) -> Authenticator:
    """The principals from the token file and the client-scopes file (parsed: a bad line is one
    clear error; a file open to other users is warned about)."""
    return Authenticator.from_files(
        config.auth.token_file, config.auth.client_scopes, mtls=config.auth.client_ca is not None
    )


def _serve_one(config: ServerConfig, ready_fd: int | None = None) -> int:
    """One worker: start, report readiness, wait for SIGTERM/SIGINT, drain, return 0.

    A drain that has not finished ``drain_limit`` seconds after the signal ends the process (exit
    1, thread stacks on stderr): a worker that never exits would keep serving its SO_REUSEPORT port.
    """
    stop = StopSignal.install()
    handle = start(config)
    # What startup loaded (modules, the catalog, gRPC) lives as long as the process: out of the
    # collector's generations, so its periodic full collections do not walk it on every request path.
    gc.freeze()
    watchdog = DrainWatchdog(stop, drain_limit(config.drain.grace, config.drain.delay))
    try:
        if ready_fd is None:
            print(f"recsvc serve: listening on {host_port(config.listen.host, handle.port)}", flush=True)
            if handle.metrics_port is not None:
                print(
                    f"recsvc serve: metrics on http://{host_port(config.listen.metrics_host, handle.metrics_port)}/metrics",
                    flush=True,
                )
        else:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        with ready_file(config.listen.ready_file if ready_fd is None else None, config.listen.host, handle.port):
            stop.wait()
        log.info("draining: health NOT_SERVING, in-flight calls get %.1fs", config.drain.grace)
        handle.stop(config.drain.grace, config.drain.delay)
    finally:
        watchdog.disarm()
    log.info("stopped")
    return 0


@contextlib.contextmanager
def ready_file(path: Path | None, host: str, port: int) -> Iterator[None]:
    """``path`` holds ``host:port`` and a newline while the body runs (the server listens), then is
    removed. Written to a temporary name and renamed, so a script that sees the file reads it whole."""
    if path is None:
        yield
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(host_port(host, port) + "\n")
    os.replace(tmp, path)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def serve(config: ServerConfig) -> int:
    """The `recsvc serve` entry point: blocks until SIGTERM/SIGINT, then drains; exit code."""
    config.check()
    if config.listen.workers == 1:
        return _serve_one(config)
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
    _authenticator(config)
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
    settings = config.ledger
    ledger = open_ledger(
        settings.location,
        settings.budget,
        settings.key_path,
        pool_size=1,
        window=settings.window,
        mechanism_of=stored_mechanism,
    )
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
            code = _serve_one(config, ready_w)
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
