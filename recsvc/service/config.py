"""The service's knobs and their defaults, written once: the `serve` flags, :class:`ServerConfig`
and the selection :class:`Policy` all read them from here. Stdlib only, so `recsvc --help`
stays instant."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, fields
from pathlib import Path

from recsvc.checks import ParamError
from recsvc.ledger import is_postgres
from recsvc.ledger.fingerprint import default_path as default_key_path
from recsvc.ledger.units import MAX_EPSILON, budget_units
from recsvc.ledger.window import LIFETIME, BudgetWindow

AUTO = "auto"


@dataclass(frozen=True)
class Policy:
    """What the selection layer needs to know of the server's configuration."""

    default_mechanism: str = AUTO  # used when a request names no mechanism
    auto_threshold: float = 0.1  # |median population Spearman| above which auto picks gem/mgem
    max_candidates: int = 10_000  # per Select request (and Recommend's num_candidates)
    max_batch: int = 1000  # most requests per SelectBatch call
    max_history: int = 10_000  # most history entries per Recommend request
    max_slate: int = 100  # largest k (items per answer) on Select and Recommend
    # Recommend's public floor: a two-stage request's private top-m has m >= this (or the whole
    # catalog, if smaller). Without a candidate stage Recommend always uses the full catalog.
    min_candidates: int = 500
    allow_non_private: bool = False  # accept rnmh (NOT differentially private)
    # A sample expected to need more random draws than this (random stopping: ≈ 1/γ, up to 10⁶ at
    # the γ floor) is drawn by a pool of heavy_draw_threads threads at the lowest CPU priority,
    # outside the ledger's lock, so floods of such requests cannot slow other users down.
    heavy_draws: int = 50_000
    heavy_draw_threads: int = 1


