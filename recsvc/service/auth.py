"""Who may call the server: transport security (TLS / mTLS), bearer tokens, and the principals
and scopes they map to (SECURITY.md). The gRPC-side gate that applies them is
:mod:`recsvc.service.interceptors`; this module stays light (the client imports its TLS helpers)."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import ssl
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from recsvc.checks import ParamError, check_regular_file
from recsvc.service.config import Auth as AuthSettings
from recsvc.service.errors import PermissionDenied

log = logging.getLogger(__name__)

SERVICE_NAME = "recsvc.v1.PrivateSelection"
# Health checks stay open so that load balancers and orchestrators need no credentials.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
# RPCs that act for the user_id(s) in the request: a `user:<id>` scope may call them for <id> only.
PER_USER_METHODS = frozenset(
    f"/{SERVICE_NAME}/{m}" for m in ("Select", "SelectBatch", "Recommend", "GetBudget", "MultiSelect")
)
# RPCs that reveal only public server configuration: every principal may call them.
PUBLIC_METHOD_PREFIXES = (f"/{SERVICE_NAME}/ListMechanisms", "/grpc.reflection.")

ADMIN, SERVICE, USER = "admin", "service", "user"
SCOPE_FORMAT = "'admin', 'service' or 'user:<user_id>'"


@dataclass(frozen=True)
class Scope:
    """What a principal may do: ``admin`` every RPC for any user; ``service`` the per-user and
    public RPCs for any user; ``user:<id>`` the per-user and public RPCs for user_id <id> only."""

    kind: str
    user_id: str = ""

    @staticmethod
    def parse(text: str) -> Scope:
        kind, sep, user_id = text.partition(":")
        if kind in (ADMIN, SERVICE) and not sep:
            return Scope(kind)
        if kind == USER and sep and user_id:
            if not unicodedata.is_normalized("NFC", user_id):  # requests with it are refused (check_user_id)
                raise ValueError(
                    f"scope {text[:80]!r} names a user_id that is not in Unicode NFC; expected its NFC form"
                )
            return Scope(USER, user_id)
        raise ValueError(f"scope {text[:80]!r} is not a scope; expected {SCOPE_FORMAT}")

    def __str__(self) -> str:
        return f"{USER}:{self.user_id}" if self.kind == USER else self.kind

    def allows_method(self, method: str) -> bool:
        return self.kind == ADMIN or method in PER_USER_METHODS or method.startswith(PUBLIC_METHOD_PREFIXES)

    def allows_user(self, user_id: str) -> bool:
        return self.kind != USER or user_id == self.user_id


@dataclass(frozen=True)
class Principal:
    """A credential's identity for logs (never the token itself) and its scope (None: none granted)."""

    name: str
    scope: Scope | None

    def __str__(self) -> str:
        return f"{self.name} ({self.scope or 'no scope'})"


@dataclass(frozen=True)
class Caller:
    """The principals behind one call: every configured credential's. A call must be within
    every one's scope (a token and a certificate both scoped: their intersection)."""

    principals: tuple[Principal, ...]
    key: str  # the rate-limit bucket

    def __str__(self) -> str:
        return " + ".join(map(str, self.principals))

    def allows_method(self, method: str) -> bool:
        return all(p.scope is not None and p.scope.allows_method(method) for p in self.principals)

    def check_user(self, user_id: str) -> None:
        """Raises PermissionDenied unless every principal may act for ``user_id``."""
        for p in self.principals:
            if p.scope is None or not p.scope.allows_user(user_id):
                allowed = f"user_id {p.scope.user_id!r} only" if p.scope else "nothing"
                named = "names another user_id" if user_id else "names no user_id (set user_id)"
                raise PermissionDenied(f"principal {p} may act for {allowed}; the request {named}")


