"""Accounting through real gRPC channels: a tiny charge is refused or counted, never lost, and a
sample is drawn outside the ledger's write lock (a retry never draws)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

import recsvc.service.requests as requests_module
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import ServerHandle
from recsvc.service.testing import candidates
from recsvc.v1 import selection_pb2 as pb

# each test's own server (conftest.py: fresh_server); no ε floor: the ledger's own unit is tested
SERVER_OPTIONS = {"budget": 10.0, "min_epsilon": 0.0}


def test_tiny_charges_are_refused_or_counted_never_lost(fresh_client: Client, fresh_server: ServerHandle) -> None:
    cands = candidates()
    assert fresh_client.select("u", cands, mechanism="rnm", epsilon=8.0).budget_remaining == 2.0
    for _ in range(200):  # each below the unit: added to a float total of 8.0 it would change nothing
        with pytest.raises(grpc.RpcError) as info:
            fresh_client.select("u", cands, mechanism="rnm", epsilon=4e-16)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "below the ledger's unit 1e-12" in info.value.details()
    b = fresh_client.budget("u")
    assert (b.spent, b.requests) == (8.0, 1)  # refused: nothing spent, nothing counted
    for _ in range(200):  # just above the unit: rounded UP to 2e-12 each, and counted
        assert fresh_client.select("u", cands, mechanism="rnm", epsilon=1.5e-12).epsilon_spent == 2e-12
    b = fresh_client.budget("u")
    assert (b.spent, b.remaining, b.requests) == (8.0000000004, 1.9999999996, 201)
    assert fresh_server.ledger.user("u").spent_units == 8 * 10**12 + 400


def test_concurrent_duplicates_get_one_stored_answer_and_one_charge(
    fresh_client: Client, fresh_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[int] = []
    real = requests_module.draw_slate

    def slow_select(*a: Any, **k: Any) -> Any:
        draws.append(1)
        # The first draw waits until every duplicate is in flight behind it (polled, not slept for:
        # a sleep would assume how soon 7 other connections get there).
        deadline = time.monotonic() + 60
        while fresh_server.ledger._flights.waiting(("dup", "same-id")) < 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        return real(*a, **k)

    monkeypatch.setattr(requests_module, "draw_slate", slow_select)
    cands = candidates()
    out: list[pb.SelectResponse] = []

    def one() -> None:
        with Client(f"127.0.0.1:{fresh_server.port}", retries=0) as c:  # each its own connection
            out.append(c.select("dup", cands, mechanism="rs", epsilon=0.5, gamma=0.01, request_id="same-id"))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 8 and len({r.item_id for r in out}) == 1
    assert sorted(r.replayed for r in out) == [False] + [True] * 7
    assert len(draws) == 1  # one sample drawn in all; the duplicates waited for it
    u = fresh_server.ledger.user("dup")
    assert (u.requests, u.spent_units) == (1, 500_000_000_000)


@contextmanager
def _stalled_rs(
    client: Client, monkeypatch: pytest.MonkeyPatch, user: str, observe: Callable[[str], None] = lambda name: None
) -> Iterator[list[pb.SelectResponse]]:
    """``user``'s rs Select in flight for the ``with`` block: its draw has begun and waits until the
    block ends; then it is answered (into the list). ``observe`` sees the name of every draw made,
    from the thread that makes it; the patch stays for the rest of the test."""
    in_draw, finish = threading.Event(), threading.Event()
    real = requests_module.draw_slate

    def select(v: Any, rng: Any) -> Any:
        observe(v.mechanism)
        if v.mechanism == "rs" and not finish.is_set():
            in_draw.set()
            finish.wait(120)  # beyond the client's 30 s deadline: a call stuck behind it fails, never late
        return real(v, rng)

    monkeypatch.setattr(requests_module, "draw_slate", select)
    answered: list[pb.SelectResponse] = []
    t = threading.Thread(target=lambda: answered.append(client.select(user, candidates(), mechanism="rs", epsilon=0.5)))
    t.start()
    try:
        assert in_draw.wait(10)
        yield answered
    finally:
        finish.set()
        t.join(30)


def test_a_long_draw_holds_no_lock_that_other_users_wait_for(
    fresh_client: Client, fresh_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose draw never ends (think γ = 1e-6) must not delay another user's request:
    the other request is answered (within the client's 30 s deadline) while the first one is
    still drawing, and no draw holds the ledger's write lock."""
    locked: list[bool] = []

    def observe(name: str) -> None:
        if name == "rs":
            locked.append(fresh_server.ledger._write_lock.locked())

    with _stalled_rs(fresh_client, monkeypatch, "flooder", observe) as slow:
        r = fresh_client.select("innocent", candidates(seed=2), mechanism="rnm", epsilon=0.5)
        assert not r.replayed and not slow  # answered while the rs draw still waits (until the block ends)
        assert fresh_server.ledger.user("innocent").requests == 1 and fresh_server.ledger.user("flooder").requests == 0
    assert locked == [False] and len(slow) == 1 and fresh_server.ledger.user("flooder").requests == 1


