"""The SQLite ledger's files on disk: what a ledger path may be, and the modes of the file and its
sidecars (``-wal``, ``-shm``), which hold the latest answers and so must not be readable by others."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from recsvc.checks import MissingFileError, ParamError, check_regular_file

log = logging.getLogger("recsvc.ledger")

_SQLITE_MAGIC = b"SQLite format 3\x00"
WRITTEN = "an SQLite ledger written by `recsvc serve`"
EXPECTED = WRITTEN + ", or a new file path in an existing, writable directory"
SIDECARS = ("-wal", "-shm", "-journal", ".lock")
CANNOT_OPEN = " cannot be opened as an SQLite ledger ({reason})"


def refused(path: Path, what: str, **values: object) -> ParamError:
    """The refusal of the ledger path ``path``: ``{ledger} <path><what>; expected`` what it may be."""
    return ParamError("{ledger} {path}" + what + "; expected {expected}", path=str(path), expected=EXPECTED, **values)


def check_path(path: str | os.PathLike[str]) -> None:
    """Refuses, before anything is created, a ledger path that cannot be an SQLite ledger."""
    p = Path(path)
    if p.exists():
        check_regular_file("{ledger}", p, EXPECTED)
        try:
            with open(p, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise refused(p, " cannot be read ({reason})", reason=exc.strerror) from None
        if head and head != _SQLITE_MAGIC:
            raise refused(p, " is not an SQLite database")
        return
    if not p.parent.is_dir():
        raise MissingFileError(
            "ledger directory {dir} does not exist; create it first ({ledger} {path})", dir=str(p.parent), path=str(p)
        )
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise refused(p, ": the directory {dir} is not writable", dir=str(p.parent))


def create_private(path: Path) -> None:
    """Creates a missing ledger file with mode 0600 before SQLite opens it: SQLite gives the
    ``-wal`` and ``-shm`` files the mode of the database file, so none of them is readable by others."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:  # a special file system, a read-only mount, ...
        raise refused(path, CANNOT_OPEN, reason=exc.strerror or str(exc)) from None


def private_sidecars(path: Path, warn: bool = True) -> None:
    """Makes the ``-wal`` and ``-shm`` files mode 0600: SQLite creates them with the database
    file's mode, so a ledger file that others can read would otherwise get sidecars, holding the
    latest answers, that others can read too; and each new connection gives an EMPTY one the file's
    mode again. So it runs before SQLite opens the file (a missing one is created empty: an empty
    WAL holds no frames, SQLite initialises the shared-memory file) and after each connection the
    store opens, before anything is written; an existing one is narrowed. SQLite leaves the mode of
    a WAL that holds frames alone. ``warn``: a ledger file others can read is logged."""
    mode = path.stat().st_mode & 0o777
    if warn and mode & 0o077:
        log.warning(
            "the ledger %s has mode %s: other users can read its answers and account balances; "
            "expected 0600 (chmod 600 %s); its -wal and -shm files are kept 0600",
            path,
            oct(mode),
            path,
        )
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        try:
            os.close(os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            if side.stat().st_mode & 0o077:
                try:
                    os.chmod(side, 0o600)
                except PermissionError:  # another user's file: SQLite's own checks decide
                    log.warning("the ledger's %s is readable by others and not ours to narrow", side)


def check_foreign(path: Path) -> None:
    """Refuses another application's SQLite file, read-only (before WAL mode would modify it)."""
    if not (path.is_file() and path.stat().st_size > 0):
        return
    ro = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        tables = {r[0] for r in ro.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        ro.close()
    if tables and "budgets" not in tables:
        raise refused(
            path, " is an SQLite database of something else (tables: {tables})", tables=", ".join(sorted(tables)[:5])
        )


def remove_files(path: str | os.PathLike[str]) -> None:
    """Deletes a ledger and its sidecar files (-wal, -shm, .lock). Only for a ledger this process
    just created and never answered from: deleting a used ledger would forget spent budget."""
    p = Path(path)
    for f in (p, *(p.with_name(p.name + suffix) for suffix in SIDECARS)):
        f.unlink(missing_ok=True)