def _lines(path: str | os.PathLike[str], what: str, entry: str, expected: str) -> list[tuple[int, str]]:
    """(line number, stripped text) of a UTF-8 text file, without blank lines and '#' comments."""
    p = Path(path)
    check_regular_file(what, p, expected)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {p} is not UTF-8 text; expected {expected}") from None
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), start=1)]
    lines = [(n, ln) for n, ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise ValueError(f"{what} {p} holds no {entry}; expected {expected}")
    return lines


TOKEN_FORMAT = "lines '<token> <scope>' (scope " + SCOPE_FORMAT + "; a token alone means 'service')"


def load_tokens(path: str | os.PathLike[str]) -> list[tuple[str, Principal]]:
    """(token, principal) per line of a token file: ``<token> <scope>`` or ``<token>`` (scope
    ``service``). Blank lines and '#' comments are ignored; a repeated token is refused.
    The principal is named by its line (``token@3``): logs never show a token."""
    out: list[tuple[str, Principal]] = []
    seen: dict[str, int] = {}
    for n, line in _lines(path, "token file", "token", TOKEN_FORMAT):
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"token file {path} line {n}: {len(parts)} words; expected {TOKEN_FORMAT}")
        try:
            scope = Scope.parse(parts[1]) if len(parts) == 2 else Scope(SERVICE)
        except ValueError as exc:
            if parts[1].startswith(f"{USER}:"):  # a user scope the parser refused (not NFC, no id): no token
                raise ValueError(f"token file {path} line {n}: {exc}") from None
            # otherwise neither word is quoted: on a line written scope first, the second is the token
            raise ValueError(f"token file {path} line {n}: {_not_a_scope(parts)}; expected {TOKEN_FORMAT}") from None
        if parts[0] in seen:  # which scope would apply? (the token itself is never printed)
            raise ValueError(
                f"token file {path} line {n} repeats the token of line {seen[parts[0]]}; expected each token once"
            )
        seen[parts[0]] = n
        out.append((parts[0], Principal(f"token@{n}", scope)))
    return out


def _not_a_scope(parts: list[str]) -> str:
    """Why a token line's second word is refused, without showing either word."""
    try:
        Scope.parse(parts[0])
    except ValueError:
        return "the second word is not a scope (neither word is shown: one is a token)"
    return "the second word is not a scope but the first is: write the token first"


def read_token(path: str | os.PathLike[str]) -> str:
    """The first token in a token file (what a client sends)."""
    return load_tokens(path)[0][0]


CERT_FORMAT = (
    "lines '<identity> <scope>' with identity 'subject:<RFC 2253 subject, e.g. CN=backend,O=Example>' "
    "or a subject alternative name of one type: 'dns:<DNS name>', 'uri:<URI, e.g. spiffe://…>', "
    "'email:<address>' or 'ip:<address>'; scope " + SCOPE_FORMAT
)
# A rule's SAN type → the key under which gRPC's auth context lists the verified peer's SANs of that type.
SAN_TYPES = {"dns": "peer_dns", "uri": "peer_uri", "email": "peer_email", "ip": "peer_ip"}
# Certificate SANs by rule type: {"dns": ["backend.internal"], "uri": [...], ...}
Sans = dict[str, list[str]]


def _canonical(kind: str, value: str) -> str:
    """The form rules and certificates are compared in: DNS names are case-insensitive, and one
    IP address has several spellings (``::1``, ``0:0::1``)."""
    if kind == "dns":
        return value.lower()
    if kind == "ip":
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            return value
    return value


@dataclass(frozen=True)
class CertRule:
    kind: str  # "subject", or a SAN type: "dns", "uri", "email", "ip"
    value: str
    principal: Principal

    def matches(self, subject: str, sans: Sans) -> bool:
        if self.kind == "subject":
            return self.value == subject
        return _canonical(self.kind, self.value) in {_canonical(self.kind, v) for v in sans.get(self.kind, ())}


def _untyped(path: str | os.PathLike[str], n: int, value: str) -> ValueError:
    return ValueError(
        f"client scopes file {path} line {n}: 'san:{value}' names no SAN type, so a certificate whose URI or "
        f"e-mail SAN is that string would match a rule meant for a DNS name; write the type instead: "
        f"'dns:{value}', 'uri:{value}', 'email:{value}' or 'ip:{value}'"
    )


