"""`recsvc ledger export`: one Parquet row per charge, the same from both stores; atomic, no overwrite
without --force, nothing written on a failure."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.checks import ParamError
from recsvc.ledger import BudgetExceeded
from recsvc.ledger import export as ledger_export
from recsvc.ledger.export import COLUMNS, export
from recsvc.ledger.postgres import schema as ledger_pg_schema
from recsvc.ledger.sqlite import schema as ledger_schema
from recsvc.ledger.testing import Clock, Stores, resp
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import candidates, free_port, item_ids

T0 = 1_700_000_000.123456  # 2023-11-14T22:13:20.123456Z


def _charge_some(stores: Stores) -> list[tuple[str, str, str, float, datetime]]:
    """Five charges at known times (and a replay and a refusal that add no row); the rows expected."""
    clock = Clock(T0)
    led = stores.open(budget=1.0, clock=clock)
    plan = [
        ("alice", "r1", "rnm", 0.1),
        ("alice", "r2", "gem", 0.25),
        ("bob", "b1", "pf", 1e-12),
        ("bob", "b2", "combined_gem", 0.999999999999),
        ("carol", "c1", "", 0.3),
    ]
    for i, (user, rid, mech, eps) in enumerate(plan):
        clock.now = T0 + 3600 * i
        led.charge(user, rid, f"d-{rid}".encode(), eps, resp(rid), mechanism=mech)
    assert led.charge("alice", "r1", b"d-r1", 0.1, resp("again"), mechanism="rnm").replayed
    with pytest.raises(BudgetExceeded):
        led.charge("bob", "b3", b"d-b3", 0.5, resp("no"), mechanism="rnm")
    return [(u, r, m, e, datetime.fromtimestamp(T0 + 3600 * i, UTC)) for i, (u, r, m, e) in enumerate(plan)]


def test_export_writes_exactly_the_charges(stores: Stores, tmp_path: Path) -> None:
    want = _charge_some(stores)
    out = tmp_path / "charges.parquet"
    assert export(stores.target, out, chunk=2, progress=False) == 5
    f = pq.ParquetFile(out)
    assert tuple(f.schema_arrow.names) == COLUMNS == ("user_id", "request_id", "mechanism", "epsilon", "time")
    assert str(f.schema_arrow.field("time").type) == "timestamp[us, tz=UTC]"
    assert f.metadata.num_row_groups == 3  # chunks of 2: streamed, one row group per chunk
    got = [tuple(r.values()) for r in f.read().to_pylist()]
    assert got == want  # exact: ε is the charged units ÷ 10¹², the time the clock's, to the µs
    assert got[3][3] == 0.999999999999 and got[2][3] == 1e-12
    assert not {"fingerprint", "response", "scores", "item_id"} & set(f.schema_arrow.names)
    raw = out.read_bytes()
    assert b"d-r1" not in raw and b"r1|" not in raw  # neither the digest's key material nor an answer
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_the_service_stores_each_answer_s_mechanism(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Select, SelectBatch (one transaction) and Recommend pass the mechanism they answered with."""
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=10.0))
    try:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            c.select("u", candidates(), mechanism="gem", epsilon=0.5, request_id="s1")
            c.select_batch(
                [
                    c.select_request("u", candidates(), mechanism=m, epsilon=0.25, request_id=f"b-{m}")
                    for m in ("rnm", "pf")
                ]
            )
            rec = c.recommend("u", item_ids()[:2], mechanism="auto", epsilon=1.0, request_id="rec")
    finally:
        h.stop(1)
    out = tmp_path / "c.parquet"
    capsys.readouterr()
    assert recsvc_main(["ledger", "export", "--ledger", str(tmp_path / "l.db"), "--out", str(out)]) == 0
    assert f"wrote 4 charge(s) of {tmp_path / 'l.db'} to {out}" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert [(r["request_id"], r["mechanism"], r["epsilon"]) for r in rows] == [
        ("b-pf", "pf", 0.25),
        ("b-rnm", "rnm", 0.25),
        ("rec", rec.mechanism, 1.0),
        ("s1", "gem", 0.5),
    ]
    assert rec.mechanism in {"rnm", "gem", "mgem", "combined_gem", "pf", "em", "rnm_laplace"}


