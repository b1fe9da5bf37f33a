"""Every ledger refusal names its gRPC status as a plain string (the ledger never imports grpc),
and the name is the status the service answers with."""

from __future__ import annotations

import grpc
import pytest

from recsvc.ledger import BudgetExceeded, InvalidCharge, LedgerError, LedgerUnavailable, RequestConflict
from recsvc.service.interceptors import status_of

REFUSALS = [
    (BudgetExceeded("u", 2, 0, 1), "RESOURCE_EXHAUSTED"),
    (RequestConflict("u", "r"), "ALREADY_EXISTS"),
    (LedgerUnavailable("the PostgreSQL ledger at h:5432/db is unavailable"), "UNAVAILABLE"),
    (InvalidCharge("epsilon=1e-13 is below the ledger's unit 1e-12"), "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize(("exc", "status"), REFUSALS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v)
def test_each_refusal_declares_the_status_the_service_answers_with(
    exc: LedgerError | InvalidCharge, status: str
) -> None:
    assert type(exc).status == status
    assert status in grpc.StatusCode.__members__
    assert status_of(exc) == (grpc.StatusCode[status], str(exc))


def test_every_ledger_error_declares_a_status() -> None:
    classes: list[type[LedgerError] | type[InvalidCharge]] = [LedgerError, *LedgerError.__subclasses__(), InvalidCharge]
    assert {c.__name__ for c in classes} >= {
        "LedgerError",
        "BudgetExceeded",
        "RequestConflict",
        "LedgerUnavailable",
        "InvalidCharge",
    }
    assert all(c.__dict__.get("status") in grpc.StatusCode.__members__ for c in classes)
