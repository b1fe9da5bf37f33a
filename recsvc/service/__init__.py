"""The private-selection gRPC service (docs/reference/specification.md §5).

* :mod:`recsvc.service.config` — ``ServerConfig`` (grouped: listen, admission, auth, ledger, limits,
  selection, drain) and the selection ``SelectorConfig``: every default and constraint, once
* :mod:`recsvc.service.server` — ``start`` (in-process) and ``serve_one`` (one server: SIGTERM drain)
* :mod:`recsvc.service.workers` — ``serve``, the CLI's entry: one server, or ``--workers N`` forked and supervised
* :mod:`recsvc.service.aioserver` — the ``grpc.aio`` server, its event loop thread and health statuses
* :mod:`recsvc.service.servicer` — each RPC: authorize → decode → selector → encode
* :mod:`recsvc.service.interceptors` — the gate (authentication, rate limit, scopes, the bounds on
  calls in flight, reading and safe decoding, status codes, metrics)
* :mod:`recsvc.service.admission` — those bounds, gRPC's HTTP/2 limits and the rate limiter
* :mod:`recsvc.service.draws` — heavy work: the bounded heavy queue and the low-priority draw processes
* :mod:`recsvc.service.codec` — the wire format: the bounded pre-scan, message codecs, batch framing
* :mod:`recsvc.service.errors` — the service's refusals, each with its status code, and the status table
* :mod:`recsvc.service.selection` — proto-free: request checks, clipping, ``auto``, select + ledger charge
* :mod:`recsvc.ledger` (its own package) — the privacy ledger the service charges
* :mod:`recsvc.service.client` — ``Client(target, token=None, ...)``
* :mod:`recsvc.service.auth`, :mod:`recsvc.service.metrics` — TLS/mTLS, bearer tokens, Prometheus
* :mod:`recsvc.service.testing` — helpers for tests: a toy artifact, certificates, servers, clients
"""
