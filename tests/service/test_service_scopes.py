"""Who may call what, tried through real gRPC channels: principals and scopes (tokens
and client certificates), the per-principal rate limit, plaintext tokens off loopback, and the
--allow-non-private warning. Every refusal must spend nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

import recsvc.service.admission as admission
from recsvc.app.cli import main as recsvc_main
from recsvc.service.auth import Scope, load_client_scopes, load_tokens
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig, is_loopback
from recsvc.service.errors import ThrottledLog
from recsvc.service.server import ServerHandle, start
from recsvc.service.testing import candidates, rpc_error, served

TOKENS = """# token      scope
root-tok     admin
backend-tok  service
legacy-tok
alice-tok    user:alice
"""


def _server(artifact: Path, tmp_path: Path, **config) -> AbstractContextManager[ServerHandle]:
    return served(artifact, tmp_path / f"l{time.monotonic_ns()}.db", **config)


def _denied_calls() -> float:
    """PERMISSION_DENIED calls this process's servers have counted (recsvc_requests), over methods."""
    return sum(
        s.value
        for metric in REGISTRY.collect()
        if metric.name == "recsvc_requests"
        for s in metric.samples
        if s.name == "recsvc_requests_total" and s.labels["status"] == "PERMISSION_DENIED"
    )


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    path.chmod(0o600)
    return path


