"""The asyncio side of the server: its event loop (in a thread of its own), the health statuses
set from any thread, and the ``grpc.aio`` server itself with the gate, the services and
reflection (decision 0005). :mod:`recsvc.service.server` drives it through :class:`EventLoop`."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from recsvc.checks import ParamError
from recsvc.ledger import is_postgres
from recsvc.service.auth import SERVICE_NAME, Authenticator
from recsvc.service.config import ServerConfig, host_port

T = TypeVar("T")


class EventLoop:
    """The server's asyncio loop, in a thread of its own, so the in-process API stays synchronous."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="recsvc-loop", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs ``coro`` on the loop and returns its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Health:
    """The health servicer's statuses, set from any thread (the servicer itself lives on the loop)."""

    def __init__(self, loop: EventLoop, servicer: Any) -> None:
        self._loop, self.servicer = loop, servicer

    def set(self, name: str, status: int) -> None:
        self._loop.call(self.servicer.set(name, status))

    def enter_graceful_shutdown(self) -> None:
        self._loop.call(self.servicer.enter_graceful_shutdown())


async def build(config: ServerConfig, servicer: Any, authenticator: Authenticator) -> tuple[Any, Any, tuple[Any, ...]]:
    """The aio server (made on the loop it runs on), with the gate, the services and reflection;
    its health servicer; the pools to shut down after it."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from recsvc.service import admission, interceptors
    from recsvc.service.draws import HeavyCalls
    from recsvc.service.servicer import register
    from recsvc.service.threads import Threads
    from recsvc.v1 import selection_pb2

    servicer.limiter = admission.RateLimiter(config.auth.rate_limit) if config.auth.rate_limit > 0 else None
    requests = Threads(config.listen.threads, "recsvc-rpc")
    heavy = HeavyCalls(config.selection.heavy_queue, config.selection.heavy_per_principal, config.selection.heavy_draws)
    gate = interceptors.Gate(
        authenticator,
        servicer.limiter,
        admission.Admission(config.admission),
        requests,
        heavy,
        inline=inline_methods(config),
        refusals=servicer.refusals,
    )
    server = grpc.aio.server(interceptors=[gate], options=admission.channel_options(config))
    register(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        selection_pb2.DESCRIPTOR.services_by_name["PrivateSelection"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    return server, health_servicer, (requests, heavy)


def inline_methods(config: ServerConfig) -> tuple[str, ...]:
    """The methods a lone call may run on the event loop: Select, with one worker and the embedded
    SQLite ledger, and then its commit never waits there (F5): it runs under
    :func:`recsvc.ledger.without_waiting`, so a write lock held by another process makes it finish
    in a request thread instead (:meth:`recsvc.service.interceptors.Gate._observe`). Never
    with PostgreSQL (a network round trip) or workers sharing the file (their commits would often
    find the lock held)."""
    if config.listen.workers > 1 or is_postgres(config.ledger.location):
        return ()
    return (f"/{SERVICE_NAME}/Select",)


async def bind(server: Any, config: ServerConfig, creds: Any) -> int:
    """Adds the listening port; a failure becomes a ValueError that names host:port and the likely cause."""
    address = host_port(config.listen.host, config.listen.port)
    expected = "expected a free {port} (0..65535) and a {host} that is an address of this machine (e.g. 127.0.0.1)"
    if not config.listen.reuse_port:  # a plain socket names the cause (gRPC only says "Failed to bind")
        try:
            check_port_free(config.listen.host, config.listen.port)
        except ValueError as exc:
            raise ParamError("{reason}; " + expected, reason=str(exc)) from None
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind to address ...; set GRPC_VERBOSITY=debug"
        port = 0
    if port == 0:
        raise ParamError(
            "cannot listen on {address}: the port is in use or the host is not an address of this machine; " + expected,
            address=address,
        )
    return port


def check_port_free(host: str, port: int) -> None:
    # SO_REUSEPORT would otherwise let our workers silently join someone else's server.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except (OSError, OverflowError) as exc:  # gaierror (bad host) is an OSError
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ValueError(f"cannot listen on {host_port(host, port)}: {reason}") from None
