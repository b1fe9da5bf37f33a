"""A bad `serve` or client configuration is one clear ValueError that changes nothing:
no ledger file created, an existing ledger untouched, no orphaned worker left behind."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.checks import ParamError
from recsvc.ledger import Drawn
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.service import cli as service_cli
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import REPO, candidates, free_port


@pytest.fixture(scope="module")
def certs(certs: dict[str, Path]) -> dict[str, Path]:
    """The shared certificates plus a PEM file whose body is not base64."""
    garbage = certs["ca.pem"].parent / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    return {**certs, "garbage.pem": garbage}


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _ledger_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("l.db"))


# (case, ServerConfig overrides, message the error must contain, the same from `recsvc serve` if it
# names parameters: the library names ServerConfig's parameters, the command line its flags)
BAD_SERVE = [
    (
        "busy port",
        {"port": "BUSY"},
        r"cannot listen on 127\.0\.0\.1:\d+: Address already in use; expected a free port",
        r"cannot listen on 127\.0\.0\.1:\d+: Address already in use; expected a free --port",
    ),
    (
        "bad host",
        {"host": "999.1.1.1"},
        r"cannot listen on 999\.1\.1\.1:0: .*expected a free port \(0\.\.65535\) and a host ",
        r"cannot listen on 999\.1\.1\.1:0: .*expected a free --port \(0\.\.65535\) and a --host ",
    ),
    (
        "garbage cert",
        {"tls_cert": "garbage.pem", "tls_key": "server.key"},
        r"^tls_cert/tls_key .*not a valid PEM",
        r"--tls-cert/--tls-key .*not a valid PEM",
    ),
    (
        "mismatched key",
        {"tls_cert": "server.pem", "tls_key": "rogue.key"},
        r"not a valid PEM .*KEY_VALUES_MISMATCH",
        None,
    ),
    (
        "swapped cert/key",
        {"tls_cert": "server.key", "tls_key": "server.pem"},
        r"expected the certificate in the first",
        None,
    ),
    (
        "garbage client CA",
        {"tls_cert": "server.pem", "tls_key": "server.key", "client_ca": "garbage.pem"},
        r"^client_ca .* is not a valid PEM certificate",
        r"--client-ca .* is not a valid PEM certificate",
    ),
    (
        "metrics port -1",
        {"metrics_port": -1},
        r"^metrics_port must be an integer in \[0, 65535\], got -1",
        r"--metrics-port must be an integer in \[0, 65535\], got -1",
    ),
    (
        "metrics port == port",
        {"port": 47123, "metrics_port": 47123},
        r"^metrics_port must differ from port",
        r"--metrics-port must differ from --port",
    ),
    (
        "metrics port busy",
        {"metrics_port": "BUSY"},
        r"cannot serve metrics on 127\.0\.0\.1:\d+ \(Address already in use\); "
        r"expected metrics_port .*\(not port\) and metrics_host ",
        r"cannot serve metrics on 127\.0\.0\.1:\d+ \(Address already in use\); expected --metrics-port .*\(not --port\) "
        r"and --metrics-host ",
    ),
    ("unknown default mechanism", {"default_mechanism": "foo"}, r"unknown mechanism 'foo'; expected one of", None),
    ("rnmh without opt-in", {"default_mechanism": "rnmh"}, r"not differentially private .*--allow-non-private", None),
    ("max batch -1", {"max_batch": -1}, r"^max_batch must be an integer ≥ 1", r"--max-batch must be an integer ≥ 1"),
    ("max batch 0", {"max_batch": 0}, r"^max_batch must be an integer ≥ 1", r"--max-batch must be an integer ≥ 1"),
    ("max slate 0", {"max_slate": 0}, r"^max_slate must be an integer ≥ 1", r"--max-slate must be an integer ≥ 1"),
    (
        "min candidates 0",
        {"min_candidates": 0},
        r"^min_candidates must be an integer ≥ 1",
        r"--min-candidates must be an integer ≥ 1",
    ),
    (
        "artifacts is a file",
        {"artifacts": "FILE"},
        r"^artifacts .* is a file; expected an artifact directory",
        r"--artifacts .* is a file; expected an artifact directory",
    ),
    (
        "workers > 1 on port 0",
        {"workers": 2},
        r"^workers > 1 needs an explicit port \(not 0\)",
        r"--workers > 1 needs an explicit --port \(not 0\)",
    ),
    (
        "cert without key",
        {"tls_cert": "server.pem"},
        r"^TLS needs both tls_cert and tls_key$",
        r"TLS needs both --tls-cert and --tls-key$",
    ),
    (
        "client CA without TLS",
        {"client_ca": "ca.pem"},
        r"^client_ca needs tls_cert and tls_key \(mTLS runs over TLS\)$",
        r"--client-ca needs --tls-cert and --tls-key \(mTLS runs over TLS\)$",
    ),
    (
        "budget nan",
        {"budget": float("nan")},
        r"^budget must be a finite number > 0, got nan",
        r"--budget must be a finite number > 0, got nan",
    ),
    (
        "rate limit -1",
        {"rate_limit": -1.0},
        r"^rate_limit must be a finite number ≥ 0, got -1$",
        r"--rate-limit must be a finite number ≥ 0",
    ),
    (
        "default candidate mechanism rnm",
        {"default_candidate_mechanism": "rnm"},
        r"^default_candidate_mechanism must be one of oneshot, gumbel, clm \(a one-shot top-k mechanism\), got 'rnm'",
        r"--default-candidate-mechanism must be one of oneshot, gumbel, clm",
    ),
    (
        "max history 0",
        {"max_history": 0},
        r"^max_history must be an integer ≥ 1, got 0",
        r"--max-history must be an integer ≥ 1, got 0",
    ),
    (
        "ready file in a missing directory",
        {"ready_file": Path("/nonexistent-dir/ready")},
        r"^ready_file /nonexistent-dir/ready: its directory does not exist",
        r"--ready-file /nonexistent-dir/ready: its directory does not exist",
    ),
    (
        "max message bytes 10",
        {"max_message_bytes": 10},
        r"^max_message_bytes must be an integer in \[1024, 2147483647\], got 10",
        r"--max-message-bytes must be an integer in \[1024, 2147483647\], got 10",
    ),
    (
        "client scopes without mTLS",
        {"client_scopes": "ca.pem"},
        r"^client_scopes needs client_ca \(certificate scopes",
        r"--client-scopes needs --client-ca \(certificate scopes",
    ),
    (
        "bad client scopes file",
        {"tls_cert": "server.pem", "tls_key": "server.key", "client_ca": "ca.pem", "client_scopes": "garbage.pem"},
        r"client scopes file .*garbage\.pem line 1: expected lines '<identity> <scope>'",
        r"client scopes file .*garbage\.pem line 1: expected lines '<identity> <scope>'",
    ),
]


def _serve_values(overrides: dict, artifact: Path, certs: dict[str, Path], busy_port: int) -> dict:
    values: dict = {}
    for k, v in overrides.items():
        if v == "BUSY":
            v = busy_port
        elif v == "FILE":
            v = artifact / "manifest.json"
        elif k in ("tls_cert", "tls_key", "client_ca", "client_scopes"):
            v = certs[v]
        values[k] = v
    return values


@pytest.mark.parametrize("case,overrides,message,cli_message", BAD_SERVE, ids=[c[0] for c in BAD_SERVE])
def test_bad_serve_config_is_a_clear_error_and_creates_no_ledger(
    case: str,
    overrides: dict,
    message: str,
    cli_message: str | None,
    artifact: Path,
    certs: dict[str, Path],
    busy_port: int,
    tmp_path: Path,
) -> None:
    values = _serve_values(overrides, artifact, certs, busy_port)
    config = ServerConfig.of(**{"artifacts": artifact, "port": 0, "ledger": tmp_path / "l.db", **values})
    with pytest.raises(ValueError, match=message):
        start(config)
    assert _ledger_files(tmp_path) == []


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    """`recsvc serve` run in-process installs SIGTERM/SIGINT handlers: give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


