"""The private-selection gRPC service (SPEC §5).

* :mod:`recsvc.service.config` — ``ServerConfig`` and the selection ``Policy``: every default, once
* :mod:`recsvc.service.server` — ``start`` (in-process) and ``serve`` (CLI, SIGTERM drain, ``--workers``)
* :mod:`recsvc.service.selection` — proto-free: request checks, clipping, ``auto``, select + ledger charge
* :mod:`recsvc.service.servicer` — gRPC only: messages ↔ selection, refusals → status codes
* :mod:`recsvc.ledger` (its own package) — the privacy ledger the service charges
* :mod:`recsvc.service.client` — ``Client(target, token=None, ...)``
* :mod:`recsvc.service.auth`, :mod:`recsvc.service.metrics` — TLS/mTLS, bearer tokens, Prometheus
"""
