"""SelectBatch's fast path: vectorised draws equal the per-item draws, one ledger transaction per
batch, per-item outcomes and exact charges (through a real gRPC channel)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from randomgen import ChaCha
from scipy import stats

from recsvc.mechanisms import MechanismInputError, ValidSlate, probabilities, select, select_rows
from recsvc.service import batch as batch_module
from recsvc.service.client import Client
from recsvc.service.requests import Prepared, draw
from recsvc.service.server import ServerHandle
from recsvc.service.testing import AUDIT_ALPHA, candidates, client_of, served
from recsvc.v1 import selection_pb2 as pb

BUDGET = 3.0
SERVER_OPTIONS = {"budget": BUDGET}  # the module's server (conftest.py)


def _gen(key: int = 7) -> np.random.Generator:
    return np.random.Generator(ChaCha(key=key, rounds=20))


def _slates(draws: Sequence[np.ndarray | Exception]) -> list[list[int]]:
    """Each item's drawn slate as a list; every draw must have succeeded."""
    out = []
    for x in draws:
        assert isinstance(x, np.ndarray), x
        out.append(x.tolist())
    return out


@pytest.mark.parametrize("name", ["rnm", "rnm_laplace", "pf", "em", "gem"])
@pytest.mark.parametrize("sizes", [(8, 8, 8, 8), (5, 9, 1, 30)])
def test_select_rows_equals_one_select_per_row_with_the_same_generator(name: str, sizes: tuple[int, ...]) -> None:
    r = np.random.default_rng(0)
    n = np.array(sizes)
    q, d = r.uniform(0, 1, n.sum()), r.uniform(0.1, 1, n.sum())
    eps = np.array([0.5, 3.0, 1.0, 20.0])
    a, b = _gen(), _gen()
    got = select_rows(name, q, d, n, eps, a)
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    want = [select(name, q[s : s + k], d[s : s + k], e, b) for s, k, e in zip(starts, n, eps, strict=False)]
    assert got.tolist() == want
    assert a.random() == b.random()  # the generator moved exactly as far


def test_select_rows_checks_everything_before_drawing() -> None:
    g, ref = _gen(), _gen()
    q, d = np.ones(6), np.ones(6)
    for lengths, eps in (([3, 2], [1.0, 1.0]), ([3, 3], [1.0]), ([3, 3], [1.0, 0.0]), ([6, 0], [1.0, 1.0])):
        with pytest.raises(MechanismInputError):
            select_rows("rnm", q, d, lengths, eps, g)
    with pytest.raises(MechanismInputError):
        select_rows("rnm", np.array([1.0, np.nan]), np.ones(2), [2], [1.0], g)
    assert g.random() == ref.random()  # nothing was drawn


def test_vectorised_batch_draws_equal_the_per_item_draws(client: Client, server: ServerHandle) -> None:
    """With one fixed generator, the batch path's answers are exactly the per-item path's."""
    reqs = [
        client.select_request(f"eq-{i}", candidates(12, seed=i), mechanism="rnm", epsilon=0.3 * (i + 1))
        for i in range(6)
    ]
    reqs += [client.select_request("eq-k", candidates(12, seed=9), mechanism="rnm", epsilon=1.0, k=3)]
    prepared = [server.servicer.prepare_select(r) for r in reqs]
    batch = batch_module.draw_many(server.servicer.selector, prepared, _gen(3))
    g = _gen(3)
    single = [draw(p, g) for p in prepared]  # the vectorised group first, then the slate: same order
    slates = _slates(batch)
    assert slates == [s.tolist() for s in single]
    assert len(slates[-1]) == 3


def test_a_batch_prepared_together_is_validated_and_drawn_as_its_items_alone(
    client: Client, server: ServerHandle
) -> None:
    """prepare_selects checks a batch's items of one mechanism together (valid_slates): each
    item's checked inputs and its draw are those of the same request prepared alone."""
    reqs = [
        client.select_request(f"view-{i}", candidates(9 + i, seed=i), mechanism="rnm", epsilon=0.5 + i)
        for i in range(5)
    ]
    prepared = server.servicer.prepare_selects(reqs)
    for p, r in zip(prepared, reqs, strict=True):
        alone = server.servicer.prepare_select(r)
        assert isinstance(p, Prepared) and isinstance(p.valid, ValidSlate) and isinstance(alone.valid, ValidSlate)
        assert p.valid.q.tolist() == alone.valid.q.tolist() == p.scores.tolist()
        assert (p.valid.eps_step, p.valid.k, p.valid.values) == (alone.valid.eps_step, 1, alone.valid.values)
    batch = batch_module.draw_many(server.servicer.selector, prepared, _gen(5))
    g = _gen(5)
    assert _slates(batch) == [draw(p, g).tolist() for p in prepared]