def test_a_user_token_cannot_read_spend_or_invent_other_users(
    artifact: Path, tmp_path: Path, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    denied_before = _denied_calls()
    with caplog.at_level(logging.INFO), _server(artifact, tmp_path, token_file=token_file, budget=2.0) as h:
        target = f"127.0.0.1:{h.port}"
        with Client(target, token="backend-tok", retries=0) as backend:
            backend.select("bob", candidates(), mechanism="rnm", epsilon=0.5)  # the victim has history
        before = h.ledger.totals()
        assert before == {"bob": pytest.approx(0.5)}
        with Client(target, token="alice-tok", retries=0) as alice:
            # The attack: read bob's budget, spend it to exhaustion, spread queries over invented ids.
            assert rpc_error(alice.budget, "bob")[0] is grpc.StatusCode.PERMISSION_DENIED
            for _ in range(5):
                code, msg = rpc_error(alice.select, "bob", candidates(), mechanism="rnm", epsilon=1.5)
                assert code is grpc.StatusCode.PERMISSION_DENIED and "token@5 (user:alice)" in msg
            for invented in ("alice2", "Alice", "alice ", "", "bob"):
                assert (
                    rpc_error(alice.select, invented, candidates(), mechanism="rnm", epsilon=0.1)[0]
                    is grpc.StatusCode.PERMISSION_DENIED
                )
                assert (
                    rpc_error(alice.recommend, invented, ["it1"], mechanism="rnm", epsilon=0.1)[0]
                    is grpc.StatusCode.PERMISSION_DENIED
                )
            code, msg = rpc_error(alice.select, "", candidates(), mechanism="rnm", epsilon=0.1)
            assert code is grpc.StatusCode.PERMISSION_DENIED and msg.endswith(
                "may act for user_id 'alice' only; the request names no user_id (set user_id)"
            ), msg
            assert h.ledger.totals() == before  # nothing spent, nobody new in the ledger
            assert h.ledger.user("bob").requests == 1
            # Its own user: every per-user RPC works; a batch refuses the foreign items alone.
            assert alice.select("alice", candidates(), mechanism="rnm", epsilon=0.25).epsilon_spent == 0.25
            assert alice.recommend("alice", ["it1", "it2"], mechanism="rnm", epsilon=0.25).epsilon_spent == 0.25
            reqs = [
                alice.select_request(u, candidates(), mechanism="rnm", epsilon=0.25) for u in ("alice", "bob", "eve")
            ]
            res = alice.select_batch(reqs)
            assert res[0].response.epsilon_spent == 0.25
            assert [r.error.code_name for r in res[1:]] == ["PERMISSION_DENIED"] * 2
            assert alice.budget("alice").spent == pytest.approx(0.75)
            assert alice.mechanisms().budget == 2.0  # public configuration: every principal may read it
        assert h.ledger.totals() == {"bob": pytest.approx(0.5), "alice": pytest.approx(0.75)}
        for token in ("root-tok", "backend-tok", "legacy-tok"):  # admin, service, and a bare token (service)
            with Client(target, token=token, retries=0) as c:
                assert c.budget("bob").spent == pytest.approx(0.5)
                assert c.select(f"user-of-{token}", candidates(), mechanism="rnm", epsilon=0.1).item_id
    denied = [r for r in caplog.records if "PERMISSION_DENIED" in r.getMessage()]
    # 18 refusal lines due (budget, 5 spends, 11 invented, the batch), one minute's 5 for the
    # principal (F11); the metrics count every refusal (the batch's 2 items as SelectBatch.item)
    assert len(denied) == 5
    assert _denied_calls() - denied_before == 1 + 5 + 11 + 2
    for r in denied:  # the principal is logged, never the request (user ids asked for, scores)
        text = r.getMessage()
        assert r.levelno == logging.WARNING and "token@5 (user:alice)" in text
        assert "bob" not in text and "eve" not in text and "alice2" not in text
    assert "-tok" not in "\n".join(r.getMessage() for r in caplog.records)  # no token is ever logged


def test_certificate_scopes(artifact: Path, certs: dict[str, Path], tmp_path: Path, token_file: Path) -> None:
    tls = dict(tls_cert=certs["server.pem"], tls_key=certs["server.key"], client_ca=certs["ca.pem"])
    client_tls: dict[str, Any] = dict(
        tls_ca=certs["ca.pem"], tls_cert=certs["client.pem"], tls_key=certs["client.key"], retries=0
    )
    scopes = tmp_path / "scopes"
    cases = {  # scopes file → (may act for carol, may act for dave, may call ListMechanisms)
        "subject:CN=recsvc-test-client user:carol\ndns:localhost admin\n": (True, False, True),  # first match wins
        "# by SAN\nip:127.0.0.1 service\n": (True, True, True),
        "subject:CN=someone-else admin\ndns:other.example service\n": (False, False, False),  # no rule: no scope
    }
    for text, (carol, dave, listing) in cases.items():
        scopes.write_text(text)
        with _server(artifact, tmp_path, client_scopes=scopes, **tls) as h:
            with Client(f"localhost:{h.port}", **client_tls) as c:
                for user, allowed in (("carol", carol), ("dave", dave)):
                    if allowed:
                        assert c.select(user, candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == 0.5
                    else:
                        assert (
                            rpc_error(c.select, user, candidates(), mechanism="rnm", epsilon=0.5)[0]
                            is grpc.StatusCode.PERMISSION_DENIED
                        )
                        assert rpc_error(c.budget, user)[0] is grpc.StatusCode.PERMISSION_DENIED
                if listing:
                    assert c.mechanisms().max_candidates > 0
                else:
                    assert rpc_error(c.mechanisms)[0] is grpc.StatusCode.PERMISSION_DENIED
            assert h.ledger.totals() == {u: pytest.approx(0.5) for u, ok in (("carol", carol), ("dave", dave)) if ok}
    # Token and certificate both scoped: a call must be inside both (service token ∩ user:carol cert).
    scopes.write_text("subject:CN=recsvc-test-client user:carol\n")
    with _server(artifact, tmp_path, client_scopes=scopes, token_file=token_file, **tls) as h:
        with Client(f"localhost:{h.port}", token="backend-tok", **client_tls) as c:
            assert c.select("carol", candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == 0.5
            assert (
                rpc_error(c.select, "dave", candidates(), mechanism="rnm", epsilon=0.5)[0]
                is grpc.StatusCode.PERMISSION_DENIED
            )
        with Client(f"localhost:{h.port}", **client_tls) as c:  # the certificate alone is not enough
            assert (
                rpc_error(c.select, "carol", candidates(), mechanism="rnm", epsilon=0.5)[0]
                is grpc.StatusCode.UNAUTHENTICATED
            )
        assert h.ledger.totals() == {"carol": pytest.approx(0.5)}
    with pytest.raises(ValueError, match=r"^client_scopes needs client_ca"):
        start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "x.db", client_scopes=scopes))
    assert not (tmp_path / "x.db").exists()


def test_rate_limit_per_principal(
    artifact: Path, tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 0.25 requests/s a principal's bucket holds 1 token and refills one every 4 s. The buckets
    read a clock the test moves (the limiter's only use of time), so each refill is exact: refused
    at 3.5 s, admitted at 4 s, whatever the host's load."""
    now = [1000.0]
    monkeypatch.setattr(admission, "time", SimpleNamespace(monotonic=lambda: now[0]))
    with _server(artifact, tmp_path, token_file=token_file, rate_limit=0.25) as h:
        target = f"127.0.0.1:{h.port}"
        with Client(target, token="alice-tok", retries=0) as alice, Client(target, token="backend-tok", retries=0) as b:
            alice.select("alice", candidates(), mechanism="rnm", epsilon=0.1)  # a burst of max(1, rate): 1
            code, msg = rpc_error(alice.select, "alice", candidates(), mechanism="rnm", epsilon=0.1)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit exceeded (0.25 requests/s" in msg
            assert rpc_error(alice.budget, "alice")[0] is grpc.StatusCode.RESOURCE_EXHAUSTED  # every RPC counts
            assert b.select("bob", candidates(), mechanism="rnm", epsilon=0.1).epsilon_spent == 0.1  # its own bucket
            assert h.ledger.user("alice").requests == 1
            now[0] += 3.5  # 0.875 of a token: still refused
            assert rpc_error(alice.budget, "alice")[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
            now[0] += 0.5  # one token back for each, 4 s after the call that emptied the bucket
            alice.select("alice", candidates(), mechanism="rnm", epsilon=0.1)
            # A batch pays for each item: 6 items leave the bucket 5 in debt (20 s at 0.25/s).
            res = b.select_batch(
                [b.select_request(f"u{i}", candidates(), mechanism="rnm", epsilon=0.1) for i in range(6)]
            )
            assert all(r.HasField("response") for r in res)
            assert rpc_error(b.budget, "u0")[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
            now[0] += 20.0  # the debt repaid: 0 tokens, still refused
            assert rpc_error(b.budget, "u0")[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
            now[0] += 4.0
            assert b.budget("u0").requests == 1
        assert h.ledger.user("alice").requests == 2 and h.ledger.user("bob").requests == 1
    with _server(artifact, tmp_path) as h:  # off by default
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            for _ in range(30):
                c.budget("x")


def test_plaintext_tokens_are_refused_off_loopback(
    artifact: Path, certs: dict[str, Path], tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "p.db"
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.org"):
        with pytest.raises(
            ValueError,
            match=f"^token_file without TLS on host {host} would send bearer tokens in "
            "plaintext .*or allow_plaintext_tokens when a trusted proxy",
        ):
            start(ServerConfig.of(artifacts=artifact, host=host, port=0, ledger=ledger, token_file=token_file))
    argv = [
        "serve",
        "--artifacts",
        str(artifact),
        "--ledger",
        str(ledger),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--token-file",
        str(token_file),
    ]
    assert recsvc_main(argv) == 2
    assert "--token-file without TLS on --host 0.0.0.0" in capsys.readouterr().err
    assert not ledger.exists()
    # Loopback, TLS, or the explicit flag: the server starts.
    assert [is_loopback(h) for h in ("::1", "[::1]", "127.9.9.9", "localhost", "::", "0.0.0.0", "localhost.ex")] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    for over in (
        {"host": "127.0.0.2"},
        {"host": "localhost"},
        {"host": "0.0.0.0", "allow_plaintext_tokens": True},
        {"host": "0.0.0.0", "tls_cert": certs["server.pem"], "tls_key": certs["server.key"]},
    ):
        with _server(artifact, tmp_path, token_file=token_file, **over) as h:
            assert h.port > 0


def test_token_and_scope_files_are_parsed_strictly(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text(TOKENS)
    got = [(t, p.name, str(p.scope)) for t, p in load_tokens(path)]
    assert got == [
        ("root-tok", "token@2", "admin"),
        ("backend-tok", "token@3", "service"),
        ("legacy-tok", "token@4", "service"),
        ("alice-tok", "token@5", "user:alice"),
    ]
    bad = {
        "s3cret root\n": r"line 1: the second word is not a scope \(neither word is shown: one is a token\); "
        r"expected lines '<token> <scope>' \(scope 'admin', 'service' or 'user:<user_id>'",
        "s3cret user:\n": r"line 1: scope 'user:' is not a scope; expected 'admin', 'service'",  # a scope's own words
        "user:alice s3cret\n": r"line 1: the second word is not a scope but the first is: write the token first; expected",
        "s3cret service\n#\ns3cret admin\n": r"line 3 repeats the token of line 1; expected each token once",
        "s3cret service extra\n": r"line 1: 3 words; expected lines '<token> <scope>'",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as info:
            load_tokens(path)
        assert "s3cret" not in str(info.value)  # a token is never quoted back, whichever word it is
    path.write_text(
        "subject:CN=John Smith,O=Example user:john\nuri:spiffe://ex.org/ns/prod/sa/api service\n"
        "dns:Ops.Internal admin\nip:0:0::1 admin\nemail:a@ex.org user:a\n"
    )
    rules = load_client_scopes(path)
    assert [(r.kind, r.value, r.principal.scope) for r in rules] == [
        ("subject", "CN=John Smith,O=Example", Scope("user", "john")),
        ("uri", "spiffe://ex.org/ns/prod/sa/api", Scope("service")),
        ("dns", "ops.internal", Scope("admin")),  # DNS names are case-insensitive
        ("ip", "::1", Scope("admin")),  # one spelling per address
        ("email", "a@ex.org", Scope("user", "a")),
    ]
    for text, message in {
        "CN=x admin\n": "expected lines '<identity> <scope>'",
        "dns:x\n": "expected lines",
        "dns:a admin\ndns:A service\n": "line 2 repeats the identity of line 1",
        "ip:::1 admin\nip:0::1 service\n": "line 2 repeats the identity of line 1",
        "dns:a owner\n": "scope 'owner' is not a scope",
        "ip:localhost admin\n": "ip:localhost is not an IP address",
        "san:ops.internal admin\n": "line 1: 'san:ops.internal' names no SAN type.*write the type instead: "
        "'dns:ops.internal', 'uri:ops.internal', 'email:ops.internal' or 'ip:ops.internal'",
    }.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_client_scopes(path)


def test_allow_non_private_warns_at_start_and_labels_rnmh(
    artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO), _server(artifact, tmp_path) as h:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            assert (
                rpc_error(c.select, "u", candidates(), mechanism="rnmh", epsilon=0.5)[0]
                is grpc.StatusCode.INVALID_ARGUMENT
            )
    # (the toy artifact has no `auto` policy table: that start-up warning is not this test's)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "policy.parquet" not in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO), _server(artifact, tmp_path, allow_non_private=True) as h:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            r = c.select("u", candidates(), mechanism="rnmh", epsilon=0.5)
            [res] = c.select_batch([c.select_request("u", candidates(), mechanism="rnmh", epsilon=0.5)])
            info = {m.name: (m.private, m.allowed) for m in c.mechanisms().mechanisms}
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "policy.parquet" not in r.getMessage()
    ]
    assert len(warnings) == 1 and "NOT differentially private" in warnings[0] and "--allow-non-private" in warnings[0]
    assert (r.mechanism, res.response.mechanism, info["rnmh"]) == ("rnmh", "rnmh", (False, True))


def test_serve_refuses_a_scope_first_token_line_without_printing_the_token(
    artifact: Path, tmp_path: Path, one_line_error: Callable[[str], str]
) -> None:
    """F9: `user:alice <token>` (scope first) stops start-up with one line that names the line, not the token."""
    tokens = tmp_path / "tokens"
    tokens.write_text("backend-s3cret service\nuser:alice alice-s3cret\n")
    tokens.chmod(0o600)
    argv = ["serve", "--artifacts", str(artifact), "--port", "0", "--ledger", str(tmp_path / "l.db")]
    assert recsvc_main([*argv, "--token-file", str(tokens)]) == 2
    err = one_line_error(
        r"token file .*tokens line 2: the second word is not a scope but the first is: write the token first"
    )
    assert "s3cret" not in err and not (tmp_path / "l.db").exists()


def test_refusal_warnings_are_throttled_per_principal(caplog: pytest.LogCaptureFixture) -> None:
    """At most ``burst`` lines per principal per period; the first line after says how many were held back."""
    throttled = ThrottledLog(burst=2, period=0.2)
    with caplog.at_level(logging.WARNING, logger="recsvc.service"):
        for _ in range(5):
            throttled.warning("token@5", "PERMISSION_DENIED Select for principal %s", "token@5")
        throttled.warning("token@6", "PERMISSION_DENIED Select for principal %s", "token@6")
        time.sleep(0.25)  # the next period
        throttled.warning("token@5", "PERMISSION_DENIED Select for principal %s", "token@5")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "PERMISSION_DENIED Select for principal token@5",
        "PERMISSION_DENIED Select for principal token@5",
        "PERMISSION_DENIED Select for principal token@6",
        "PERMISSION_DENIED Select for principal token@5 (and 3 more like it held back)",
    ]