@dataclass(frozen=True)
class ServerConfig:
    artifacts: Path
    host: str = "127.0.0.1"
    port: int = 50051  # 0: pick a free port (single worker only; see ServerHandle.port)
    ledger: Path | str = Path("ledger.db")  # an SQLite file, or a PostgreSQL URL (str) shared by replicas
    ledger_pool: int = 8  # PostgreSQL connections per process (see README "Running several replicas")
    fingerprint_key: Path | None = None  # HMAC key of the request fingerprints; None: <ledger>.key
    budget: float = 10.0  # per-user ε under basic composition
    # 'lifetime', or Nd: ε per user per UTC-aligned N-day window (NOT over all time; ledger_window)
    budget_window: str = LIFETIME
    default_mechanism: str = Policy.default_mechanism
    auto_threshold: float = Policy.auto_threshold
    max_candidates: int = Policy.max_candidates
    max_batch: int = Policy.max_batch
    max_history: int = Policy.max_history
    # gRPC's max_receive_message_length: larger messages are refused unread (RESOURCE_EXHAUSTED).
    # 16 MiB holds a full SelectBatch of 1,000 requests × 500 candidates (≈ 8.5 MB) twice over.
    max_message_bytes: int = 16 * 1024 * 1024
    max_slate: int = Policy.max_slate
    min_candidates: int = Policy.min_candidates
    workers: int = 1  # processes sharing the port (SO_REUSEPORT) and the ledger
    threads: int = 16  # gRPC thread pool per worker; more requests in flight → larger group commits
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None  # given → mTLS: clients must present a cert signed by it
    token_file: Path | None = None  # given → every RPC but health needs `authorization: Bearer <token>`
    client_scopes: Path | None = None  # certificate subject/SAN → scope (needs client_ca); see SECURITY.md
    allow_plaintext_tokens: bool = False  # tokens without TLS on a non-loopback host (behind a TLS proxy)
    rate_limit: float = 0.0  # requests/s per principal (per worker); 0: no limit
    metrics_port: int | None = None  # given → Prometheus /metrics on metrics_host:metrics_port
    metrics_host: str = "127.0.0.1"
    allow_non_private: bool = Policy.allow_non_private
    heavy_draws: int = Policy.heavy_draws
    heavy_draw_threads: int = Policy.heavy_draw_threads
    grace: float = 10.0  # seconds in-flight calls get to finish on SIGTERM
    drain_delay: float = 0.5  # seconds health reports NOT_SERVING before the port closes
    reuse_port: bool = False

    @property
    def key_path(self) -> Path:
        """The fingerprint key file: ``fingerprint_key``, or ``<ledger>.key`` next to the ledger."""
        if self.fingerprint_key is None and is_postgres(self.ledger):
            return Path("")  # refused by check(): replicas must name their shared key file
        return self.fingerprint_key or default_key_path(self.ledger)

    @property
    def window(self) -> BudgetWindow:
        return BudgetWindow.parse(self.budget_window)

    @property
    def policy(self) -> Policy:
        return Policy(**{f.name: getattr(self, f.name) for f in fields(Policy)})

    def check(self) -> ServerConfig:
        """Validates the knobs that do not need the artifact; returns self."""
        self.window  # noqa: B018 - a ParamError naming --budget-window
        checks: list[tuple[bool, str, dict[str, object]]] = [
            (0 <= self.port <= 65535, "{port} must be in 0..65535, got {got}", {"got": self.port}),
            (self.workers >= 1, "{workers} must be >= 1, got {got}", {"got": self.workers}),
            (self.threads >= 1, "{threads} must be >= 1, got {got}", {"got": self.threads}),
            (self.ledger_pool >= 1, "{ledger_pool} must be >= 1, got {got}", {"got": self.ledger_pool}),
            (not is_postgres(self.ledger) or self.fingerprint_key is not None,
             "a PostgreSQL {ledger} needs {fingerprint_key} FILE: every replica must key request fingerprints "
             "with the same key file (created by `recsvc ledger init`)", {}),
            (self.heavy_draws >= 1 and self.heavy_draw_threads >= 1,
             "{heavy_draws} and {heavy_draw_threads} must be >= 1, got {got}",
             {"got": f"{self.heavy_draws} and {self.heavy_draw_threads}"}),
            (0 < self.budget < float("inf"), "{budget} must be a finite ε > 0, got {got}", {"got": self.budget}),
            (not 0 < self.budget < float("inf") or budget_units(self.budget) is not None,
             "{budget} must lie in [1e-12, {most}] (the ledger counts ε in units of 1e-12), got {got}",
             {"got": self.budget, "most": MAX_EPSILON}),
            (self.max_candidates >= 1, "{max_candidates} must be >= 1, got {got}", {"got": self.max_candidates}),
            (self.max_slate >= 1, "{max_slate} must be >= 1 (items per answer), got {got}", {"got": self.max_slate}),
            (self.min_candidates >= 1, "{min_candidates} must be >= 1, got {got}", {"got": self.min_candidates}),
            (self.max_batch >= 1, "{max_batch} must be >= 1 (requests per SelectBatch), got {got}",
             {"got": self.max_batch}),
            (self.metrics_port is None or 0 <= self.metrics_port <= 65535,
             "{metrics_port} must be in 0..65535, got {got}", {"got": self.metrics_port}),
            (self.metrics_port is None or self.metrics_port == 0 or self.metrics_port != self.port,
             "{metrics_port} must differ from {port} (both are {got}); expected two different ports", {"got": self.port}),
            (not Path(self.artifacts).exists() or Path(self.artifacts).is_dir(),
             "{artifacts} {path} is a file; expected an artifact directory (e.g. artifacts/ml-100k)",
             {"path": self.artifacts}),
            (self.auto_threshold >= 0, "{auto_threshold} must be >= 0, got {got}", {"got": self.auto_threshold}),
            (self.grace >= 0 and self.drain_delay >= 0, "{grace} and {drain_delay} must be >= 0", {}),
            (not (self.workers > 1 and self.port == 0), "{workers} > 1 needs an explicit {port} (not 0)", {}),
            (self.max_history >= 1, "{max_history} must be >= 1, got {got}", {"got": self.max_history}),
            (1024 <= self.max_message_bytes <= 2**31 - 1,
             "{max_message_bytes} must be in 1024..2147483647 bytes, got {got}", {"got": self.max_message_bytes}),
            (math.isfinite(self.rate_limit) and self.rate_limit >= 0,
             "{rate_limit} must be a finite number of requests/s >= 0 (0: no limit), got {got}", {"got": self.rate_limit}),
            (self.client_scopes is None or self.client_ca is not None,
             "{client_scopes} needs {client_ca} (certificate scopes need mTLS)", {}),
            (self.token_file is None or self.tls_cert is not None or self.allow_plaintext_tokens
             or is_loopback(self.host),
             "{token_file} without TLS on {host} {got} would send bearer tokens in plaintext over the network; "
             "expected {tls_cert} and {tls_key}, a loopback {host} (127.0.0.1, ::1, localhost), or "
             "{allow_plaintext_tokens} when a trusted proxy terminates TLS", {"got": self.host}),
        ]
        for ok, template, values in checks:
            if not ok:
                raise ParamError(template, **values)
        return self


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC and URLs spell it: an IPv6 address is bracketed ([::1]:50051)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses only: any other name may reach the network."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default(name: str) -> object:
    """The default of a ServerConfig field (for the `serve` flags)."""
    return ServerConfig.__dataclass_fields__[name].default
