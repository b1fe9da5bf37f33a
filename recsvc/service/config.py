"""The service's settings, declared once (:mod:`recsvc.settings`): each field of :class:`ServerConfig`'s
groups (listen, admission, auth, ledger, limits, selection, drain) carries its default, constraint, unit and
help, and is one flat parameter, the `serve` flag's (``max_batch`` is ``--max-batch``), which messages name and
:meth:`ServerConfig.of` accepts. The rules over several settings are :data:`CONSTRAINTS`;
:meth:`ServerConfig.check` checks both. Stdlib only, so `recsvc --help` stays instant."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, get_type_hints

from recsvc.checks import ParamError
from recsvc.ledger import Ledger, is_postgres, open_ledger
from recsvc.ledger.fingerprint import default_path as default_key_path
from recsvc.ledger.units import MAX_EPSILON, budget_units
from recsvc.ledger.waits import CONNECT_S, DEFAULT_WAITS, Waits
from recsvc.ledger.window import LIFETIME, BudgetWindow
from recsvc.policy import AUTO_THRESHOLD
from recsvc.settings import Range, check, setting, settings_of

AUTO = "auto"
# What a two-stage Recommend's candidate stage may run: the registry's one-shot top-k mechanisms
# (named here, not imported: this module stays stdlib-only; a test checks the two agree).
CANDIDATE_MECHANISMS: tuple[str, ...] = ("oneshot", "gumbel", "clm")
COUNT = Range(1, integer=True)  # a number of things, at least one
BOUND = Range(0, integer=True)  # a bound that may be 0 (nothing of that kind admitted)
POSITIVE = Range(0, low_open=True)
PORT, PORT_OR_NONE = Range(0, 65535, integer=True), Range(0, 65535, integer=True, none=True)
MESSAGE = Range(1024, 2**31 - 1, integer=True)  # gRPC's message length is an int32
S = "seconds"
MORE = "more: RESOURCE_EXHAUSTED"


def ledger_arg(text: str) -> Path | str:
    """A PostgreSQL URL stays a string (Path would fold its '//'); anything else is a file path."""
    return text if is_postgres(text) else Path(text)


@dataclass(frozen=True)
class Listen:
    """Where and how the server listens."""

    host: str = setting("127.0.0.1", help="address to listen on")
    port: int = setting(50051, help="0 picks a free port (single worker; see ServerHandle.port)", check=PORT)
    workers: int = setting(1, help="processes sharing the port (SO_REUSEPORT) and the ledger", check=COUNT)
    # more requests in flight → larger group commits
    threads: int = setting(
        16,
        help="request threads per worker: they decode, check and charge calls (a Select alone on the server "
        "runs on the event loop instead)",
        check=COUNT,
    )
    reuse_port: bool = False  # not a flag: the workers' supervisor sets it
    metrics_port: int | None = setting(None, help="serve Prometheus /metrics on this port", check=PORT_OR_NONE)
    metrics_host: str = setting("127.0.0.1", help="address of the /metrics server")
    ready_file: Path | None = setting(
        None,
        unit="file",
        help="written (whole, at once) with HOST:PORT when the server listens, removed when it stops; "
        "scripts wait for it, or run `recsvc wait-ready`",
    )


@dataclass(frozen=True)
class Admission:
    """What the calls of one worker may hold at once, so that no client can pin the server
    (SECURITY.md, "Admission"), how much of it one principal may hold, and how long a connection,
    a request's body or a stream may idle."""

    max_concurrent_rpcs: int = setting(128, help=f"authenticated calls in flight per worker; {MORE}", check=COUNT)
    # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 suggests >= 100)
    max_streams_per_connection: int = setting(100, help="HTTP/2 streams one connection may open at once", check=COUNT)
    max_inflight_bytes: int = setting(64 * 2**20, unit="bytes", help=f"request bytes in flight per worker; {MORE}")
    receive_timeout: float = setting(
        10.0, unit=S, help="from a call's headers to its message; later: DEADLINE_EXCEEDED"
    )
    idle_timeout: float = setting(300.0, unit=S, help="how long a connection without calls stays open")
    keepalive_time: float = setting(60.0, unit=S, help="between the server's pings on a quiet connection")
    keepalive_timeout: float = setting(20.0, unit=S, help="how long a ping may go unanswered; then the connection ends")
    min_ping_interval: float = setting(10.0, unit=S, help="least time between a client's pings (faster: GOAWAY)")
    max_health_watches: int = setting(16, help="Health/Watch streams per worker (Check is unbounded)", check=BOUND)
    max_streaming_calls: int = setting(
        16,
        help=f"authenticated streams (server reflection) open at once per worker, apart from the RPCs; {MORE}",
        check=BOUND,
    )
    stream_idle_timeout: float = setting(60.0, unit=S, help="how long a stream may idle; then DEADLINE_EXCEEDED")
    principal_share: float = setting(
        0.25,
        help="fraction of --max-concurrent-rpcs, --max-inflight-bytes, --max-health-watches and "
        "--max-streaming-calls one principal may hold (anonymous callers: one per peer address; a "
        f"principal holding none is always admitted within the total); {MORE}",
        check=Range(0, 1, low_open=True),
    )


