"""What both stores' migrations share: recovering the mechanism of charges stored without one.

Ledgers written before charges stored their mechanism (SQLite file version 1, PostgreSQL schema
version 1) hold it only inside each stored answer. The answer's format belongs to whoever built
it (the service's ``SelectResponse``), so the ledger asks a :data:`MechanismOf` callable, given
when the store is opened; without one, those charges keep the mechanism ''.
"""

from __future__ import annotations

from collections.abc import Callable

# A stored answer → the mechanism it names ('' if it names none or cannot be read).
MechanismOf = Callable[[bytes], str]


def recover_mechanisms(
    page: Callable[[tuple[str, str] | None], list[tuple[str, str, bytes]]],
    update: Callable[[list[tuple[str, str, str]]], None],
    mechanism_of: MechanismOf | None,
) -> int:
    """Fills in the mechanism of every request stored without one, page by page in key order
    (``page(after)``: the next rows with mechanism '' after the key ``after``; ``update`` stores
    ``(mechanism, user_id, request_id)``); the number of requests updated."""
    if mechanism_of is None:
        return 0
    after: tuple[str, str] | None = None
    done = 0
    while rows := page(after):
        found = [(m, u, r) for u, r, resp in rows if (m := mechanism_of(bytes(resp)))]
        if found:
            update(found)
        done += len(found)
        after = (rows[-1][0], rows[-1][1])
    return done
