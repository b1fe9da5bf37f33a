"""The private-selection gRPC service (SPEC §5).

* :mod:`recsvc.service.server` — ``ServerConfig``, ``start`` (in-process) and ``serve`` (CLI, SIGTERM drain, ``--workers``)
* :mod:`recsvc.service.servicer` — request validation, clipping, selection, ledger charge
* :mod:`recsvc.service.ledger` — the SQLite privacy ledger (atomic, durable, idempotent)
* :mod:`recsvc.service.client` — ``Client(target, token=None, ...)``
* :mod:`recsvc.service.auth`, :mod:`recsvc.service.metrics` — TLS/mTLS, bearer tokens, Prometheus
"""