@dataclass(frozen=True)
class Auth:
    """Transport security, principals and their rate limit."""

    tls_cert: Path | None = setting(None, help="server certificate (PEM); enables TLS")
    tls_key: Path | None = setting(None, help="server private key (PEM)")
    client_ca: Path | None = setting(None, help="CA (PEM) for client certificates; enables mTLS")
    token_file: Path | None = setting(
        None,
        help="bearer tokens, lines '<token> <scope>' (scope admin, service or user:<user_id>; a token alone "
        "means service); every RPC but health then needs one",
    )
    client_scopes: Path | None = setting(
        None,
        help="with --client-ca: lines 'subject:<RFC 2253 subject> <scope>' or '<type>:<SAN> <scope>' (type "
        "dns, uri, email or ip) mapping client certificates to scopes (see SECURITY.md)",
    )
    allow_plaintext_tokens: bool = setting(
        False, help="accept --token-file without TLS on a non-loopback --host (a trusted proxy terminates TLS)"
    )
    rate_limit: float = setting(
        0.0, help="requests/s per principal and worker, a SelectBatch counting each item (0: no limit)", check=Range(0)
    )


@dataclass(frozen=True)
class LedgerSettings:
    """The privacy ledger and the budget it enforces. A PostgreSQL ledger's waits (recsvc.ledger.waits)
    end in UNAVAILABLE, nothing spent."""

    location: Path | str = setting(
        Path("ledger.db"),
        name="ledger",
        type=ledger_arg,
        help="privacy ledger: an SQLite file (created if missing) or a PostgreSQL URL "
        "postgresql://USER@HOST:PORT/DB shared by replicas (prepare it with `recsvc ledger init`)",
    )
    pool: int = setting(8, name="ledger_pool", help="PostgreSQL connections per process", check=COUNT)
    lock_timeout: float = setting(
        DEFAULT_WAITS.lock_s,
        name="ledger_lock_timeout",
        unit=S,
        help="PostgreSQL lock_timeout: a charge's wait for a lock",
    )
    statement_timeout: float = setting(
        DEFAULT_WAITS.statement_s, name="ledger_statement_timeout", unit=S, help="PostgreSQL statement_timeout"
    )
    idle_timeout: float = setting(
        DEFAULT_WAITS.idle_in_transaction_s,
        name="ledger_idle_timeout",
        unit=S,
        help="PostgreSQL idle_in_transaction_session_timeout: a ledger session idle this long inside a "
        "transaction (a frozen replica's) is ended, its rows released and its charge rolled back",
    )
    connect_timeout: float = setting(
        CONNECT_S,
        name="ledger_connect_timeout",
        unit=S,
        help="a replica's wait for a pooled PostgreSQL connection, to connect, or for an answer over a silent "
        "link (a partition), and how long a lost connection is retried",
    )
    fingerprint_key: Path | None = setting(
        None,
        unit="file",
        help="HMAC key of the request fingerprints, created with mode 0600 if missing, never stored in the "
        "ledger (SQLite default: <ledger>.key; PostgreSQL: required, the same file on every replica)",
    )
    budget: float = setting(10.0, help="per-user ε budget (basic composition)", check=POSITIVE)
    budget_window: str = setting(
        LIFETIME,
        unit="window",
        help="'lifetime' (default: --budget is ε per user over all time) or Nd, e.g. 1d, 7d, 30d: a renewable "
        "budget, --budget ε per user per N-day window aligned to the Unix epoch in UTC (1d starts at 00:00 "
        "UTC; 7d on Thursdays). The guarantee is then ε per window, NOT over all time: over T windows a "
        "user's data may be exposed up to T·ε. Hours are not accepted. Fixed when the ledger is created; "
        "every replica must use the same window",
    )

    @property
    def waits(self) -> Waits:
        return Waits(self.lock_timeout, self.statement_timeout, self.idle_timeout)

    @property
    def key_path(self) -> Path:
        """The fingerprint key file: ``fingerprint_key``, or ``<ledger>.key`` next to the ledger."""
        if self.fingerprint_key is None and is_postgres(self.location):
            return Path("")  # refused by check(): replicas must name their shared key file
        return self.fingerprint_key or default_key_path(self.location)

    @property
    def window(self) -> BudgetWindow:
        return BudgetWindow.parse(self.budget_window)

    def open(self, **options: Any) -> Ledger:
        """The ledger these settings name, with their budget, key file, window and connect timeout
        (``options``: the rest of :func:`recsvc.ledger.open_ledger`'s)."""
        return open_ledger(
            self.location,
            self.budget,
            self.key_path,
            window=self.window,
            connect_timeout=self.connect_timeout,
            **options,
        )