def test_overwrite_needs_force_and_bad_input_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    s = Stores(tmp_path / "l.db", tmp_path / "l.key")
    led = s.open(budget=1.0)
    led.charge("u", "r1", b"d", 0.5, resp("a"), mechanism="rnm")
    out = tmp_path / "c.parquet"
    argv = ["ledger", "export", "--ledger", str(s.target), "--out", str(out)]
    assert recsvc_main(argv) == 0
    before = out.read_bytes()
    led.charge("u", "r2", b"e", 0.25, resp("b"), mechanism="pf")
    capsys.readouterr()
    assert recsvc_main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"recsvc ledger: error: --out {out} already exists; nothing was written (pass --force to replace it)"
    )
    assert out.read_bytes() == before and pq.read_table(out).num_rows == 1
    assert recsvc_main([*argv, "--force"]) == 0, capsys.readouterr().err
    assert pq.read_table(out).column("epsilon").to_pylist() == [0.5, 0.25]
    s.close_all()
    capsys.readouterr()
    assert (
        recsvc_main(["ledger", "export", "--ledger", str(tmp_path / "nope.db"), "--out", str(tmp_path / "n.parquet")])
        == 2
    )
    assert f"--ledger {tmp_path / 'nope.db'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope.db").exists() and not (tmp_path / "n.parquet").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(ParamError, match="holds no recsvc ledger"):
        export(tmp_path / "empty.db", tmp_path / "e.parquet")
    with pytest.raises(ParamError, match=r"directory .* does not exist"):
        export(s.target, tmp_path / "no-dir" / "c.parquet")
    with pytest.raises(ParamError, match="is a directory"):
        export(s.target, tmp_path)
    port = free_port()
    down = ["ledger", "export", "--ledger", f"postgresql://a:pw9secret@127.0.0.1:{port}/db"]
    with caplog.at_level(logging.DEBUG):  # what a process would also log to its stderr
        assert recsvc_main([*down, "--out", str(tmp_path / "pg.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}/db" in err and "pw9secret" not in err + caplog.text, err
    assert not any(p.suffix in (".parquet", ".tmp") for p in tmp_path.iterdir() if p.name != "c.parquet")


def test_a_postgresql_database_without_a_ledger_is_a_clear_error(
    pg_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pg_cluster.new_database()
    assert recsvc_main(["ledger", "export", "--ledger", url, "--out", str(tmp_path / "c.parquet")]) == 2
    assert "holds no recsvc ledger yet" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failure_mid_way_leaves_no_file(stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite: the reader fails after the first chunk; PostgreSQL: the server kills the export's
    connection after the first chunk (a real failure of the server-side cursor)."""
    _charge_some(stores)
    pg = not isinstance(stores.target, Path)
    module = ledger_pg_schema if pg else ledger_schema
    real = module.read_charges

    @contextmanager
    def failing(target, chunk):
        with real(target, chunk) as (total, chunks):

            def rows():
                yield next(chunks)
                if pg:
                    with psycopg.connect(str(stores.target), autocommit=True) as conn:
                        conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                else:
                    raise OSError("disk went away")
                yield from chunks

            yield total, rows()

    monkeypatch.setattr(module, "read_charges", failing)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "c.parquet"
    with pytest.raises((OSError, psycopg.OperationalError)):
        export(stores.target, out, chunk=2, progress=False)
    assert list(out.parent.iterdir()) == []  # neither the file nor its temporary
    out.write_bytes(b"the previous export")
    with pytest.raises((OSError, psycopg.OperationalError)):
        export(stores.target, out, force=True, chunk=2, progress=False)
    assert out.read_bytes() == b"the previous export" and [p.name for p in out.parent.iterdir()] == ["c.parquet"]
    monkeypatch.setattr(module, "read_charges", real)
    assert export(stores.target, out, force=True, progress=False) == 5
    assert tuple(pq.read_table(out).column_names) == ledger_export.COLUMNS
