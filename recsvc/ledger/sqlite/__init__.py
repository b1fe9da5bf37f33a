"""The embedded SQLite store (the default): :class:`SQLiteLedger` in :mod:`.store`, the file
format and its migrations in :mod:`.schema`."""

from recsvc.ledger.sqlite.files import check_path, remove_files
from recsvc.ledger.sqlite.store import SQLiteLedger

__all__ = ["SQLiteLedger", "check_path", "remove_files"]
