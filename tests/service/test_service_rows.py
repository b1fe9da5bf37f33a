"""The compact encoding (item rows + catalog version): the same answers, refusals and replays as
item ids, through a real gRPC channel; a request for another catalog is refused with nothing spent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import polars as pl
import pytest
from randomgen import ChaCha
from scipy import stats

from recsvc.artifact import load_artifact
from recsvc.mechanisms import probabilities
from recsvc.service import batch as batch_module
from recsvc.service.catalog import catalog_version
from recsvc.service.client import Client, ItemRows
from recsvc.service.server import ServerHandle
from recsvc.service.testing import AUDIT_ALPHA, candidates

BUDGET = 50.0
SERVER_OPTIONS = {"budget": BUDGET}  # the module's server (conftest.py)


@pytest.fixture(scope="module")
def rows(client: Client, artifact: Path) -> ItemRows:
    return client.item_rows(pl.read_parquet(artifact / "items.parquet")["item_id"].to_list())


def _slates(draws: Sequence[np.ndarray | Exception]) -> list[list[int]]:
    """Each item's drawn slate as a list; every draw must have succeeded."""
    out = []
    for x in draws:
        assert isinstance(x, np.ndarray), x
        out.append(x.tolist())
    return out


def _outcome(r) -> str:
    return r.response.request_id if r.WhichOneof("outcome") == "response" else f"{r.error.code_name}: {r.error.message}"


def test_catalog_version_is_the_ordered_item_list_and_the_server_reports_it(client: Client, artifact: Path) -> None:
    ids = load_artifact(artifact).items["item_id"].to_list()
    assert client.catalog_version() == catalog_version(ids) == catalog_version(list(ids))
    assert catalog_version(ids[::-1]) != catalog_version(ids)
    assert catalog_version(["ab", "c"]) != catalog_version(["a", "bc"])  # length-prefixed: no collision
    with pytest.raises(ValueError, match=r"catalog version .* but the server's is"):
        client.item_rows(ids[1:])


def test_rows_and_ids_prepare_the_same_request_and_draw_the_same_answers(
    client: Client, server: ServerHandle, rows: ItemRows
) -> None:
    servicer = server.servicer
    by_id = [
        client.select_request(
            f"eq-{i}", candidates(12, seed=i), mechanism="rnm", epsilon=0.4 * (i + 1), request_id=f"r{i}"
        )
        for i in range(5)
    ]
    by_row = [
        client.select_request(
            f"eq-{i}", candidates(12, seed=i), mechanism="rnm", epsilon=0.4 * (i + 1), request_id=f"r{i}", rows=rows
        )
        for i in range(5)
    ]
    a, b = servicer.prepare_selects(by_id), servicer.prepare_selects(by_row)
    for p, q in zip(a, b, strict=False):
        assert np.array_equal(p.scores, q.scores) and np.array_equal(p.sensitivities, q.sensitivities)
        assert np.array_equal(p.rows, q.rows) and list(q.item_ids) == list(p.item_ids)
        assert (p.mechanism, p.epsilon, p.k) == (q.mechanism, q.epsilon, q.k)
        assert p.fingerprint != q.fingerprint  # the digest covers the encoding: rows + catalog version

    def gen() -> np.random.Generator:
        return np.random.Generator(ChaCha(key=11, rounds=20))

    assert _slates(batch_module.draw_many(servicer.selector, a, gen())) == _slates(
        batch_module.draw_many(servicer.selector, b, gen())
    )


def test_rows_answers_have_the_exact_single_select_distribution(
    client: Client, server: ServerHandle, rows: ItemRows
) -> None:
    """Chi-square of 30 batches × 50 row-encoded items (rnm, 5 candidates) against the exact law."""
    cands = candidates(5, seed=4)
    cat = server.servicer.selector.catalog
    r = cat.rows([i for i, _ in cands])
    p = probabilities("rnm", np.clip([s for _, s in cands], cat.lo[r], cat.hi[r]), cat.sensitivity[r], 0.02)
    counts = dict.fromkeys((i for i, _ in cands), 0)
    for b in range(30):
        res = client.select_batch(
            [client.select_request(f"chi-{b}-{i}", cands, mechanism="rnm", epsilon=0.02, rows=rows) for i in range(50)]
        )
        for x in res:
            counts[x.response.item_id] += 1
            assert list(x.response.item_rows) == [rows.index[x.response.item_id]]
    observed = np.array([counts[i] for i, _ in cands])
    assert observed.sum() == 1500
    assert stats.chisquare(observed, p * 1500).pvalue > AUDIT_ALPHA


def test_rows_get_the_same_refusals_as_ids(client: Client, rows: ItemRows) -> None:
    cands = candidates(6)
    # (candidates, request fields): each refused by the same check in both encodings
    bad: list[tuple[list[tuple[str, float]], dict[str, Any]]] = [
        ([("it1", float("nan")), ("it2", 0.5)], {}),
        (cands, {"epsilon": -1.0}),
        (cands, {"k": 7}),
        (cands, {"mechanism": "no-such"}),
        ([cands[0], cands[1], cands[0]], {}),
        ([], {}),
        (cands, {"beta": 3.0, "mechanism": "gem"}),
    ]
    for encoding in (None, rows):
        reqs = [
            client.select_request("same", c, **{"mechanism": "rnm", "epsilon": 1.0, **kw}, rows=encoding)
            for c, kw in bad
        ]
        res = client.select_batch(reqs)
        singles = []
        for req in reqs:
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Select(req)
            singles.append(f"{err.value.code().name}: {err.value.details()}")
        assert [_outcome(r) for r in res] == singles  # a batch item is refused exactly as a Select
        if encoding is None:
            by_id = singles
    assert singles[:4] + singles[5:] == by_id[:4] + by_id[5:]
    assert "duplicate item_rows entry" in singles[4] and "duplicate item_id" in by_id[4]
    assert all(s.startswith("INVALID_ARGUMENT") for s in singles)
    assert client.budget("same").requests == 0