def load_client_scopes(path: str | os.PathLike[str]) -> list[CertRule]:
    """Certificate identity → scope rules (first match wins), from a ``--client-scopes`` file.
    The identity is everything before the last word (a subject may contain spaces)."""
    rules: list[CertRule] = []
    seen: dict[tuple[str, str], int] = {}
    for n, line in _lines(path, "client scopes file", "rule", CERT_FORMAT):
        parts = line.rsplit(None, 1)
        kind, sep, value = parts[0].partition(":")
        if kind == "san" and sep and value and len(parts) == 2:
            raise _untyped(path, n, value)
        if len(parts) != 2 or not sep or not value or kind not in ("subject", *SAN_TYPES):
            raise ValueError(f"client scopes file {path} line {n}: expected {CERT_FORMAT}")
        if kind == "ip" and not _is_ip(value):
            raise ValueError(
                f"client scopes file {path} line {n}: ip:{value} is not an IP address; expected {CERT_FORMAT}"
            )
        value = _canonical(kind, value)
        try:
            scope = Scope.parse(parts[1])
        except ValueError as exc:
            raise ValueError(f"client scopes file {path} line {n}: {exc}") from None
        if (kind, value) in seen:
            raise ValueError(
                f"client scopes file {path} line {n} repeats the identity of line {seen[kind, value]}; "
                "expected each identity once"
            )
        seen[kind, value] = n
        rules.append(CertRule(kind, value, Principal(f"cert {kind}:{value}", scope)))
    return rules


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _first(auth_context: dict[str, list[bytes]], key: str) -> str | None:
    values = auth_context.get(key) or []
    return values[0].decode(errors="replace") if values else None


class Authenticator:
    """Maps a call's credentials to a :class:`Caller`, or None (UNAUTHENTICATED).

    * tokens given: a valid ``authorization: Bearer <token>`` is required; its line's scope applies;
    * certificate rules given (``--client-scopes``, mTLS): the first rule matching the client
      certificate's subject or a SAN applies; an unmatched certificate has no scope;
    * mTLS without rules and without tokens: every verified certificate is ``service``;
    * nothing configured: every caller is ``anonymous`` with ``admin`` scope (rate-limited per peer address).
    """

    def __init__(
        self,
        tokens: Iterable[tuple[str, Principal]] | None = None,
        cert_rules: Sequence[CertRule] | None = None,
        mtls: bool = False,
    ) -> None:
        # Tokens are looked up by HMAC under a per-process random key: whatever a lookup's timing
        # reveals is about digests an attacker cannot compute, never about a token (the timing-safe
        # equivalent of comparing against every token in constant time, at O(1) for many tokens).
        self._key = secrets.token_bytes(32)
        self._tokens = None if tokens is None else {self._digest(t): p for t, p in tokens}
        if self._tokens is not None and not self._tokens:
            raise ValueError("bearer-token auth needs at least one token")
        self._rules = None if cert_rules is None else list(cert_rules)
        self._mtls = mtls

    @classmethod
    def of(cls, settings: AuthSettings) -> Authenticator:
        """The principals from the token file and the client-scopes file (parsed: a bad line is one
        clear error; a file open to other users is warned about); mTLS with a client CA."""
        for path in (settings.token_file, settings.client_scopes):
            warn_if_open(path)
        return cls(
            None if settings.token_file is None else load_tokens(settings.token_file),
            None if settings.client_scopes is None else load_client_scopes(settings.client_scopes),
            settings.client_ca is not None,
        )

    def describe(self) -> str:
        """How callers authenticate, for the startup log (never a token or a rule's identity)."""
        parts = []
        if self._tokens is not None:
            parts.append(f"bearer tokens ({len(self._tokens)})")
        if self._rules is not None:
            parts.append(f"client certificates with {len(self._rules)} scope rule(s)")
        elif self._mtls:
            parts.append(
                "client certificates (service scope)" if not parts else "client certificates (connection only)"
            )
        return "auth " + (" + ".join(parts) if parts else "OFF: every caller is anonymous with admin scope")

    def _token(self, metadata: Iterable[tuple[str, Any]] | None) -> Principal | None:
        assert self._tokens is not None
        value = next((v for k, v in (metadata or ()) if k == "authorization"), None)
        if not isinstance(value, str) or not value.startswith("Bearer "):
            return None
        return self._tokens.get(self._digest(value[len("Bearer ") :].strip()))

    def _digest(self, token: str) -> bytes:
        return hmac.digest(self._key, token.encode(), "sha256")

    def _certificate(self, auth_context: dict[str, list[bytes]]) -> Principal | None:
        subject = _first(auth_context, "x509_subject")
        if subject is None:  # no verified client certificate on this connection
            return None
        if self._rules is None:
            return Principal(f"cert subject:{subject}", Scope(SERVICE))
        sans = {
            kind: [v.decode(errors="replace") for v in auth_context.get(key) or []] for kind, key in SAN_TYPES.items()
        }
        rule = next((r for r in self._rules if r.matches(subject, sans)), None)
        return rule.principal if rule else Principal(f"cert subject:{subject}", None)

    def authenticate(self, context: grpc.ServicerContext) -> Caller | None:
        principals: list[Principal] = []
        if self._tokens is not None:
            token = self._token(context.invocation_metadata())
            if token is None:
                return None
            principals.append(token)
        if self._rules is not None or (self._mtls and not principals):
            cert = self._certificate(context.auth_context())
            if cert is None:
                return None
            principals.append(cert)
        if not principals:
            return Caller((Principal("anonymous", Scope(ADMIN)),), anonymous_key(context.peer()))
        return Caller(tuple(principals), " + ".join(p.name for p in principals))