@dataclass(frozen=True)
class Limits:
    """How large a request and an answer may be. The counts of repeated fields are checked on the
    raw bytes before parsing (recsvc.service.codec), every limit on the decoded request
    (recsvc.service.selection), and max_message_bytes by gRPC itself."""

    max_candidates: int = setting(
        10_000, help="most candidates per Select (and Recommend's num_candidates)", check=COUNT
    )
    max_batch: int = setting(1000, help="most requests per SelectBatch call", check=COUNT)
    # What bounds a batch's decoding and checking (≈ 1 CPU-s and 110 MB at most, SECURITY.md): 1,000 requests of 200.
    max_batch_candidates: int = setting(
        200_000,
        help="most candidates in all the requests of one SelectBatch, a request's being its largest count "
        "of candidates, item_ids, scores or item_rows, counted as they are parsed",
        check=COUNT,
    )
    # Every stored answer costs at least this, so the ledger's size stays bounded whatever ε users send.
    min_epsilon: float = setting(
        1e-4,
        help="least ε a request may ask for, so one user stores at most --budget / --min-epsilon answers per "
        "budget window (0: no floor but the ledger's unit, 1e-12)",
    )
    max_history: int = setting(10_000, help="most history entries per Recommend request", check=COUNT)
    max_slate: int = setting(100, help="largest k (items per answer) on Select and Recommend", check=COUNT)
    max_multiselect_k: int = setting(50, help="largest k (items per answer) on MultiSelect", check=COUNT)
    min_candidates: int = setting(
        500,
        help="Recommend's public floor: least m of a two-stage request's private top-m (the whole catalog if "
        "smaller). Without a candidate stage Recommend always selects over the full catalog",
        check=COUNT,
    )
    # its candidate stage costs ≈ m × catalog draws
    max_num_candidates: int = setting(
        5000, help="largest num_candidates (private top-m) of a two-stage Recommend", check=COUNT
    )
    # gRPC's max_receive_message_length, on the bytes as sent: the server never decompresses a
    # request (admission.channel_options).
    max_message_bytes: int = setting(
        16 * 2**20, unit="bytes", help="largest request message; larger ones are refused unread", check=MESSAGE
    )


@dataclass(frozen=True)
class SelectionSettings:
    """How a mechanism is chosen and drawn."""

    default_mechanism: str = setting(AUTO, help="used when a request names no mechanism")
    # docs/guides/serving.md#two-stage-recommend says why clm
    default_candidate_mechanism: str = setting(
        "clm",
        help=f"the one-shot top-k mechanism ({', '.join(CANDIDATE_MECHANISMS)}) of a two-stage Recommend's "
        "private top-m when the request names none",
    )
    auto_threshold: float = setting(
        AUTO_THRESHOLD, help="|median population Spearman| above which auto picks gem/mgem", check=Range(0)
    )
    allow_non_private: bool = setting(
        False, help="accept the mechanisms that are NOT differentially private (`recsvc mechanisms` lists them)"
    )
    # Heavy samples are drawn outside the ledger's lock at the lowest CPU priority, so floods of them
    # cannot slow other users down. 10⁵ draws are about 3 ms of work (rs at γ = 1e-5); the hop to the
    # pool costs 1.2-1.7 ms, so lighter work would spend a third of its time on it (docs/performance.md).
    heavy_draws: int = setting(
        100_000,
        help="expected random draws (random stopping: about 1/gamma) above which a sample is drawn by the "
        "low-priority pool",
    )
    heavy_draw_threads: int = setting(1, help="that pool's threads per worker (lowest CPU priority; tens of MB a draw)")
    # Heavy calls wait for that pool in a bounded queue, never in a request thread.
    heavy_queue: int = setting(16, help=f"heavy calls (above --heavy-draws) queued per worker; {MORE}", check=COUNT)
    heavy_per_principal: int = setting(4, help=f"heavy calls one principal may have queued; {MORE}", check=COUNT)


@dataclass(frozen=True)
class Drain:
    """Graceful shutdown on SIGTERM."""

    grace: float = setting(10.0, unit=S, help="how long in-flight calls get to finish", check=Range(0))
    delay: float = setting(
        0.5, name="drain_delay", unit=S, help="how long health says NOT_SERVING before the port closes", check=Range(0)
    )