def test_wrong_catalog_and_malformed_rows_are_refused_and_spend_nothing(client: Client, rows: ItemRows) -> None:
    good = client.select_request("cat", candidates(4), mechanism="rnm", epsilon=1.0, rows=rows)
    other = type(good)()
    other.CopyFrom(good)
    other.catalog_version = "items-sha256:0123"
    missing = type(good)()
    missing.CopyFrom(good)
    missing.catalog_version = ""
    out_of_range = type(good)()
    out_of_range.CopyFrom(good)
    out_of_range.item_rows[1] = 10**6
    both = type(good)()
    both.CopyFrom(good)
    both.item_ids.extend(i for i, _ in candidates(4))
    short_scores = type(good)()
    short_scores.CopyFrom(good)
    del short_scores.scores[-1]
    expect = {
        "FAILED_PRECONDITION": (other, ["'items-sha256:0123'", repr(rows.version), "nothing was spent"]),
        "INVALID_ARGUMENT": (missing, ["item_rows without catalog_version", repr(rows.version)]),
    }
    for code, (req, words) in expect.items():
        with pytest.raises(grpc.RpcError) as err:
            client.stub.Select(req)
        assert err.value.code().name == code and all(w in err.value.details() for w in words)
    for req, message in (
        (out_of_range, "item_rows[1] = 1000000 is out of range"),
        (both, "both item_rows and item_ids are set"),
        (short_scores, "item_rows has 4 entries but scores has 3"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            client.stub.Select(req)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
    res = client.select_batch([other, good, missing])
    assert [r.WhichOneof("outcome") for r in res] == ["error", "response", "error"]
    assert res[0].error.code_name == "FAILED_PRECONDITION"
    u = client.budget("cat")
    assert (u.requests, u.spent) == (1, 1.0)  # only the good item was charged


def test_a_retried_rows_request_replays_and_a_changed_one_conflicts(
    client: Client, rows: ItemRows, server: ServerHandle
) -> None:
    req = client.select_request("retry", candidates(8), mechanism="rnm", epsilon=0.5, request_id="once", rows=rows)
    first = client.stub.Select(req)
    again = client.stub.Select(req)
    in_batch = client.select_batch([req])[0].response
    assert again.replayed and in_batch.replayed and not first.replayed
    assert list(again.item_ids) == list(in_batch.item_ids) == list(first.item_ids)
    assert list(first.item_rows) == [rows.index[i] for i in first.item_ids]
    changed = type(req)()
    changed.CopyFrom(req)
    changed.item_rows[0], changed.item_rows[1] = req.item_rows[1], req.item_rows[0]
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Select(changed)  # the rows are part of the request: another request, same id
    assert err.value.code() is grpc.StatusCode.ALREADY_EXISTS
    assert server.ledger.user("retry").spent_units == 5 * 10**11


@pytest.mark.parametrize(
    ("rows", "refused"),
    [(list(range(200, 300)), False), (list(range(200, 301)), True), ([1] * 101, True), ([2**31] * 100, False)],
)
def test_the_pre_scan_counts_packed_rows_exactly(rows: list[int], refused: bool) -> None:
    """item_rows is a packed varint run (1–5 bytes per row): the raw pre-scan counts its entries, not bytes."""
    from recsvc.service import codec
    from recsvc.service.config import Limits
    from recsvc.v1 import selection_pb2 as pb

    body = pb.SelectRequest(user_id="u", item_rows=rows, scores=[0.0] * 100).SerializeToString()
    if refused:
        with pytest.raises(codec.Refused, match="more than 100 item_rows in one SelectRequest"):
            codec.check(body, codec.SELECT, Limits(max_candidates=100))
    else:
        codec.check(body, codec.SELECT, Limits(max_candidates=100))


def test_a_batch_mixing_both_encodings_maps_every_item_to_its_rows(
    client: Client, rows: ItemRows, server: ServerHandle
) -> None:
    reqs = [
        client.select_request(
            "mixed", candidates(6, seed=s), mechanism="rnm", epsilon=0.1, rows=rows if s % 2 else None
        )
        for s in range(5)
    ]
    reqs.append(client.select_request("mixed", [("it1", 0.5), ("no-such-item", 0.1)], mechanism="rnm", epsilon=0.1))
    prepared = server.servicer.prepare_selects(reqs)
    for req, p in zip(reqs[:5], prepared[:5], strict=False):
        ids = list(req.item_ids) or [server.servicer.selector.catalog.item_ids[r] for r in req.item_rows]
        assert p.rows.tolist() == [rows.index[i] for i in ids]
    assert "unknown item_id 'no-such-item' (candidate #1)" in str(prepared[5])
    res = client.select_batch(reqs)
    assert [r.WhichOneof("outcome") for r in res] == ["response"] * 5 + ["error"]
    assert all(list(r.response.item_rows) == [rows.index[r.response.item_id]] for r in res[:5])
