"""Client.multiselect against a real server on an artifact with a client bundle: the k items, the
local choice, the charge on the user's budget, the replay of a retried request_id, and no charge
without a user id."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from recsvc.checks import ParamError
from recsvc.device import Device
from recsvc.service.testing import client_of, make_artifact, rpc_error, served

HISTORY = ["it3", "it17", "it29"]


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("art") / "toy", bundle=True)


def test_multiselect_end_to_end(bundled: Path, tmp_path: Path) -> None:
    device = Device.load(bundled / "client")
    with served(bundled, tmp_path / "l.db", budget=3.0) as h, client_of(h) as c:
        r = c.multiselect("dave", HISTORY, epsilon=1.0, k=5, device=bundled / "client", request_id="e2e-1")
        assert len(r.item_ids) == len(set(r.item_ids)) == 5
        assert r.item_id == r.item_ids[device.choose(HISTORY, r.item_ids)]
        assert (r.charged, r.replayed, r.epsilon_spent, r.request_id) == (True, False, 1.0, "e2e-1")
        assert r.budget_remaining == pytest.approx(2.0)

        again = c.multiselect("dave", HISTORY, epsilon=1.0, k=5, device=device, request_id="e2e-1")
        assert again.item_ids == r.item_ids and again.replayed
        assert c.budget("dave").spent == pytest.approx(1.0)  # the replay spent nothing
        with pytest.raises(ParamError, match="already sent by this device"):  # refused here, nothing sent
            c.multiselect("dave", HISTORY[:1], epsilon=1.0, k=5, device=device, request_id="e2e-1")

        anon = c.multiselect("", HISTORY, epsilon=1.0, k=3, device=device)
        assert (len(anon.item_ids), anon.charged, anon.epsilon_spent) == (3, False, 0.0)

        lattice = c.multiselect("dave", HISTORY, epsilon=0.5, k=2, device=device, signal="lattice")
        assert len(set(lattice.item_ids)) == 2 and lattice.epsilon_spent == 0.5  # the lattice signal is served too

        wrong = Device(device.model, device.factors, device.radius, "not-the-version", device.codebook, "x")
        code, _ = rpc_error(c.multiselect, "dave", HISTORY, 1.0, 2, wrong)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        other = Device(device.model, device.factors, device.radius, device.version, device.codebook, "other-book")
        code, msg = rpc_error(c.multiselect, "dave", HISTORY, 1.0, 2, other)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "codebook_version" in msg
        assert c.budget("dave").spent == pytest.approx(1.5)  # a refusal spends nothing
