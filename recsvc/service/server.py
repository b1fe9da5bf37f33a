"""Starting and draining one PrivateSelection gRPC server (``--workers N``: :mod:`recsvc.service.workers`).

This module stays light at import time (stdlib + grpc): the workers' parent imports it before it
forks, so no gRPC server, thread pool, polars pool or SQLite connection exists in the parent.

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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsvc.ledger import Ledger, LedgerObserver, is_postgres
from recsvc.service.aioserver import EventLoop, Health, bind, build
from recsvc.service.auth import SERVICE_NAME, Authenticator
from recsvc.service.config import ServerConfig, host_port
from recsvc.service.shutdown import DrainWatchdog, StopSignal, drain_limit

log = logging.getLogger("recsvc.service")
PROBE_INTERVAL_S = 1.0  # how often a replica checks that its PostgreSQL ledger answers (health)


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
    authenticator = Authenticator.of(config.auth)
    pg = is_postgres(config.ledger.location)
    if not pg:  # a PostgreSQL ledger is checked by connecting to it, below
        ledger_mod.check_path(config.ledger.location)
        fingerprint.check(config.ledger.key_path)
    servicer = SelectionServicer(artifact, None, config.selector)  # the ledger is attached once every check passed
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
        ledger = config.ledger.open(pool_size=config.ledger.pool, waits=config.ledger.waits, observer=ledger_observer())
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
        servicer.selector.default_mechanism,
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


def serve_one(config: ServerConfig, ready_fd: int | None = None) -> int:
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
