"""Bearer tokens, TLS and mTLS, Prometheus metrics, and logs that never contain scores."""

from __future__ import annotations

import logging
import re
import urllib.request
from pathlib import Path

import grpc
import pytest

from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import candidates, rpc_error


def _code(fn, *args, **kwargs) -> grpc.StatusCode:
    return rpc_error(fn, *args, **kwargs)[0]


def test_bearer_token(artifact: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# clients\ns3cret-one\ns3cret-two\n")
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", token_file=tokens))
    target = f"127.0.0.1:{h.port}"
    try:
        for token in (None, "wrong", "s3cret-one-but-longer", "s3cret"):
            with Client(target, token=token, retries=0) as c:
                assert (
                    _code(c.select, "u", candidates(), mechanism="rnm", epsilon=1.0) is grpc.StatusCode.UNAUTHENTICATED
                )
                assert _code(c.budget, "u") is grpc.StatusCode.UNAUTHENTICATED
                assert _code(c.mechanisms) is grpc.StatusCode.UNAUTHENTICATED
                assert c.health() == "SERVING"  # health stays open for load balancers
        assert h.ledger.totals() == {}
        for token in ("s3cret-one", "s3cret-two"):
            with Client(target, token=token) as c:
                c.select("u", candidates(), mechanism="rnm", epsilon=1.0)
        assert h.ledger.totals() == {"u": pytest.approx(2.0)}
        # Raw metadata without the "Bearer " scheme is refused too.
        with Client(target, retries=0) as c:
            c.metadata = (("authorization", "s3cret-one"),)
            assert _code(c.budget, "u") is grpc.StatusCode.UNAUTHENTICATED
    finally:
        h.stop(1)
    empty = tmp_path / "empty"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ValueError, match="holds no token"):
        start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l2.db", token_file=empty))


def test_tls_and_mtls(artifact: Path, certs: dict[str, Path], tmp_path: Path) -> None:
    h = start(
        ServerConfig.of(
            artifacts=artifact,
            port=0,
            ledger=tmp_path / "tls.db",
            tls_cert=certs["server.pem"],
            tls_key=certs["server.key"],
        )
    )
    try:
        target = f"localhost:{h.port}"
        with Client(target, tls_ca=certs["ca.pem"]) as c:
            assert c.select("u", candidates(), mechanism="rnm", epsilon=1.0).item_id
        with Client(target, retries=0, timeout=30) as c:  # plaintext against a TLS port
            assert _code(c.budget, "u") is grpc.StatusCode.UNAVAILABLE
        with Client(target, tls_ca=certs["rogue.pem"], retries=0, timeout=30) as c:  # unknown CA
            assert _code(c.budget, "u") is grpc.StatusCode.UNAVAILABLE
    finally:
        h.stop(1)

    h = start(
        ServerConfig.of(
            artifacts=artifact,
            port=0,
            ledger=tmp_path / "mtls.db",
            tls_cert=certs["server.pem"],
            tls_key=certs["server.key"],
            client_ca=certs["ca.pem"],
        )
    )
    try:
        target = f"localhost:{h.port}"
        with Client(target, tls_ca=certs["ca.pem"], tls_cert=certs["client.pem"], tls_key=certs["client.key"]) as c:
            assert c.select("u", candidates(), mechanism="rnm", epsilon=1.0).item_id
        with Client(target, tls_ca=certs["ca.pem"], retries=0, timeout=30) as c:  # no client certificate
            assert _code(c.budget, "u") is grpc.StatusCode.UNAVAILABLE
        with Client(
            target,
            tls_ca=certs["ca.pem"],
            tls_cert=certs["rogue.pem"],
            tls_key=certs["rogue.key"],
            retries=0,
            timeout=30,
        ) as c:  # a certificate from another CA
            assert _code(c.budget, "u") is grpc.StatusCode.UNAVAILABLE
        assert h.ledger.totals() == {"u": pytest.approx(1.0)}
    finally:
        h.stop(1)
    with pytest.raises(ValueError, match=r"^TLS needs both tls_cert and tls_key$"):  # CLI: test_service_startup
        start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "x.db", tls_cert=certs["server.pem"]))


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_are_scraped(artifact: Path, tmp_path: Path) -> None:
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", metrics_port=0))
    url = f"http://127.0.0.1:{h.metrics_port}/metrics"
    try:
        before = urllib.request.urlopen(url, timeout=5).read().decode()
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            for _ in range(3):
                c.select("m", candidates(), mechanism="rnm", epsilon=0.5)
            c.select("m", candidates(), mechanism="auto", epsilon=0.25)
            _code(c.select, "m", [("nope", 1.0)], mechanism="rnm", epsilon=0.5)
            _code(c.select, "m", candidates(), mechanism="rnm", epsilon=100.0)
        after = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        h.stop(1)

    def delta(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta("recsvc_requests_total", method="Select", mechanism="rnm", status="OK") == 3
    assert delta("recsvc_requests_total", method="Select", mechanism="mgem", status="OK") == 1
    assert delta("recsvc_requests_total", method="Select", status="INVALID_ARGUMENT") == 1
    assert delta("recsvc_requests_total", method="Select", status="RESOURCE_EXHAUSTED") == 1
    assert delta("recsvc_epsilon_spent_total", mechanism="rnm") == pytest.approx(1.5)
    assert delta("recsvc_epsilon_spent_total") == pytest.approx(1.75)
    assert delta("recsvc_request_seconds_count", method="Select") == 6


def test_logs_never_contain_scores(artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = "0.7318284619"  # distinctive digits; must not appear anywhere in the logs
    scores = [(f"it{k}", float(f"0.{k + 1}7318284619")) for k in range(8)] + [("it9", float(marker))]
    with caplog.at_level(logging.DEBUG):
        h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=3.0))
        try:
            with Client(f"127.0.0.1:{h.port}", retries=0) as c:
                for mech in ("rnm", "gem", "mgem", "combined_gem", "em", "rs"):
                    c.select("log-user", scores, mechanism=mech, epsilon=0.1)
                c.recommend("log-user", ["it1", "it2"], mechanism="rnm", epsilon=0.1)
                c.select_batch([c.select_request("log-user", scores, mechanism="pf", epsilon=0.1)])
                bad = [*scores, ("it30", float("nan"))]
                _code(c.select, "log-user", bad, mechanism="rnm", epsilon=0.1)
                _code(c.select, "log-user", [*scores, ("ghost", 0.4418273645)], mechanism="rnm", epsilon=0.1)
                _code(c.select, "log-user", scores, mechanism="rnm", epsilon=50.0)
        finally:
            h.stop(1)
    text = "\n".join(r.getMessage() + " " + repr(r.args) + " " + (r.exc_text or "") for r in caplog.records)
    assert any(r.name == "recsvc.service" for r in caplog.records)  # the server did log (at DEBUG)
    assert "Select OK" in text
    for digits in ("7318284619", "4418273645"):
        assert digits not in text