CLI_SERVE = [c for c in BAD_SERVE if c[3] is not None]


@pytest.mark.parametrize(
    "case,overrides,cli_message", [(c, o, m) for c, o, _, m in CLI_SERVE], ids=[c[0] for c in CLI_SERVE]
)
def test_bad_serve_flags_are_one_line_naming_the_flag(
    case: str,
    overrides: dict,
    cli_message: str,
    artifact: Path,
    certs: dict[str, Path],
    busy_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    keep_signal_handlers: None,
) -> None:
    values = {"port": 0, **_serve_values(overrides, artifact, certs, busy_port)}
    argv = ["serve", "--artifacts", str(values.pop("artifacts", artifact)), "--ledger", str(tmp_path / "l.db")]
    for k, v in values.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert recsvc_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("recsvc serve: error: ") and re.search(cli_message, err), err
    assert _ledger_files(tmp_path) == []


@pytest.mark.parametrize("via", ["library", "cli"])
@pytest.mark.parametrize("kind", ["directory", "not sqlite", "other sqlite db", "unopenable", "no directory"])
def test_bad_ledger_path_names_ledger_and_changes_nothing(
    kind: str, via: str, artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], keep_signal_handlers: None
) -> None:
    """The library names the parameter (``ledger``), `recsvc serve` the flag (``--ledger``)."""
    path = tmp_path / "l.db"
    if kind == "directory":
        path.mkdir()
        message = r"LEDGER .* is a directory or not a regular file; expected an SQLite ledger"
    elif kind == "not sqlite":
        path.write_bytes(bytes(range(256)))
        message = r"LEDGER .* is not an SQLite database; expected an SQLite ledger"
    elif kind == "other sqlite db":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE photos (id INTEGER)")
        conn.close()
        message = r"LEDGER .* is an SQLite database of something else \(tables: photos\)"
    elif kind == "unopenable":
        path = Path("/proc/recsvc-ledger-test.db")  # /proc accepts no new files, even for root
        message = r"LEDGER /proc/recsvc-ledger-test\.db cannot be opened as an SQLite ledger"
    else:
        path = tmp_path / "missing" / "l.db"
        message = r"ledger directory .*missing does not exist; create it first \(LEDGER .*missing/l\.db\)"
    before = sorted(os.listdir(tmp_path))
    snapshot = path.read_bytes() if path.is_file() else None
    if via == "library":
        with pytest.raises(ValueError, match=message.replace("LEDGER", "ledger")):
            start(ServerConfig.of(artifacts=artifact, port=0, ledger=path))
    else:
        assert recsvc_main(["serve", "--artifacts", str(artifact), "--port", "0", "--ledger", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(
            "^recsvc serve: error: .*" + message.replace("LEDGER", "--ledger"), err
        ), err
    assert sorted(os.listdir(tmp_path)) == before
    if snapshot is not None:
        assert path.read_bytes() == snapshot
    assert not Path("/proc/recsvc-ledger-test.db").exists()


def test_failed_start_keeps_an_existing_ledger_and_removes_only_a_new_one(
    artifact: Path, tmp_path: Path, busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "l.db"
    led = SQLiteLedger(path, budget=10.0)
    led.charge("u", "r1", b"f", 1.5, Drawn(("answer",)))
    led.close()
    with pytest.raises(ValueError, match="Address already in use"):
        start(ServerConfig.of(artifacts=artifact, port=busy_port, ledger=path))
    # A failure AFTER the ledger was opened (here: the health service) must not delete it either...
    from grpc_health.v1 import health

    def broken(*_a: object) -> None:
        raise RuntimeError("health service broke")

    monkeypatch.setattr(health.aio.HealthServicer, "set", broken)  # the server's (asyncio) health servicer
    with pytest.raises(RuntimeError, match="health service broke"):
        start(ServerConfig.of(artifacts=artifact, port=0, ledger=path))
    assert SQLiteLedger(path, budget=10.0).totals() == {"u": pytest.approx(1.5)}
    # ...while a ledger that this failed start created is removed with its -wal/-shm/.lock files.
    with pytest.raises(RuntimeError, match="health service broke"):
        start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "new.db"))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("new.db")]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--tls-key", "client.key"], r"needs both --tls-cert and --tls-key \(got only --tls-key\)"),
        (["--tls-cert", "client.pem"], r"needs both --tls-cert and --tls-key \(got only --tls-cert\)"),
        (["--timeout", "-1"], r"--timeout must be a finite number of seconds > 0, got -1"),
        (["--timeout", "nan"], r"--timeout must be a finite number of seconds > 0, got nan"),
        (
            ["--target", "127.0.0.1:99999"],
            r"--target '127\.0\.0\.1:99999': expected HOST:PORT with a port in 1\.\.65535",
        ),
        (["--target", "localhost"], r"expected HOST:PORT"),
        (["--tls-ca", "garbage.pem"], r"--tls-ca .* is not a valid PEM certificate"),
        (["--tls-ca", "DIR"], r"CA file .* is a directory or not a regular file; expected a PEM file"),
        (
            ["--token-file", "DIR"],
            r"token file .* is a directory or not a regular file; expected lines '<token> <scope>'",
        ),
    ],
)
@pytest.mark.parametrize("command", ["select", "budget"])
def test_bad_client_flags_are_refused_before_any_call(
    command: str,
    extra: list[str],
    message: str,
    certs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = [str(tmp_path) if a == "DIR" else str(certs[a]) if a in certs else a for a in extra]
    argv = [command, "--target", "127.0.0.1:1", "--user", "u", *extra]
    if command == "select":
        argv += ["--epsilon", "0.5", "--candidate", "it1:0.5"]
    assert recsvc_main(argv) == 2  # through the command, which shows the library's parameters as flags
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"recsvc {command}: error: ") and re.search(message, err), err


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"tls_key": "client.key"}, r"^a client certificate needs both tls_cert and tls_key \(got only tls_key\)"),
        ({"tls_cert": "client.pem"}, r"^a client certificate needs both tls_cert and tls_key \(got only tls_cert\)"),
        ({"timeout": -1}, r"^timeout must be a finite number of seconds > 0, got -1$"),
        ({"timeout": float("nan")}, r"^timeout must be a finite number of seconds > 0, got nan$"),
        ({"tls_ca": "garbage.pem"}, r"^tls_ca .*garbage\.pem is not a valid PEM certificate"),
        (
            {"tls_cert": "garbage.pem", "tls_key": "client.key"},
            r"^tls_cert/tls_key .*garbage\.pem / .*client\.key: not a valid PEM",
        ),
    ],
)
def test_client_errors_name_its_parameters(kwargs: dict, message: str, certs: dict[str, Path]) -> None:
    kwargs = {k: certs[v] if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(ParamError, match=message):
        Client("127.0.0.1:1", **kwargs)


def test_candidates_file_of_the_wrong_kind(tmp_path: Path) -> None:
    binary = tmp_path / "c.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 50)
    with pytest.raises(ValueError, match=r"is not UTF-8 text; expected a CSV of item_id,score"):
        service_cli.read_candidates_csv(binary)
    with pytest.raises(ValueError, match=r"is a directory or not a regular file; expected a CSV of item_id,score"):
        service_cli.read_candidates_csv(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        service_cli.read_candidates_csv(tmp_path / "nope.csv")
    good = tmp_path / "c.csv"
    good.write_text("item_id,score\nit1,0.5\nit2,0.25\n")
    assert service_cli.read_candidates_csv(good) == [("it1", 0.5), ("it2", 0.25)]


def test_a_good_start_still_serves(artifact: Path, tmp_path: Path) -> None:
    from recsvc.service.client import Client

    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", metrics_port=0))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            assert c.select("u", candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == pytest.approx(0.5)
        assert h.metrics_port and h.metrics_port != h.port
    finally:
        h.stop(1)
    with socket.socket() as s:  # stop() also closed the metrics port
        assert s.connect_ex(("127.0.0.1", h.metrics_port)) != 0
    assert SQLiteLedger(tmp_path / "l.db", budget=10.0).totals() == {"u": pytest.approx(0.5)}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_an_ipv6_host_is_bracketed_and_serves(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from recsvc.service.config import host_port

    assert (host_port("::1", 50051), host_port("127.0.0.1", 1)) == ("[::1]:50051", "127.0.0.1:1")
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", host="::1"))
    try:
        with Client(f"[::1]:{h.port}") as c:
            assert c.select("u", candidates(), mechanism="rnm", epsilon=0.25).epsilon_spent == pytest.approx(0.25)
    finally:
        h.stop(1)
    with pytest.raises(ValueError, match=r"cannot listen on \[::1\]:\d+: "), socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        s.listen()
        start(ServerConfig.of(artifacts=artifact, port=s.getsockname()[1], ledger=tmp_path / "l2.db", host="::1"))


def test_worker_startup_error_is_one_clear_line_and_creates_no_ledger(artifact: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "recsvc.app.cli",
        "serve",
        "--artifacts",
        str(artifact),
        "--ledger",
        str(tmp_path / "l.db"),
        "--port",
        str(free_port()),
        "--workers",
        "2",
        "--default-mechanism",
        "foo",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown mechanism 'foo'; expected one of" in r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr
    assert _ledger_files(tmp_path) == []


def test_serve_has_a_flag_for_every_setting() -> None:
    """SERVE_FLAGS orders `serve`'s flags: a setting left out of it would have none."""
    from recsvc.settings import settings_of

    flags = ["artifacts", "host", *service_cli.SERVE_FLAGS]
    assert sorted(flags) == sorted(d.name for d in settings_of(ServerConfig))