def test_batch_answers_have_the_single_select_distribution(client: Client, server: ServerHandle) -> None:
    """Chi-square of 40 batches × 50 identical items (rnm, 5 candidates) against the exact law."""
    cands = candidates(5, seed=4)
    lo, hi = server.servicer.selector.catalog.lo, server.servicer.selector.catalog.hi
    rows = server.servicer.selector.catalog.rows([i for i, _ in cands])
    q = np.clip([s for _, s in cands], lo[rows], hi[rows])
    p = probabilities("rnm", q, server.servicer.selector.catalog.sensitivity[rows], 0.02)
    counts = dict.fromkeys((i for i, _ in cands), 0)
    for b in range(40):
        res = client.select_batch(
            [client.select_request(f"chi-{b}-{i}", cands, mechanism="rnm", epsilon=0.02) for i in range(50)]
        )
        for r in res:
            counts[r.response.item_id] += 1
    observed = np.array([counts[i] for i, _ in cands])
    assert observed.sum() == 2000
    assert stats.chisquare(observed, p * 2000).pvalue > AUDIT_ALPHA


def _batch_commits(server: ServerHandle, client: Client, reqs: list[pb.SelectRequest]) -> tuple[list, int]:
    before = server.ledger.commits
    res = client.select_batch(reqs)
    return res, server.ledger.commits - before


