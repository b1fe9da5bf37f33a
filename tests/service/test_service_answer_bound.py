"""How many answers one user can store: every request's ε is at least ``--min-epsilon``, so a
user stores at most ``--budget`` / ``--min-epsilon`` answers per budget window whatever ε it
sends; a request below the floor is refused with nothing spent or stored, and the answer past
the bound is refused RESOURCE_EXHAUSTED, nothing spent or stored."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from recsvc.checks import ParamError
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import ServerHandle
from recsvc.service.testing import candidates, rpc_error

SERVER_OPTIONS = {"budget": 1.0, "min_epsilon": 0.25}  # at most 4 stored answers per user


def test_a_user_stores_at_most_budget_over_min_epsilon_answers_however_small_its_epsilon(
    client: Client, server: ServerHandle
) -> None:
    cands = candidates()
    for epsilon in (1e-12, 0.2499):
        code, details = rpc_error(client.select, "tiny", cands, mechanism="rnm", epsilon=epsilon, request_id="t")
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "below this server's least epsilon per request, 0.25 (--min-epsilon" in details
    batch = client.select_batch([client.select_request("tiny", cands, mechanism="rnm", epsilon=1e-12)])
    assert batch[0].error.code_name == "INVALID_ARGUMENT" and "--min-epsilon" in batch[0].error.message
    assert server.ledger.totals() == {} and server.ledger.lookup("tiny", "t") is None
    answers = [client.select("tiny", cands, mechanism="rnm", epsilon=0.25, request_id=f"a{i}") for i in range(4)]
    assert [a.budget_remaining for a in answers] == pytest.approx([0.75, 0.5, 0.25, 0.0])
    code, _ = rpc_error(client.select, "tiny", cands, mechanism="rnm", epsilon=0.25, request_id="a4")
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.ledger.lookup("tiny", "a4") is None and server.ledger.user("tiny").requests == 4


@pytest.mark.parametrize("floor", [1e-13, 11.0, float("nan")])
def test_the_floor_lies_between_the_ledgers_unit_and_the_budget(floor: float) -> None:
    with pytest.raises(ParamError, match=r"^min_epsilon must be 0 \(no floor\) or at least 1e-12 and at most budget"):
        ServerConfig.of(Path("x"), budget=10.0, min_epsilon=floor).check()
    assert ServerConfig.of(Path("x"), min_epsilon=0.0).check().limits.min_epsilon == 0.0