@dataclass(frozen=True)
class SelectorConfig:
    """What the selection layer reads of the server's configuration: two of its groups, shared."""

    limits: Limits = field(default_factory=Limits)
    selection: SelectionSettings = field(default_factory=SelectionSettings)


@dataclass(frozen=True)
class ServerConfig:
    artifacts: Path = setting(help="artifact directory, e.g. artifacts/ml-100k")
    listen: Listen = field(default_factory=Listen)
    admission: Admission = field(default_factory=Admission)
    auth: Auth = field(default_factory=Auth)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    limits: Limits = field(default_factory=Limits)
    selection: SelectionSettings = field(default_factory=SelectionSettings)
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
    def selector(self) -> SelectorConfig:
        return SelectorConfig(self.limits, self.selection)

    def check(self) -> ServerConfig:
        """Validates the knobs that do not need the artifact; returns self. A ParamError for the first
        setting that breaks its own constraint, else for the first of :data:`CONSTRAINTS` it breaks."""
        check(self)  # recsvc.settings.check: each setting's own constraint
        for rule in CONSTRAINTS:
            if not rule.holds(self):
                values = dict(rule.values)
                if rule.got is not None:
                    values["got"] = rule.got(self)
                raise ParamError(rule.template, **values)
        return self


def _flat(f: Field[Any]) -> str:
    spec = f.metadata.get("setting")
    return spec.name or f.name if spec is not None else f.name


# flat parameter name → (group, field), for every field of ServerConfig's groups
PARAMS: dict[str, tuple[str, str]] = {
    _flat(f): (group, f.name)
    for group, cls in get_type_hints(ServerConfig).items()
    if is_dataclass(cls)
    for f in fields(cls)
}


@dataclass(frozen=True)
class Constraint:
    """A rule on the config: when ``holds`` is false, a ParamError from ``template`` (its
    ``{name}`` fields are parameter names; ``{got}`` is ``got(config)``)."""

    holds: Callable[[ServerConfig], bool]
    template: str
    got: Callable[[ServerConfig], object] | None = None
    values: dict[str, object] = field(default_factory=dict)


def _seconds(name: str) -> Constraint:
    """The PostgreSQL waits' own message (tests/ledger holds it)."""
    return Constraint(
        lambda c: 0 < c.get(name) < 86_400,
        f"{{{name}}} must be in (0, 86400) seconds, got {{got}}",
        lambda c: c.get(name),
    )


# Named together, so that one refusal states the rule for them all.
IDLE_TIMEOUTS = tuple(d.name for d in settings_of(Admission) if d.spec.unit == S)


def _window_parses(c: ServerConfig) -> bool:
    """A bad budget_window raises BudgetWindow.parse's own ParamError (it names the accepted forms)."""
    return c.ledger.window is not None


# The rules over several settings, a file, or a family of settings named together; each setting's
# own constraint is its field's `check`. Checked after those, in this order; the first that fails is the error.
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(_window_parses, "{budget_window} is not a budget window"),
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
    Constraint(
        lambda c: budget_units(c.ledger.budget) is not None,
        "{budget} must lie in [1e-12, {most}] (the ledger counts ε in units of 1e-12), got {got}",
        lambda c: c.ledger.budget,
        {"most": MAX_EPSILON},
    ),
    Constraint(
        lambda c: c.limits.min_epsilon == 0 or 1e-12 <= c.limits.min_epsilon <= c.ledger.budget,
        "{min_epsilon} must be 0 (no floor) or at least 1e-12 and at most {budget}, got {got}",
        lambda c: c.limits.min_epsilon,
    ),
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
    Constraint(
        lambda c: c.selection.default_candidate_mechanism in CANDIDATE_MECHANISMS,
        "{default_candidate_mechanism} must be one of {names} (a one-shot top-k mechanism), got {got}",
        lambda c: repr(c.selection.default_candidate_mechanism),
        {"names": ", ".join(CANDIDATE_MECHANISMS)},
    ),
    Constraint(
        lambda c: c.listen.ready_file is None or Path(c.listen.ready_file).parent.is_dir(),
        "{ready_file} {got}: its directory does not exist; expected a file in an existing directory",
        lambda c: c.listen.ready_file,
    ),
    Constraint(
        lambda c: not (c.listen.workers > 1 and c.listen.port == 0), "{workers} > 1 needs an explicit {port} (not 0)"
    ),
    Constraint(
        lambda c: c.limits.min_candidates <= c.limits.max_num_candidates,
        "{min_candidates} must be <= {max_num_candidates}, got {got}",
        lambda c: f"{c.limits.min_candidates} > {c.limits.max_num_candidates}",
    ),
    Constraint(
        lambda c: all(math.isfinite(c.get(n)) and c.get(n) > 0 for n in IDLE_TIMEOUTS),
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