def test_only_a_lone_light_select_runs_on_the_event_loop(
    fresh_client: Client, fresh_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Select alone on the server is served on the event loop (no thread hop); a Recommend, a
    draw whose length γ sets, and any Select while another call is in flight run in request
    threads. Every one is charged the same way."""
    seen: list[tuple[str, str]] = []

    def observe(name: str) -> None:
        seen.append((name, threading.current_thread().name.split("_")[0]))

    with _stalled_rs(fresh_client, monkeypatch, "v", observe) as slow:
        fresh_client.select("u", candidates(seed=2), mechanism="rnm", epsilon=0.5)  # the rs call is in flight
    fresh_client.select("u", candidates(seed=3), mechanism="rnm", epsilon=0.5)  # alone
    fresh_client.recommend("u", ["it1", "it2"], mechanism="rnm", epsilon=0.5)
    fresh_client.select("u", candidates(seed=4), mechanism="rs", epsilon=0.5)
    assert seen == [
        ("rs", "recsvc-rpc"),
        ("rnm", "recsvc-rpc"),
        ("rnm", "recsvc-loop"),
        ("rnm", "recsvc-rpc"),
        ("rs", "recsvc-rpc"),
    ]
    assert len(slow) == 1
    assert (fresh_server.ledger.user("u").requests, fresh_server.ledger.user("v").requests) == (4, 1)


def test_heavy_draws_run_in_the_lowest_priority_pool(
    fresh_client: Client, fresh_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rs at γ = 5e-6 (≈ 2·10⁵ draws, above --heavy-draws 100,000) is drawn by a draw process at
    nice 19 (it shares no GIL with the server); rs at the default γ (≈ 125 draws, but a length
    γ sets) by a request thread; rnm, a lone light call, on the event loop; both at normal priority."""
    import psutil

    seen: list[tuple[str, str, int]] = []
    real = requests_module.draw_slate

    def select(v: Any, rng: Any) -> Any:
        seen.append(
            (
                v.mechanism,
                threading.current_thread().name.split("_")[0],
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
            )
        )
        return real(v, rng)

    monkeypatch.setattr(requests_module, "draw_slate", select)
    cands = candidates()
    heavy = fresh_client.select("h", cands, mechanism="rs", epsilon=0.5, gamma=5e-6)
    fresh_client.select("h", cands, mechanism="rs", epsilon=0.5)
    fresh_client.select("h", cands, mechanism="rnm", epsilon=0.5)
    base = os.getpriority(os.PRIO_PROCESS, 0)  # this (main) thread's nice value, which the rpc threads share
    # the heavy draw never ran in this process: only the other two did
    assert [s[:2] for s in seen] == [("rs", "recsvc-rpc"), ("rnm", "recsvc-loop")] and all(s[2] == base for s in seen)
    assert heavy.item_id in dict(cands) and heavy.mechanism == "rs"
    drawers = [c for c in psutil.Process().children() if "spawn_main" in " ".join(c.cmdline())]
    assert [c.nice() for c in drawers] == [19]  # the one draw process (--heavy-draw-threads 1)
    assert fresh_server.servicer.selector.heavy.pooled == 1 and fresh_server.ledger.user("h").requests == 3


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"budget": 1e7},
            r"^budget must lie in \[1e-12, 9223372\.036854775807\] \(the ledger counts ε in units of 1e-12\), got 10000000\.0$",
        ),
        ({"budget": 1e-13}, r"^budget must lie in \[1e-12, "),
        ({"heavy_draws": 0}, r"^heavy_draws and heavy_draw_threads must be >= 1, got 0 and 1$"),
        ({"heavy_draw_threads": 0}, r"^heavy_draws and heavy_draw_threads must be >= 1, got 100000 and 0$"),
    ],
)
def test_budget_and_heavy_draw_knobs_are_checked(tmp_path: Path, over: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerConfig.of(artifacts=tmp_path, **over).check()


@pytest.mark.parametrize(
    ("mechanism", "n", "k", "params", "stage", "light"),
    [
        ("rnm", 500, 1, {}, None, True),
        ("rnm", 4096, 1, {}, None, True),  # LIGHT_DRAWS exactly
        ("rnm", 4097, 1, {}, None, False),
        ("em", 500, 8, {}, None, True),  # a peeled slate: 8 × 500 draws
        ("em", 500, 9, {}, None, False),  # 4,500
        ("oneshot", 4096, 50, {}, None, True),  # one-shot: one run for the whole slate
        ("rs", 20, 1, {"gamma": 0.5}, None, False),  # γ sets its length, however small
        ("rnm", 20, 1, {}, ("oneshot", 10), False),  # a two-stage Recommend
    ],
)
def test_light_work_is_small_single_stage_and_of_a_fixed_length(
    mechanism: str, n: int, k: int, params: dict[str, float], stage: tuple[str, int] | None, light: bool
) -> None:
    import numpy as np

    from recsvc.service.draws import light as is_light
    from recsvc.service.requests import CandidateStage, Prepared, validated

    scores, sens = np.linspace(0, 1, n), np.full(n, 0.1)
    cand = None if stage is None else CandidateStage(stage[1], 0.5, stage[0])
    valid = validated(mechanism, 1.0, params, scores, sens, k, cand, False)
    p = Prepared("u", "r", b"", mechanism, 1.0, params, scores, sens, (), k, cand, valid=valid)
    assert is_light(p) is light


def test_the_work_that_decides_heavy_is_priced_from_public_quantities_only() -> None:
    """F12: Prepared.work, which sends a call to the heavy queue, is the same for any scores at the
    same n, k, ε and parameters: whether a call is heavy reveals nothing about a user's data (it
    depended on gem's hull of the scores before)."""
    import numpy as np

    from recsvc.mechanisms import MECHANISMS
    from recsvc.service.requests import Prepared, validated

    rng = np.random.default_rng(0)
    n, sens = 300, np.full(300, 0.5)
    inputs = [np.zeros(n), np.linspace(0, 1, n), rng.normal(0, 100, n), np.r_[1e6, np.zeros(n - 1)]]
    for name, mech in MECHANISMS.items():
        if not mech.private:
            continue
        for k in (1, 5):
            for eps in (0.01, 4.0, 2000.0):
                works = {
                    Prepared(
                        "u",
                        "r",
                        b"",
                        name,
                        eps,
                        {},
                        q,
                        sens,
                        (),
                        k,
                        valid=validated(name, eps, {}, q, sens, k, None, False),
                    ).work
                    for q in inputs
                }
                assert len(works) == 1, (name, k, eps, works)
