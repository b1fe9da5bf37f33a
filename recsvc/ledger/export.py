"""The audit export (`recsvc ledger export`): one Parquet row per charge, from either store.

Columns, exactly: ``user_id`` (string), ``request_id`` (string), ``mechanism`` (string; '' for a
charge whose stored answer named none), ``epsilon`` (float64: the charged units ÷ 10¹², the
nearest double of the exact charge) and ``time`` (timestamp[µs, UTC]: when the charge committed).
Never the fingerprint, the response, scores or items. Rows come in (user_id, request_id) order.
The file's metadata key ``recsvc.budget_changes`` holds the ledger's audited budget changes
(:mod:`recsvc.ledger.budget`) as a JSON list of ``{time, old_budget, new_budget, changed_by}``.

Each store provides ``read_charges(ledger, chunk)`` (:func:`recsvc.ledger.sqlite.schema.read_charges`,
:func:`recsvc.ledger.postgres.schema.read_charges`): the number of charges and the rows in chunks, read
on one snapshot (SQLite: chunked reads; PostgreSQL: a server-side cursor). Each chunk becomes one
Parquet row group, so the whole ledger is never in memory. The file is written to a temporary name
next to ``out`` and renamed only when complete: a failure leaves no file (and, with ``force``, the
existing one untouched); without ``force`` an existing ``out`` is refused before anything is read.
The file is created with mode 0600: it names users and what they were charged.
pyarrow is imported here only (the serving path never loads it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from recsvc.checks import MissingFileError, ParamError
from recsvc.ledger.base import is_postgres
from recsvc.ledger.charging import ChargeRow
from recsvc.ledger.units import to_epsilon

COLUMNS = ("user_id", "request_id", "mechanism", "epsilon", "time")
CHUNK = 65_536  # rows per read and per row group
METADATA_KEY = "recsvc.budget_changes"
_EXISTS = "{out} {path} already exists; nothing was written (pass {force} to replace it)"


def check_out(out: Path, force: bool) -> None:
    """Refuses, before the ledger is read, an ``out`` that cannot be written or is not to be overwritten."""
    if not out.parent.is_dir():
        raise MissingFileError(
            "{out} directory {dir} does not exist; create it first ({out} {path})", dir=str(out.parent), path=str(out)
        )
    if out.is_dir():
        raise ParamError("{out} {path} is a directory; expected a file name such as charges.parquet", path=str(out))
    if out.exists() and not force:
        raise ParamError(_EXISTS, path=str(out))


def _source(ledger: Path | str, chunk: int) -> AbstractContextManager[tuple[int, Iterator[list[ChargeRow]]]]:
    if is_postgres(ledger):
        from recsvc.ledger.postgres.schema import read_charges as read_pg

        return read_pg(str(ledger), chunk)
    from recsvc.ledger.sqlite.schema import read_charges

    return read_charges(Path(ledger), chunk)


def export(ledger: Path | str, out: Path, force: bool = False, chunk: int = CHUNK, progress: bool | None = None) -> int:
    """Writes every charge of ``ledger`` to the Parquet file ``out``; the number of charges."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsvc.engines import progress_bar

    out = Path(out)
    check_out(out, force)
    from recsvc.ledger import budget_changes

    changes = json.dumps([c.as_dict() for c in budget_changes(ledger)])
    schema = pa.schema(
        list(
            zip(
                COLUMNS,
                (pa.string(), pa.string(), pa.string(), pa.float64(), pa.timestamp("us", tz="UTC")),
                strict=True,
            )
        ),
        metadata={METADATA_KEY: changes},
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    written = 0
    try:
        tmp.unlink(missing_ok=True)  # a stale one from a killed run: its mode is not ours
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # personal data: owner only
        with (
            _source(ledger, chunk) as (total, chunks),
            pq.ParquetWriter(tmp, schema) as writer,
            progress_bar("export", "charge", total, None if progress is None else not progress) as bar,
        ):
            for rows in chunks:
                users, requests, mechanisms, units, micros = zip(*rows, strict=True)
                epsilons = [to_epsilon(u) for u in units]  # each column typed by the schema
                writer.write_table(pa.table([users, requests, mechanisms, epsilons, micros], schema=schema))
                written += len(rows)
                bar.update(len(rows))
        _publish(tmp, out, force)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Renames the finished file into place; without ``force``, never over a file created meanwhile."""
    if force:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)  # atomic, and fails if ``out`` appeared since check_out
    except FileExistsError:
        raise ParamError(_EXISTS, path=str(out)) from None
    tmp.unlink()
