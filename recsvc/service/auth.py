"""Transport security (TLS / mTLS) and bearer-token authentication for the gRPC server."""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from recsvc.checks import ParamError, check_regular_file

# Health checks stay open so that load balancers and orchestrators need no token.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def load_tokens(path: str | os.PathLike[str]) -> list[str]:
    """Bearer tokens, one per line; blank lines and lines starting with '#' are ignored."""
    p = Path(path)
    check_regular_file("token file", p, "a file with one token per line")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"token file {p} is not UTF-8 text; expected one token per line") from None
    tokens = [ln.strip() for ln in text.splitlines()]
    tokens = [t for t in tokens if t and not t.startswith("#")]
    if not tokens:
        raise ValueError(f"token file {p} holds no token; expected one token per line")
    if any(any(ch.isspace() for ch in t) for t in tokens):
        raise ValueError(f"token file {p}: a token contains whitespace; expected one token per line")
    return tokens


def read_token(path: str | os.PathLike[str]) -> str:
    """The first token in a token file (what a client sends)."""
    return load_tokens(path)[0]


def _read(path: str | os.PathLike[str] | None, what: str) -> bytes | None:
    if path is None:
        return None
    p = Path(path)
    check_regular_file(f"{what} file", p, "a PEM file")
    return p.read_bytes()


def _no_password() -> bytes:
    return b""  # gRPC cannot use an encrypted key; never prompt on the terminal


def check_cert_and_key(cert: str | os.PathLike[str], key: str | os.PathLike[str], params: str) -> None:
    """Parses a PEM certificate chain and its private key and checks that they belong together,
    so that a bad file is reported as such instead of as gRPC's opaque 'Failed to bind'.
    ``params`` names the two files in the message, as ParamError fields (``"{tls_cert}/{tls_key}"``)."""
    _read(cert, "certificate")
    _read(key, "private key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as exc:
        raise ParamError(
            f"{params} {{cert}} / {{key}}: not a valid PEM certificate and a matching unencrypted PEM private "
            "key ({reason}); expected the certificate in the first file and its key in the second",
            cert=str(cert), key=str(key), reason=str(exc.reason or exc),
        ) from None


def check_ca(path: str | os.PathLike[str], param: str) -> None:
    """Parses a PEM CA bundle (at least one certificate); ``param`` is the parameter it came from."""
    _read(path, "CA")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=os.fspath(path))
    except ssl.SSLError as exc:
        raise ParamError(
            f"{{{param}}} {{path}} is not a valid PEM certificate ({{reason}}); expected a CA certificate "
            "in PEM format (-----BEGIN CERTIFICATE-----)", path=os.fspath(path), reason=str(exc.reason or exc),
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
    check_cert_and_key(cert, key, "{tls_cert}/{tls_key}")
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
        raise ParamError("a client certificate needs both {tls_cert} and {tls_key} (got only "
                         f"{{{'tls_cert' if key is None else 'tls_key'}}}); pass both or neither")
    if ca is not None:
        check_ca(ca, "tls_ca")
    if cert is not None and key is not None:
        check_cert_and_key(cert, key, "{tls_cert}/{tls_key}")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "CA"),
        private_key=_read(key, "client key"),
        certificate_chain=_read(cert, "client certificate"),
    )


def _deny_like(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as ``handler`` that aborts UNAUTHENTICATED."""

    def abort(_request: Any, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or invalid bearer token; expected metadata 'authorization: Bearer <token>'",
        )

    kinds: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(abort, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on every method except health checks."""

    def __init__(self, tokens: Iterable[str], open_prefixes: tuple[str, ...] = OPEN_METHOD_PREFIXES) -> None:
        self._tokens = [t.encode() for t in tokens]
        if not self._tokens:
            raise ValueError("bearer-token auth needs at least one token")
        self._open = open_prefixes

    def _authorised(self, metadata: Iterable[tuple[str, Any]] | None) -> bool:
        value = next((v for k, v in (metadata or ()) if k == "authorization"), None)
        if not isinstance(value, str) or not value.startswith("Bearer "):
            return False
        given = value[len("Bearer "):].strip().encode()
        # Compare against every token in constant time (no early exit on the first match).
        return sum(hmac.compare_digest(given, t) for t in self._tokens) > 0

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(self._open):
            return handler
        if self._authorised(handler_call_details.invocation_metadata):
            return handler
        return _deny_like(handler)
