"""Every refusal carries its status code, one lookup maps any exception, and the observer
interceptor counts each call (and each SelectBatch item) under the same metric names."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import REGISTRY

from recsvc.checks import ParamError
from recsvc.ledger import BudgetExceeded, LedgerUnavailable, RequestConflict
from recsvc.mechanisms.validation import MechanismInputError
from recsvc.service import errors
from recsvc.service.client import Client
from recsvc.service.interceptors import status_of
from recsvc.service.server import ServerHandle
from recsvc.service.testing import candidates, rpc_error

SERVER_OPTIONS = {"budget": 2.0}  # the module's server (conftest.py)


def _service_errors() -> list[type[errors.ServiceError]]:
    out, todo = [], [errors.ServiceError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return out


def test_every_service_error_names_a_status_code_of_the_table() -> None:
    table = {code for code, _, _ in errors.STATUS_TABLE}
    assert all(code in grpc.StatusCode.__members__ for code in table)
    for cls in _service_errors():
        assert cls.status in grpc.StatusCode.__members__ and cls.status in table, cls


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.InvalidRequest("x"), "INVALID_ARGUMENT"),
        (errors.Refused("x"), "INVALID_ARGUMENT"),
        (errors.Unavailable("x"), "FAILED_PRECONDITION"),
        (errors.PermissionDenied("x"), "PERMISSION_DENIED"),
        (errors.Unauthenticated("x"), "UNAUTHENTICATED"),
        (errors.RateLimited("x"), "RESOURCE_EXHAUSTED"),
        (BudgetExceeded("u", 3, 1, 2), "RESOURCE_EXHAUSTED"),
        (RequestConflict("u", "r"), "ALREADY_EXISTS"),
        (LedgerUnavailable("down"), "UNAVAILABLE"),
        (MechanismInputError("bad scores"), "INVALID_ARGUMENT"),
        (ParamError("{beta} must be > 0"), "INVALID_ARGUMENT"),
        (ValueError("bad"), "INVALID_ARGUMENT"),
        (RuntimeError("boom"), "INTERNAL"),
        (KeyError("k"), "INTERNAL"),
    ],
)
def test_one_lookup_maps_each_exception_to_the_code_clients_see(exc: BaseException, code: str) -> None:
    assert errors.status_name(exc) == code
    mapped, message = status_of(exc)
    assert mapped is grpc.StatusCode[code]
    assert message == (errors.INTERNAL_MESSAGE if code == "INTERNAL" else str(exc))


def test_the_nearest_declaration_in_the_mro_wins() -> None:
    class Narrower(errors.InvalidRequest):
        status = "OUT_OF_RANGE"

    class Inherits(Narrower):
        pass

    class Foreign(ValueError):  # declares nothing: the ValueError entry applies
        pass

    assert [errors.status_name(c("x")) for c in (Narrower, Inherits, Foreign)] == [
        "OUT_OF_RANGE",
        "OUT_OF_RANGE",
        "INVALID_ARGUMENT",
    ]


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_observer_counts_calls_and_batch_items_with_their_mechanism_status_and_epsilon(
    client: Client, server: ServerHandle
) -> None:
    names = [
        ("recsvc_requests_total", {"method": "Select", "mechanism": "rnm", "status": "OK"}),
        ("recsvc_requests_total", {"method": "Select", "mechanism": "", "status": "INVALID_ARGUMENT"}),
        ("recsvc_requests_total", {"method": "SelectBatch", "mechanism": "", "status": "OK"}),
        ("recsvc_requests_total", {"method": "SelectBatch.item", "mechanism": "rnm", "status": "OK"}),
        ("recsvc_requests_total", {"method": "SelectBatch.item", "mechanism": "", "status": "RESOURCE_EXHAUSTED"}),
        ("recsvc_requests_total", {"method": "GetBudget", "mechanism": "", "status": "OK"}),
        ("recsvc_epsilon_spent_total", {"mechanism": "rnm"}),
        ("recsvc_replays_total", {}),
        ("recsvc_request_seconds_count", {"method": "Select"}),
    ]
    before = [_value(n, **labels) for n, labels in names]
    r = client.select("obs-a", candidates(), mechanism="rnm", epsilon=0.5, request_id="obs-1")
    client.select("obs-a", candidates(), mechanism="rnm", epsilon=0.5, request_id="obs-1")  # a replay
    code, _ = rpc_error(client.select, "obs-a", [("nope", 1.0)], mechanism="rnm", epsilon=0.5)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    batch = [
        client.select_request("obs-b", candidates(), mechanism="rnm", epsilon=0.25, request_id=f"b{i}")
        for i in range(3)
    ]
    batch.append(client.select_request("obs-b", candidates(), mechanism="rnm", epsilon=5.0, request_id="b-over"))
    batch.append(client.select_request("obs-a", candidates(), mechanism="rnm", epsilon=0.5, request_id="obs-1"))
    results = client.select_batch(batch)
    assert [res.WhichOneof("outcome") for res in results] == ["response"] * 3 + ["error", "response"]
    assert results[4].response.replayed and results[4].response.item_id == r.item_id
    client.budget("obs-a")
    after = [_value(n, **labels) for n, labels in names]
    assert [b - a for a, b in zip(before, after, strict=False)] == [
        2,
        1,
        1,
        4,
        1,
        1,
        pytest.approx(0.5 + 3 * 0.25),
        2,
        3,
    ]


def test_a_foreign_status_attribute_that_names_no_code_is_internal() -> None:
    class HttpError(Exception):
        status = "404 Not Found"

    assert status_of(HttpError("x")) == (grpc.StatusCode.INTERNAL, errors.INTERNAL_MESSAGE)
