"""The ledger's refusals. Each names its gRPC status as a plain string (``status``, the NAME of a
``grpc.StatusCode`` member), so the service maps any of them with one lookup and the ledger never
imports grpc. :class:`recsvc.ledger.units.InvalidCharge` (INVALID_ARGUMENT) is the one refusal
raised before the ledger is touched; it lives with the unit conversion that raises it.
"""

from __future__ import annotations

from typing import ClassVar

from recsvc.ledger.units import format_units


class LedgerError(Exception):
    """Base class of the ledger's refusals (nothing was spent)."""

    status: ClassVar[str] = "INTERNAL"


class LedgerUnavailable(LedgerError):
    """The ledger's database cannot be reached. A charge whose COMMIT was not confirmed may or may
    not have been stored: a retry with the same request_id finds out."""

    status: ClassVar[str] = "UNAVAILABLE"


class WouldWait(LedgerError):
    """A commit asked not to wait (:func:`recsvc.ledger.base.without_waiting`) found the write
    lock held by another process or thread; nothing was stored or spent. The caller retries where
    waiting is harmless (the service: in a request thread, never on the event loop)."""

    status: ClassVar[str] = "UNAVAILABLE"


class BudgetExceeded(LedgerError):
    """The charge does not fit what the user has left in the current budget window."""

    status: ClassVar[str] = "RESOURCE_EXHAUSTED"

    def __init__(self, user_id: str, units: int, spent_units: int, budget_units: int) -> None:
        self.user_id, self.units, self.spent_units, self.budget_units = user_id, units, spent_units, budget_units
        super().__init__(
            f"privacy budget exhausted for user {user_id!r}: requested epsilon={format_units(units)} but only "
            f"{format_units(max(budget_units - spent_units, 0))} of {format_units(budget_units)} remains; "
            "nothing was spent"
        )


class RequestConflict(LedgerError):
    """The (user_id, request_id) was stored with another fingerprint: a retry must repeat the request."""

    status: ClassVar[str] = "ALREADY_EXISTS"

    def __init__(self, user_id: str, request_id: str) -> None:
        super().__init__(
            f"request_id {request_id!r} was already used for user {user_id!r} with different "
            "parameters; a retry must repeat the request exactly, a new request needs a new request_id"
        )