def test_internal_errors_are_logged_without_their_message(
    artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception may quote the values it was given (numpy's messages do): the log
    keeps its type and stack, never its message, and the client gets INTERNAL with nothing spent."""
    import recsvc.service.batch as batch_module
    import recsvc.service.requests as requests_module

    def failing_rows(valid, rng):
        raise RuntimeError(f"cannot select from {valid[0].q.tolist()}")

    def failing_draw(v, rng):
        raise RuntimeError(f"cannot select from {v.q.tolist()}")

    monkeypatch.setattr(requests_module, "draw_slate", failing_draw)
    monkeypatch.setattr(batch_module, "draw_rows", failing_rows)  # SelectBatch's draw of its rnm items
    scores = [("it1", 0.5918273645), ("it2", 0.25)]
    with caplog.at_level(logging.DEBUG):
        h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=3.0))
        try:
            with Client(f"127.0.0.1:{h.port}", retries=0) as c:
                with pytest.raises(grpc.RpcError) as info:
                    c.select("err-user", scores, mechanism="rnm", epsilon=0.1)
                code, msg = info.value.code(), info.value.details()
                [res] = c.select_batch([c.select_request("err-user", scores, mechanism="rnm", epsilon=0.1)])
            assert h.ledger.totals() == {}
        finally:
            h.stop(1)
    assert code is grpc.StatusCode.INTERNAL and "5918273645" not in msg
    assert res.error.code_name == "INTERNAL" and "5918273645" not in res.error.message
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all("RuntimeError (message withheld)" in r.getMessage() for r in errors)
    assert "failing_draw" in errors[0].getMessage()  # the stack is kept
    text = "\n".join(r.getMessage() + " " + (r.exc_text or "") for r in caplog.records)
    assert "5918273645" not in text


def test_prepared_requests_keep_user_data_out_of_repr(artifact: Path, tmp_path: Path) -> None:
    from recsvc.artifact import load_artifact
    from recsvc.ledger.sqlite import SQLiteLedger
    from recsvc.service.config import SelectorConfig
    from recsvc.service.servicer import SelectionServicer
    from recsvc.v1 import selection_pb2 as pb

    ledger = SQLiteLedger(tmp_path / "l.db", 3.0)
    try:
        servicer = SelectionServicer(load_artifact(artifact), ledger, SelectorConfig())
        req = pb.SelectRequest(
            user_id="u", mechanism="rnm", epsilon=0.5, item_ids=["it1", "it2"], scores=[0.5918273645, 0.25]
        )
        p = servicer.prepare_select(req)
    finally:
        ledger.close()
    assert p.scores.size == 2 and "user_id='u'" in repr(p)
    for secret in ("5918273645", "0.25", "it1", "sensitivities="):
        assert secret not in repr(p)