def test_mixed_batch_outcomes_charges_and_retry(
    client: Client, server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[str] = []
    real_rows, real_draw = batch_module.draw_rows, batch_module.draw

    def counting_rows(valid: Sequence[ValidSlate], rng: np.random.Generator) -> np.ndarray:
        draws.extend(v.mechanism for v in valid)
        return real_rows(valid, rng)

    def counting_draw(p: Prepared, *a: Any) -> np.ndarray:
        draws.append(p.mechanism)
        return real_draw(p, *a)

    monkeypatch.setattr(batch_module, "draw_rows", counting_rows)
    monkeypatch.setattr(batch_module, "draw", counting_draw)
    cands = candidates(10)
    earlier = client.select("mix-a", cands, mechanism="rnm", epsilon=0.5, request_id="old")
    sel = client.select_request
    reqs = [
        sel("mix-a", cands, mechanism="rnm", epsilon=0.5, request_id="old"),  # 0 replay of a Select
        sel("mix-a", cands, mechanism="rnm", epsilon=0.7, request_id="old"),  # 1 conflict
        sel("mix-a", [("it1", float("nan"))], mechanism="rnm", request_id="b"),  # 2 invalid
        sel("mix-a", cands, mechanism="pf", epsilon=0.25, request_id="c"),  # 3 charged
        sel("mix-a", cands, mechanism="em", epsilon=1.0, request_id="d", k=2),  # 4 charged, a slate
        sel("mix-b", cands, mechanism="gem", epsilon=0.5, request_id="e", beta=0.1),  # 5 charged
        sel("mix-a", cands, mechanism="rnm", epsilon=1.5, request_id="f"),  # 6 over budget: 0.5+0.25+1 spent
        sel("mix-a", cands, mechanism="rnm", epsilon=1e-13, request_id="g"),  # 7 ε below the ledger's unit
        sel("mix-a", cands, mechanism="rnm_laplace", epsilon=1.25, request_id="h"),  # 8 fits exactly: charged
        sel("mix-a", cands, mechanism="rnm", epsilon=0.001, request_id="i"),  # 9 nothing left
    ]
    res, commits = _batch_commits(server, client, reqs)
    kinds = [r.response.request_id if r.WhichOneof("outcome") == "response" else r.error.code_name for r in res]
    assert kinds == [
        "old",
        "ALREADY_EXISTS",
        "INVALID_ARGUMENT",
        "c",
        "d",
        "e",
        "RESOURCE_EXHAUSTED",
        "INVALID_ARGUMENT",
        "h",
        "RESOURCE_EXHAUSTED",
    ]
    assert commits == 1  # one transaction for the whole batch
    assert res[0].response.replayed and res[0].response.item_id == earlier.item_id
    assert len(res[4].response.item_ids) == 2 and res[5].response.mechanism == "gem"
    assert sorted(draws) == sorted(["pf", "em", "gem", "rnm_laplace"])  # only the charged items drew
    assert server.ledger.user("mix-a").spent_units == 3 * 10**12  # 0.5 + 0.25 + 1.0 + 1.25, exactly
    assert server.ledger.user("mix-b").spent_units == 5 * 10**11
    assert res[8].response.budget_remaining == 0.0
    # The same batch again: every answered item replays its stored answer, nothing draws or spends.
    draws.clear()
    again, _ = _batch_commits(server, client, reqs)
    for i in (0, 3, 4, 5, 8):
        assert again[i].response.replayed and list(again[i].response.item_ids) == list(res[i].response.item_ids)
    assert [again[i].error.code_name for i in (1, 2, 6, 7, 9)] == [res[i].error.code_name for i in (1, 2, 6, 7, 9)]
    assert draws == []
    assert server.ledger.user("mix-a").spent_units == 3 * 10**12


def test_budget_exhaustion_mid_batch_charges_exactly_the_items_that_fit_in_order(
    client: Client, server: ServerHandle
) -> None:
    eps = [1.0, 1.0, 0.75, 0.5, 0.25, 0.25]  # budget 3: 1, 1, 0.75 fit (2.75); 0.5 does not; 0.25 does
    reqs = [
        client.select_request("mid", candidates(8), mechanism="rnm", epsilon=e, request_id=f"m{i}")
        for i, e in enumerate(eps)
    ]
    res, commits = _batch_commits(server, client, reqs)
    assert [r.WhichOneof("outcome") for r in res] == ["response"] * 3 + ["error", "response", "error"]
    assert res[3].error.code_name == res[5].error.code_name == "RESOURCE_EXHAUSTED"
    assert [r.response.budget_remaining for r in (res[0], res[1], res[2], res[4])] == [2.0, 1.0, 0.25, 0.0]
    assert server.ledger.user("mid").spent_units == 3 * 10**12 and server.ledger.user("mid").requests == 4
    assert commits == 1


def test_duplicate_request_ids_within_a_batch_replay_the_first(client: Client, server: ServerHandle) -> None:
    r = client.select_request("dup", candidates(8), mechanism="rnm", epsilon=0.5, request_id="same")
    other = client.select_request("dup", candidates(8), mechanism="rnm", epsilon=0.6, request_id="same")
    res = client.select_batch([r, r, other])
    assert not res[0].response.replayed and res[1].response.replayed
    assert res[1].response.item_id == res[0].response.item_id
    assert res[2].error.code_name == "ALREADY_EXISTS"
    assert server.ledger.user("dup").spent_units == 5 * 10**11


def test_select_batch_on_the_postgresql_store_charges_each_item_once(
    pg_cluster, artifact: Path, tmp_path: Path
) -> None:
    """On the PostgreSQL store too, a SelectBatch is one commit with per-item outcomes: good items
    charged, bad ones refused alone. An id with a NUL character, which PostgreSQL's text cannot
    hold, is refused at validation, so it never reaches (and fails) the batch's statement."""
    from recsvc.ledger.testing import Stores

    url = pg_cluster.new_database()
    Stores(url, tmp_path / "k").open(budget=5.0).close()
    (tmp_path / "k").chmod(0o600)
    with served(artifact, url, fingerprint_key=tmp_path / "k", budget=5.0) as h:
        with client_of(h) as c:
            reqs = [
                c.select_request("pg-batch", candidates(), mechanism="rnm", epsilon=1.0, request_id=f"r{i}")
                for i in range(3)
            ]
            reqs.append(
                c.select_request("pg-batch", candidates(), mechanism="no-such-mechanism", epsilon=1.0, request_id="bad")
            )
            reqs.append(c.select_request("pg\x00batch", candidates(), mechanism="rnm", epsilon=1.0, request_id="nul"))
            results, commits = _batch_commits(h, c, reqs)
            again = c.select_batch(reqs[:3])
        assert [r.WhichOneof("outcome") for r in results] == ["response"] * 3 + ["error"] * 2
        assert results[3].error.code_name == results[4].error.code_name == "INVALID_ARGUMENT"
        assert "user_id contains a NUL character" in results[4].error.message
        assert commits == 1
        assert [r.response.replayed for r in again] == [True] * 3
        assert [r.response.item_id for r in again] == [r.response.item_id for r in results[:3]]
        u = h.ledger.user("pg-batch")
        assert (u.requests, u.spent_units) == (3, 3 * 10**12)


def test_select_rows_decides_a_tied_row_exactly_after_every_rows_cells() -> None:
    """Row 0's two equal scores get the same cell: its floats cannot order them, so its race
    takes 64 more bits of each uniform (the words after row 1's cells), and the smaller uniform
    (the larger −ln U) wins, as the same row alone decides it on the same words."""
    from recsvc.mechanisms.noisy_max import rnm_rows, rnm_sample
    from recsvc.mechanisms.testing import Words

    tie, low, high = 2**62, 3 << 60, 5 << 60  # row 0's cell; candidate 1's extra bits are the smaller
    row1 = [2**61, 2**63, 2**60]
    q, d = np.array([0.5, 0.5, 0.1, 0.9, 0.4]), np.ones(5)
    words = Words([tie, tie, *row1, high, low])
    got = rnm_rows(q, d, np.array([2, 3]), np.array([1.0, 1.0]), {}, words)  # type: ignore[arg-type]  # words
    alone = [
        int(rnm_sample(q[:2], d[:2], 1.0, {}, Words([tie, tie, high, low]), 1)[0]),  # type: ignore[arg-type]  # words
        int(rnm_sample(q[2:], d[2:], 1.0, {}, Words(row1), 1)[0]),  # type: ignore[arg-type]  # words
    ]
    assert got.tolist() == alone and alone[0] == 1
    assert words.words == []  # every planned word was read, none more