def anonymous_key(peer: str) -> str:
    """The principal key of an anonymous caller at gRPC's ``peer`` (``ipv4:1.2.3.4:5678``): one per
    address, whatever its port, so that a client cannot get a fresh share from each connection."""
    host = peer.rpartition(":")[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return f"anonymous@{host}"


def warn_if_open(path: str | os.PathLike[str] | None) -> None:
    """Warns when a credentials file (token file, client scopes, TLS private key) is open to group
    or other users: anyone who reads it holds a principal."""
    if path is not None and Path(path).is_file() and Path(path).stat().st_mode & 0o077:
        log.warning("%s is open to group or other users; expected mode 0600 (chmod 600 %s)", path, path)


def _read(path: str | os.PathLike[str] | None, what: str) -> bytes | None:
    if path is None:
        return None
    p = Path(path)
    check_regular_file(f"{what} file", p, "a PEM file")
    return p.read_bytes()


def check_cert_and_key(cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> None:
    """Parses a PEM certificate chain and its private key (``--tls-cert``, ``--tls-key``) and checks
    that they belong together, so that a bad file is reported as such instead of as gRPC's opaque
    'Failed to bind'."""
    _read(cert, "certificate")
    _read(key, "private key")
    try:
        # gRPC cannot use an encrypted key; an empty password never prompts on the terminal
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=b"")
    except ssl.SSLError as exc:
        raise ParamError(
            "{tls_cert}/{tls_key} {cert} / {key}: not a valid PEM certificate and a matching unencrypted PEM private "
            "key ({reason}); expected the certificate in the first file and its key in the second",
            cert=str(cert),
            key=str(key),
            reason=str(exc.reason or exc),
        ) from None


def check_ca(path: str | os.PathLike[str], param: str) -> None:
    """Parses a PEM CA bundle (at least one certificate); ``param`` is the parameter it came from."""
    _read(path, "CA")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=os.fspath(path))
    except ssl.SSLError as exc:
        raise ParamError(
            f"{{{param}}} {{path}} is not a valid PEM certificate ({{reason}}); expected a CA certificate "
            "in PEM format (-----BEGIN CERTIFICATE-----)",
            path=os.fspath(path),
            reason=str(exc.reason or exc),
        ) from None


def check_server_files(
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
    client_ca: str | os.PathLike[str] | None = None,
) -> bool:
    """Validates the server's TLS files without touching gRPC (safe before fork); True if TLS is on."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ParamError("{client_ca} needs {tls_cert} and {tls_key} (mTLS runs over TLS)")
        return False
    if cert is None or key is None:
        raise ParamError("TLS needs both {tls_cert} and {tls_key}")
    check_cert_and_key(cert, key)
    warn_if_open(key)
    if client_ca is not None:
        check_ca(client_ca, "client_ca")
    return True


def server_credentials(
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
    client_ca: str | os.PathLike[str] | None = None,
) -> grpc.ServerCredentials | None:
    """TLS if cert+key are given; mTLS (client certificates required) if client_ca is too."""
    if not check_server_files(cert, key, client_ca):
        return None
    ca = _read(client_ca, "client CA")
    return grpc.ssl_server_credentials(
        [(_read(key, "TLS key"), _read(cert, "TLS certificate"))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def channel_credentials(
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> grpc.ChannelCredentials:
    if (cert is None) != (key is None):
        raise ParamError(
            "a client certificate needs both {tls_cert} and {tls_key} (got only "
            f"{{{'tls_cert' if key is None else 'tls_key'}}}); pass both or neither"
        )
    if ca is not None:
        check_ca(ca, "tls_ca")
    if cert is not None and key is not None:
        check_cert_and_key(cert, key)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "CA"),
        private_key=_read(key, "client key"),
        certificate_chain=_read(cert, "client certificate"),
    )
