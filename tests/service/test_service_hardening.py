"""The second review's hardening, through the real channels: the pinned budget of `recsvc serve`
processes, file modes, typed SAN rules, user_id normalisation and the startup and outage messages."""

from __future__ import annotations

import json
import logging
import os
import stat
import unicodedata
from collections.abc import Callable
from pathlib import Path

import grpc
import psycopg
import pyarrow.parquet as pq
import pytest

from recsvc.app.cli import main
from recsvc.ledger.postgres import PostgresLedger
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.service.client import Client
from recsvc.service.testing import (
    candidates,
    make_client_cert,
    rpc_error,
    select_request,
    served,
    server_process,
)
from recsvc.v1 import selection_pb2_grpc


def test_two_serves_on_one_sqlite_ledger_must_share_its_budget(
    artifact: Path, tmp_path: Path, one_line_error: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "l.db"
    serve = ["serve", "--artifacts", str(artifact), "--ledger", str(ledger), "--port", "0"]
    with server_process(artifact, ledger, "--budget", "1") as first:
        with Client(first.target) as c:
            c.select("alice", candidates(), mechanism="rnm", epsilon=1.0)
        capsys.readouterr()
        assert main([*serve, "--budget", "5"]) == 2  # a second serve (its main, here) beside the running one
        one_line_error(r"--budget 5 differs from the budget ε=1 that the ledger.*set-budget")
    # The one way to change it: an explicit command, recorded in the ledger and in its export.
    assert main(["ledger", "set-budget", "--ledger", str(ledger), "--budget", "5"]) == 0
    assert "budget ε=1 -> ε=5 per user, recorded" in capsys.readouterr().out
    assert main([*serve, "--budget", "1"]) == 2
    one_line_error(r"--budget 1 differs from the budget ε=5 that the ledger")
    assert SQLiteLedger(ledger, 5.0).user("alice").remaining == 4.0
    out = tmp_path / "charges.parquet"
    assert main(["ledger", "export", "--ledger", str(ledger), "--out", str(out)]) == 0
    history = json.loads(pq.read_schema(out).metadata[b"recsvc.budget_changes"])
    assert [(h["old_budget"], h["new_budget"]) for h in history] == [("1", "5")]
    assert pq.read_table(out).num_rows == 1


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_ledger_its_sidecars_and_the_export_are_private_and_an_open_tls_key_is_warned_about(
    artifact: Path, tmp_path: Path, certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    old_umask = os.umask(0o022)  # the usual umask: files would be created 0644
    try:
        _check_private_files(artifact, tmp_path, certs, caplog)
    finally:
        os.umask(old_umask)


def _check_private_files(
    artifact: Path, tmp_path: Path, certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    key = tmp_path / "server.key"
    key.write_bytes(certs["server.key"].read_bytes())
    key.chmod(0o644)
    ledger = tmp_path / "l.db"
    with (
        caplog.at_level(logging.WARNING, logger="recsvc"),
        served(artifact, ledger, tls_cert=certs["server.pem"], tls_key=key) as h,
    ):
        creds = grpc.ssl_channel_credentials(certs["ca.pem"].read_bytes())
        with grpc.secure_channel(f"localhost:{h.port}", creds) as ch:
            stub = selection_pb2_grpc.PrivateSelectionStub(ch)
            stub.Select(select_request("u", "r1"), timeout=10)
        files = {p.name: _mode(p) for p in tmp_path.iterdir() if p.name.startswith("l.db")}
        assert {"l.db", "l.db-wal", "l.db-shm", "l.db.key"} <= files.keys()
        assert set(files.values()) == {0o600}, files
    assert f"{key} is open to group or other users; expected mode 0600" in caplog.text
    out = tmp_path / "charges.parquet"
    assert main(["ledger", "export", "--ledger", str(ledger), "--out", str(out)]) == 0
    assert _mode(out) == 0o600
    out.chmod(0o644)
    assert main(["ledger", "export", "--ledger", str(ledger), "--out", str(out), "--force"]) == 0
    assert _mode(out) == 0o600  # replaced by a private file


def test_san_rules_match_only_their_type(artifact: Path, tmp_path: Path, certs: dict[str, Path]) -> None:
    """A URI or e-mail SAN equal to a DNS rule's name gets nothing from it; the rule's type matches."""
    d = certs["ca.pem"].parent
    spoof = make_client_cert(d, "spoof", "URI:ops-console.internal,email:ops-console.internal")
    ops = make_client_cert(d, "ops", "DNS:Ops-Console.Internal")
    scopes = tmp_path / "scopes"
    scopes.write_text("dns:ops-console.internal admin\n")
    tls = dict(tls_cert=certs["server.pem"], tls_key=certs["server.key"], client_ca=certs["ca.pem"])
    with served(artifact, tmp_path / "l.db", client_scopes=scopes, **tls) as h:
        for (cert, key), allowed in ((spoof, False), (ops, True)):
            with Client(f"localhost:{h.port}", tls_ca=certs["ca.pem"], tls_cert=cert, tls_key=key, retries=0) as c:
                if allowed:
                    assert c.select("alice", candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == 0.5
                else:
                    code, _ = rpc_error(c.select, "alice", candidates(), mechanism="rnm", epsilon=0.5)
                    assert code is grpc.StatusCode.PERMISSION_DENIED
                    assert rpc_error(c.mechanisms)[0] is grpc.StatusCode.PERMISSION_DENIED
        assert h.ledger.totals() == {"alice": 0.5}
    scopes.write_text("san:ops-console.internal admin\n")  # the untyped form is refused at start
    with pytest.raises(ValueError, match=r"'san:ops-console.internal' names no SAN type.*'dns:ops-console.internal'"):
        with served(artifact, tmp_path / "l2.db", client_scopes=scopes, **tls):
            pass
    assert not (tmp_path / "l2.db").exists()


def test_an_outage_tells_getbudget_nothing_about_request_ids(artifact: Path, tmp_path: Path, pg_cluster) -> None:
    url, key = pg_cluster.new_database(), tmp_path / "k"
    PostgresLedger(url, 10.0, key, create=True).close()
    db = url.rsplit("/", 1)[1]
    with served(artifact, url, fingerprint_key=key) as h, Client(f"127.0.0.1:{h.port}", retries=0) as c:
        assert c.budget("u").remaining == 10.0
        with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:  # the database stops answering
            admin.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
        try:
            code, budget_message = rpc_error(c.budget, "u")
            assert code is grpc.StatusCode.UNAVAILABLE
            assert "is unavailable" in budget_message and "request_id" not in budget_message
            assert budget_message.endswith("nothing was read or changed; retry later"), budget_message
            code, select_message = rpc_error(c.select, "u", candidates(), mechanism="rnm", epsilon=0.5, request_id="r")
            assert code is grpc.StatusCode.UNAVAILABLE and "retry with the same request_id" in select_message
        finally:
            with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")


def test_user_ids_must_be_nfc_and_the_startup_log_says_whether_auth_is_on(
    artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nfc, nfd = unicodedata.normalize("NFC", "José"), unicodedata.normalize("NFD", "José")
    assert nfc != nfd
    tokens = tmp_path / "tokens"
    tokens.write_text(f"svc-token service\nuser-token user:{nfc}\n")
    tokens.chmod(0o600)
    with caplog.at_level(logging.INFO, logger="recsvc"), served(artifact, tmp_path / "l.db", token_file=tokens) as h:
        assert "auth bearer tokens (2)" in caplog.text
        with Client(f"127.0.0.1:{h.port}", token="svc-token", retries=0) as c:
            c.select(nfc, candidates(), mechanism="rnm", epsilon=1.0)
            code, message = rpc_error(c.select, nfd, candidates(), mechanism="rnm", epsilon=1.0)
            assert (
                code is grpc.StatusCode.INVALID_ARGUMENT
                and "user_id is not in Unicode normalization form NFC" in message
            )
            assert rpc_error(c.budget, nfd)[0] is grpc.StatusCode.INVALID_ARGUMENT
            batch = c.select_batch([select_request(nfd, "b1"), select_request(nfc, "b2")])
            assert [r.WhichOneof("outcome") for r in batch] == ["error", "response"]
            assert batch[0].error.code_name == "INVALID_ARGUMENT" and "NFC" in batch[0].error.message
        assert h.ledger.totals() == {nfc: 1.5}  # the NFD spelling got no budget of its own
    tokens.write_text(f"user-token user:{nfd}\n")
    with pytest.raises(ValueError, match="names a user_id that is not in Unicode NFC"):
        with served(artifact, tmp_path / "l2.db", token_file=tokens):
            pass
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="recsvc"), served(artifact, tmp_path / "l3.db"):
        assert "auth OFF: every caller is anonymous with admin scope" in caplog.text
