"""The service's knobs and their defaults, written once: the `serve` flags, :class:`ServerConfig`
and the selection :class:`Policy` all read them from here. Stdlib only, so `recsvc --help`
stays instant.

:class:`ServerConfig` groups the knobs by what they configure (listen, admission, auth, ledger, limits,
selection, drain). Each knob has one flat parameter name, the `serve` flag's (``max_batch`` is
``--max-batch``), which messages name and :meth:`ServerConfig.of` accepts. The constraints on
them are declared once, in :data:`CONSTRAINTS`, and checked once, by :func:`validate`.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recsvc.checks import ParamError
from recsvc.ledger import is_postgres
from recsvc.ledger.fingerprint import default_path as default_key_path
from recsvc.ledger.units import MAX_EPSILON, budget_units
from recsvc.ledger.waits import CONNECT_S, DEFAULT_WAITS, Waits
from recsvc.ledger.window import LIFETIME, BudgetWindow
from recsvc.policy import AUTO_THRESHOLD

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

AUTO = "auto"
# What a two-stage Recommend's candidate stage may run: the registry's one-shot top-k mechanisms
# (named here, not imported: this module stays stdlib-only; a test checks the two agree).
CANDIDATE_MECHANISMS: tuple[str, ...] = ("oneshot", "gumbel", "clm")


def _named(default: Any, flag: str) -> Any:
    """A group field whose flat parameter name (the `serve` flag's) differs from its own name."""
    return field(default=default, metadata={"flag": flag})


@dataclass(frozen=True)
class Listen:
    """Where and how the server listens."""

    host: str = "127.0.0.1"
    port: int = 50051  # 0: pick a free port (single worker only; see ServerHandle.port)
    workers: int = 1  # processes sharing the port (SO_REUSEPORT) and the ledger
    threads: int = 16  # gRPC thread pool per worker; more requests in flight → larger group commits
    reuse_port: bool = False
    metrics_port: int | None = None  # given → Prometheus /metrics on metrics_host:metrics_port
    metrics_host: str = "127.0.0.1"
    ready_file: Path | None = None  # given → holds HOST:PORT while the server listens (scripts wait for it)


@dataclass(frozen=True)
class Admission:
    """What the calls of one worker may hold at once, so that no client can pin the server
    (SECURITY.md): authenticated RPCs in flight, HTTP/2 streams per connection, request bytes
    being served, health watchers, streaming calls, how much of each one principal may hold, and
    how long a connection, a request's body or a stream may idle."""

    max_concurrent_rpcs: int = 128  # authenticated calls in flight; more → RESOURCE_EXHAUSTED
    max_streams_per_connection: int = 100  # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 suggests >= 100)
    max_inflight_bytes: int = 64 * 1024 * 1024  # request bytes of the calls in flight; more → RESOURCE_EXHAUSTED
    receive_timeout: float = 10.0  # seconds from a call's headers to its whole request message
    idle_timeout: float = 300.0  # seconds a connection without calls stays open
    keepalive_time: float = 60.0  # seconds between the server's pings on a quiet connection
    keepalive_timeout: float = 20.0  # seconds a ping may go unanswered before the connection closes
    min_ping_interval: float = 10.0  # least seconds between a client's pings (faster: GOAWAY)
    max_health_watches: int = 16  # concurrent Health/Watch streams (Check is unlimited)
    max_streaming_calls: int = 16  # concurrent authenticated streams (server reflection), apart from the RPCs
    stream_idle_timeout: float = 60.0  # seconds a stream may pass no message; then it is ended
    # the fraction of each bound above (RPCs, bytes, watchers, streams) one principal may hold
    principal_share: float = 0.25


@dataclass(frozen=True)
class Auth:
    """Transport security, principals and their rate limit."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None  # given → mTLS: clients must present a cert signed by it
    token_file: Path | None = None  # given → every RPC but health needs `authorization: Bearer <token>`
    client_scopes: Path | None = None  # certificate subject/SAN → scope (needs client_ca); see SECURITY.md
    allow_plaintext_tokens: bool = False  # tokens without TLS on a non-loopback host (behind a TLS proxy)
    rate_limit: float = 0.0  # requests/s per principal (per worker); 0: no limit


@dataclass(frozen=True)
class LedgerSettings:
    """The privacy ledger and the budget it enforces."""

    # an SQLite file, or a PostgreSQL URL (str) shared by replicas
    location: Path | str = _named(Path("ledger.db"), "ledger")
    pool: int = _named(8, "ledger_pool")  # PostgreSQL connections per process
    # PostgreSQL's lock_timeout, statement_timeout, idle_in_transaction_session_timeout (s; recsvc.ledger.waits)
    lock_timeout: float = _named(DEFAULT_WAITS.lock_s, "ledger_lock_timeout")
    statement_timeout: float = _named(DEFAULT_WAITS.statement_s, "ledger_statement_timeout")
    idle_timeout: float = _named(DEFAULT_WAITS.idle_in_transaction_s, "ledger_idle_timeout")
    # a PostgreSQL ledger's own side (s): the wait for a pooled connection, libpq's link timeouts, reconnect retries
    connect_timeout: float = _named(CONNECT_S, "ledger_connect_timeout")
    fingerprint_key: Path | None = None  # HMAC key of the request fingerprints; None: <ledger>.key
    budget: float = 10.0  # per-user ε under basic composition
    # 'lifetime', or Nd: ε per user per UTC-aligned N-day window (NOT over all time; ledger_window)
    budget_window: str = LIFETIME

    @property
    def waits(self) -> Waits:
        return Waits(self.lock_timeout, self.statement_timeout, self.idle_timeout)

    @property
    def key_path(self) -> Path:
        """The fingerprint key file: ``fingerprint_key``, or ``<ledger>.key`` next to the ledger."""
        if self.fingerprint_key is None and is_postgres(self.location):
            return Path("")  # refused by validate(): replicas must name their shared key file
        return self.fingerprint_key or default_key_path(self.location)

    @property
    def window(self) -> BudgetWindow:
        return BudgetWindow.parse(self.budget_window)


@dataclass(frozen=True)
class Limits:
    """How large a request and an answer may be. The counts of repeated fields are checked on the
    raw bytes before parsing (recsvc.service.codec), every limit on the decoded request
    (recsvc.service.selection), and max_message_bytes by gRPC itself."""

    max_candidates: int = 10_000  # per Select request (and Recommend's num_candidates)
    max_batch: int = 1000  # most requests per SelectBatch call
    # most candidates in all the requests of one SelectBatch (a request's: its largest count of
    # candidates, item_ids, scores or item_rows), counted as they are parsed: what bounds a batch's
    # decoding and checking (≈ 1 CPU-s and 110 MB at most, SECURITY.md). 1,000 requests of 200.
    max_batch_candidates: int = 200_000
    # the least ε a request may ask for (0: none but the ledger's unit, 1e-12). Every stored answer
    # then costs at least this, so one user stores at most budget / min_epsilon answers per budget
    # window whatever ε it sends (10⁵ at the default budget), and the ledger's size stays bounded.
    min_epsilon: float = 1e-4
    max_history: int = 10_000  # most history entries per Recommend request
    max_slate: int = 100  # largest k (items per answer) on Select and Recommend
    max_multiselect_k: int = 50  # largest k (items per answer) on MultiSelect
    # Recommend's public floor: a two-stage request's private top-m has m >= this (or the whole
    # catalog, if smaller). Without a candidate stage Recommend always uses the full catalog.
    min_candidates: int = 500
    # Recommend's largest num_candidates (the private top-m's m): its candidate stage costs ≈ m × catalog draws.
    max_num_candidates: int = 5000
    # gRPC's max_receive_message_length: larger messages are refused unread (RESOURCE_EXHAUSTED).
    # It bounds the bytes as sent: the server never decompresses a request (admission.channel_options).
    max_message_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class Selection:
    """How a mechanism is chosen and drawn."""

    default_mechanism: str = AUTO  # used when a request names no mechanism
    # Recommend's private top-m when a two-stage request names none: a one-shot top-k mechanism
    # (docs/guides/serving.md#two-stage-recommend says why this one)
    default_candidate_mechanism: str = "clm"
    auto_threshold: float = AUTO_THRESHOLD  # |median population Spearman| above which auto picks gem/mgem
    allow_non_private: bool = False  # accept rnmh (NOT differentially private)
    # A sample expected to need more random draws than this (random stopping: ≈ 1/γ, up to 10⁶ at
    # the γ floor) is drawn by a pool of heavy_draw_threads threads at the lowest CPU priority,
    # outside the ledger's lock, so floods of such requests cannot slow other users down. 10⁵
    # draws are about 3 ms of work (rs at γ = 1e-5); the hop to that pool costs 1.2-1.7 ms, so work
    # below this would spend a third of its time or more on the hop (docs/performance.md).
    heavy_draws: int = 100_000
    heavy_draw_threads: int = 1
    # Heavy calls wait for that pool in a bounded queue, never in a request thread: beyond
    # heavy_queue calls in all, or heavy_per_principal of one principal, → RESOURCE_EXHAUSTED.
    heavy_queue: int = 16
    heavy_per_principal: int = 4


@dataclass(frozen=True)
class Drain:
    """Graceful shutdown on SIGTERM."""

    grace: float = 10.0  # seconds in-flight calls get to finish
    delay: float = _named(0.5, "drain_delay")  # seconds health reports NOT_SERVING before the port closes


@dataclass(frozen=True)
class Policy:
    """What the selection layer reads of the server's configuration: two of its groups, shared."""

    limits: Limits = field(default_factory=Limits)
    selection: Selection = field(default_factory=Selection)


GROUPS: dict[str, type[DataclassInstance]] = {
    "listen": Listen,
    "admission": Admission,
    "auth": Auth,
    "ledger": LedgerSettings,
    "limits": Limits,
    "selection": Selection,
    "drain": Drain,
}
# flat parameter name → (group, field)
PARAMS: dict[str, tuple[str, str]] = {
    f.metadata.get("flag", f.name): (group, f.name) for group, cls in GROUPS.items() for f in fields(cls)
}


@dataclass(frozen=True)
class ServerConfig:
    artifacts: Path
    listen: Listen = field(default_factory=Listen)
    admission: Admission = field(default_factory=Admission)
    auth: Auth = field(default_factory=Auth)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    limits: Limits = field(default_factory=Limits)
    selection: Selection = field(default_factory=Selection)
    drain: Drain = field(default_factory=Drain)

    @classmethod
    def of(cls, artifacts: Path | str, **params: Any) -> ServerConfig:
        """A config from flat parameters (the `serve` flags' names, e.g. ``port=0, max_batch=3``);
        the rest keep their defaults."""
        return cls(Path(artifacts)).replace(**params)

    def replace(self, **params: Any) -> ServerConfig:
        """A copy with the flat parameters ``params`` changed."""
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise TypeError(
                f"unknown ServerConfig parameter(s) {', '.join(unknown)}; expected some of {', '.join(PARAMS)}"
            )
        changes: dict[str, dict[str, Any]] = {}
        for name, value in params.items():
            group, attr = PARAMS[name]
            changes.setdefault(group, {})[attr] = value
        return replace(self, **{g: replace(getattr(self, g), **c) for g, c in changes.items()})

    def get(self, name: str) -> Any:
        """The value of the flat parameter ``name``."""
        group, attr = PARAMS[name]
        return getattr(getattr(self, group), attr)

    @property
    def policy(self) -> Policy:
        return Policy(self.limits, self.selection)

    def check(self) -> ServerConfig:
        """Validates the knobs that do not need the artifact; returns self."""
        validate(self)
        return self


@dataclass(frozen=True)
class Constraint:
    """A rule on the config: when ``holds`` is false, a ParamError from ``template`` (its
    ``{name}`` fields are parameter names; ``{got}`` is ``got(config)``)."""

    holds: Callable[[ServerConfig], bool]
    template: str
    got: Callable[[ServerConfig], object] | None = None
    values: dict[str, object] = field(default_factory=dict)


def _at_least(name: str, least: float, note: str = "") -> Constraint:
    return Constraint(
        lambda c: c.get(name) >= least, f"{{{name}}} must be >= {least}{note}, got {{got}}", lambda c: c.get(name)
    )


def _seconds(name: str) -> Constraint:
    return Constraint(
        lambda c: 0 < c.get(name) < 86_400,
        f"{{{name}}} must be in (0, 86400) seconds, got {{got}}",
        lambda c: c.get(name),
    )


def _port(name: str) -> Constraint:
    return Constraint(
        lambda c: c.get(name) is None or 0 <= c.get(name) <= 65535,
        f"{{{name}}} must be in 0..65535, got {{got}}",
        lambda c: c.get(name),
    )


def _budget_ok(c: ServerConfig) -> bool:
    return 0 < c.ledger.budget < float("inf")


def _window_parses(c: ServerConfig) -> bool:
    """A bad budget_window raises BudgetWindow.parse's own ParamError (it names the accepted forms)."""
    return c.ledger.window is not None


# Checked in this order; the first that fails is the error.
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(_window_parses, "{budget_window} is not a budget window"),
    _port("port"),
    _at_least("workers", 1),
    _at_least("threads", 1),
    _at_least("ledger_pool", 1),
    *(
        _seconds(name)
        for name in ("ledger_lock_timeout", "ledger_statement_timeout", "ledger_idle_timeout", "ledger_connect_timeout")
    ),
    Constraint(
        lambda c: not is_postgres(c.ledger.location) or c.ledger.fingerprint_key is not None,
        "a PostgreSQL {ledger} needs {fingerprint_key} FILE: every replica must key request fingerprints "
        "with the same key file (created by `recsvc ledger init`)",
    ),
    Constraint(
        lambda c: c.selection.heavy_draws >= 1 and c.selection.heavy_draw_threads >= 1,
        "{heavy_draws} and {heavy_draw_threads} must be >= 1, got {got}",
        lambda c: f"{c.selection.heavy_draws} and {c.selection.heavy_draw_threads}",
    ),
    Constraint(_budget_ok, "{budget} must be a finite ε > 0, got {got}", lambda c: c.ledger.budget),
    Constraint(
        lambda c: not _budget_ok(c) or budget_units(c.ledger.budget) is not None,
        "{budget} must lie in [1e-12, {most}] (the ledger counts ε in units of 1e-12), got {got}",
        lambda c: c.ledger.budget,
        {"most": MAX_EPSILON},
    ),
    _at_least("max_candidates", 1),
    _at_least("max_slate", 1, " (items per answer)"),
    _at_least("max_multiselect_k", 1, " (items per MultiSelect answer)"),
    _at_least("min_candidates", 1),
    _at_least("max_batch", 1, " (requests per SelectBatch)"),
    _at_least("max_batch_candidates", 1, " (candidates in all the requests of one SelectBatch)"),
    Constraint(
        lambda c: c.limits.min_epsilon == 0 or 1e-12 <= c.limits.min_epsilon <= c.ledger.budget,
        "{min_epsilon} must be 0 (no floor) or at least 1e-12 and at most {budget}, got {got}",
        lambda c: c.limits.min_epsilon,
    ),
    _port("metrics_port"),
    Constraint(
        lambda c: c.listen.metrics_port is None or c.listen.metrics_port == 0 or c.listen.metrics_port != c.listen.port,
        "{metrics_port} must differ from {port} (both are {got}); expected two different ports",
        lambda c: c.listen.port,
    ),
    Constraint(
        lambda c: not Path(c.artifacts).exists() or Path(c.artifacts).is_dir(),
        "{artifacts} {got} is a file; expected an artifact directory (e.g. artifacts/ml-100k)",
        lambda c: c.artifacts,
    ),
    _at_least("auto_threshold", 0),
    Constraint(
        lambda c: c.selection.default_candidate_mechanism in CANDIDATE_MECHANISMS,
        "{default_candidate_mechanism} must be one of {names} (a one-shot top-k mechanism), got {got}",
        lambda c: repr(c.selection.default_candidate_mechanism),
        {"names": ", ".join(CANDIDATE_MECHANISMS)},
    ),
    Constraint(lambda c: c.drain.grace >= 0 and c.drain.delay >= 0, "{grace} and {drain_delay} must be >= 0"),
    Constraint(
        lambda c: c.listen.ready_file is None or Path(c.listen.ready_file).parent.is_dir(),
        "{ready_file} {got}: its directory does not exist; expected a file in an existing directory",
        lambda c: c.listen.ready_file,
    ),
    Constraint(
        lambda c: not (c.listen.workers > 1 and c.listen.port == 0), "{workers} > 1 needs an explicit {port} (not 0)"
    ),
    _at_least("max_history", 1),
    _at_least("max_num_candidates", 1),
    Constraint(
        lambda c: c.limits.min_candidates <= c.limits.max_num_candidates,
        "{min_candidates} must be <= {max_num_candidates}, got {got}",
        lambda c: f"{c.limits.min_candidates} > {c.limits.max_num_candidates}",
    ),
    _at_least("heavy_queue", 1),
    _at_least("heavy_per_principal", 1),
    _at_least("max_concurrent_rpcs", 1),
    _at_least("max_streams_per_connection", 1),
    _at_least("max_health_watches", 0),
    _at_least("max_streaming_calls", 0),
    Constraint(
        lambda c: 0 < c.admission.principal_share <= 1,
        "{principal_share} must be a fraction in (0, 1] of each bound, got {got}",
        lambda c: c.admission.principal_share,
    ),
    Constraint(
        lambda c: all(
            math.isfinite(c.get(n)) and c.get(n) > 0
            for n in (
                "receive_timeout",
                "stream_idle_timeout",
                "idle_timeout",
                "keepalive_time",
                "keepalive_timeout",
                "min_ping_interval",
            )
        ),
        "{receive_timeout}, {stream_idle_timeout}, {idle_timeout}, {keepalive_time}, {keepalive_timeout} and "
        "{min_ping_interval} must be finite numbers of seconds > 0",
    ),
    Constraint(
        lambda c: c.admission.max_inflight_bytes >= c.limits.max_message_bytes,
        "{max_inflight_bytes} must be >= {max_message_bytes} ({got}), or no message of the largest size "
        "could ever be served",
        lambda c: c.limits.max_message_bytes,
    ),
    Constraint(
        lambda c: 1024 <= c.limits.max_message_bytes <= 2**31 - 1,
        "{max_message_bytes} must be in 1024..2147483647 bytes, got {got}",
        lambda c: c.limits.max_message_bytes,
    ),
    Constraint(
        lambda c: math.isfinite(c.auth.rate_limit) and c.auth.rate_limit >= 0,
        "{rate_limit} must be a finite number of requests/s >= 0 (0: no limit), got {got}",
        lambda c: c.auth.rate_limit,
    ),
    Constraint(
        lambda c: c.auth.client_scopes is None or c.auth.client_ca is not None,
        "{client_scopes} needs {client_ca} (certificate scopes need mTLS)",
    ),
    Constraint(
        lambda c: (
            c.auth.token_file is None
            or c.auth.tls_cert is not None
            or c.auth.allow_plaintext_tokens
            or is_loopback(c.listen.host)
        ),
        "{token_file} without TLS on {host} {got} would send bearer tokens in plaintext over the network; "
        "expected {tls_cert} and {tls_key}, a loopback {host} (127.0.0.1, ::1, localhost), or "
        "{allow_plaintext_tokens} when a trusted proxy terminates TLS",
        lambda c: c.listen.host,
    ),
)


def validate(config: ServerConfig) -> None:
    """Raises a ParamError for the first of :data:`CONSTRAINTS` that ``config`` breaks."""
    for rule in CONSTRAINTS:
        if not rule.holds(config):
            values = dict(rule.values)
            if rule.got is not None:
                values["got"] = rule.got(config)
            raise ParamError(rule.template, **values)


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
    """The default of a flat ServerConfig parameter (for the `serve` flags)."""
    group, attr = PARAMS[name]
    return GROUPS[group].__dataclass_fields__[attr].default
