"""The ledger's conformance suite: one abstract test class that every store's tests subclass.

Like the WFA privacy budget manager's ``AbstractPrivacyBudgetLedgerTest``: the tests state what any
:class:`recsvc.ledger.Ledger` must do (replays, conflicts, exact units, refusals, durability,
concurrency, budget windows, SelectBatch), and a subclass supplies the backing store::

    class TestSQLiteLedger(AbstractLedgerTest):
        def target(self, request, tmp_path):
            return tmp_path / "ledger.db"

A subclass's ``target`` returns a fresh SQLite path or PostgreSQL URL; it may ask ``request``
for fixtures (e.g. a cluster). Each test gets a :class:`recsvc.ledger.testing.Stores` on it.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from recsvc.checks import ParamError
from recsvc.ledger import (
    BatchItem,
    BudgetExceeded,
    Charge,
    Drawn,
    InvalidCharge,
    Ledger,
    LedgerError,
    Replay,
    RequestConflict,
    Reservation,
    StoredAnswer,
    budget_changes,
    set_budget,
)
from recsvc.ledger.testing import DAY, Clock, Stores, drawn_charge, resp, said


def _batch(led: Ledger, items: list[BatchItem], draws: list[list[int]] | None = None) -> list[Any]:
    with led.reserve_batch(items) as r:
        if draws is not None and r.todo:
            draws.append(r.todo)
        return led.commit_batch(r, [Drawn((f"s{i}",)) for i in r.todo])


def _response(led: Ledger, user_id: str, request_id: str) -> str:
    """The stored answer of a request that must be stored."""
    stored = led.lookup(user_id, request_id)
    assert stored is not None, (user_id, request_id)
    return said(Charge(stored.answer, replayed=False))


def _outcome(o: object) -> object:
    return (said(o), o.replayed) if isinstance(o, Charge) else type(o).__name__


class AbstractLedgerTest(abc.ABC):
    """The tests every store passes; subclass it as ``Test<Store>`` and define :meth:`target`."""

    @abc.abstractmethod
    def target(self, request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
        """A fresh, empty backing ledger: an SQLite file path or a PostgreSQL URL."""

    @pytest.fixture
    def stores(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
        s = Stores(self.target(request, tmp_path), tmp_path / "ledger.key")
        try:
            yield s
        finally:
            s.close_all()

    def test_replay_conflict_and_budget_refusal(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        c = led.charge("alice", "r1", b"d1", 0.4, resp("a"), "rnm")
        assert (c.replayed, said(c)) == (False, "a|0.600000")
        assert c.answer == StoredAnswer(("a",), (), "rnm", 400_000_000_000, 0.4, 0.6)
        again = led.charge("alice", "r1", b"d1", 0.4, resp("OTHER"))
        assert (again.replayed, again.answer) == (True, c.answer)  # the stored answer, nothing spent
        with pytest.raises(RequestConflict, match="different parameters"):
            led.charge("alice", "r1", b"d2", 0.4, resp("b"))
        assert led.charge("bob", "r1", b"d2", 0.4, resp("b")).replayed is False  # request_ids are per user
        led.charge("alice", "r2", b"x", 0.6, resp("c"))
        with pytest.raises(BudgetExceeded, match="only 0 of 1 remains"):
            led.charge("alice", "r3", b"y", 0.01, resp("d"))
        u = led.user("alice")
        assert (u.spent_units, u.requests, u.remaining) == (10**12, 2, 0.0)
        assert led.lookup("alice", "r3") is None  # the refused request left no trace
        assert _response(led, "alice", "r1") == "a|0.600000"
        assert led.totals() == {"alice": pytest.approx(1.0), "bob": pytest.approx(0.4)}

    def test_exact_units_and_tiny_charges(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        for i in range(50):  # 50 × 0.02 is 1.0000000000000002 in floats, exactly 1 in units
            led.charge("u", f"r{i}", b"f", 0.02, resp("x"))
        with pytest.raises(BudgetExceeded):  # not one unit more: the comparison has no slack
            led.charge("u", "r50", b"f", 1e-12, resp("x"))
        assert (led.user("u").requests, led.user("u").spent_units) == (50, 10**12)
        with pytest.raises(InvalidCharge, match="below the ledger's unit"):
            led.charge("v", "r", b"f", 4e-13, resp("x"))
        assert led.charge("v", "r1", b"f", 1e-12, resp("x")).replayed is False
        assert led.charge("v", "r2", b"f", 1.5e-12, resp("x")).replayed is False  # rounded UP to 2 units
        assert (led.user("v").spent_units, led.lookup("v", "r")) == (3, None)

    def test_charges_of_at_least_c_store_at_most_budget_over_c_answers_per_window(self, stores: Stores) -> None:
        """What the service's ε floor (--min-epsilon) rests on: charges of at least c each store at
        most budget / c answers per budget window, single or batched; the next is refused with
        nothing stored, and the window's renewal allows as many again, never more."""
        day = 19_723
        clock = Clock(day * DAY + 1.0)
        led = stores.open(budget=1.0, window="1d", clock=clock)
        for i in range(4):
            led.charge("u", f"r{i}", b"f", 0.25, resp("x"))
        with pytest.raises(BudgetExceeded):
            led.charge("u", "r4", b"f", 0.25, resp("x"))
        batch = _batch(led, [BatchItem("v", f"b{i}", b"f", 0.25, "rnm") for i in range(6)])
        assert [type(o).__name__ for o in batch] == ["Charge"] * 4 + ["BudgetExceeded"] * 2
        assert (led.lookup("u", "r4"), led.lookup("v", "b4"), led.user("u").requests) == (None, None, 4)
        clock.now = (day + 1) * DAY
        for i in range(4, 8):
            led.charge("u", f"r{i}", b"f", 0.25, resp("x"))
        with pytest.raises(BudgetExceeded):
            led.charge("u", "r8", b"f", 0.25, resp("x"))
        assert (led.user("u").requests, led.lookup("u", "r8")) == (4, None)

    def test_reserve_writes_nothing_and_a_released_reservation_frees_the_request(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        r = led.reserve("u", "r", b"f", 0.5)
        assert isinstance(r, Reservation) and led.lookup("u", "r") is None
        with pytest.raises(RuntimeError, match="the draw failed"), r:
            raise RuntimeError("the draw failed")
        assert (led.user("u").spent_units, led.lookup("u", "r")) == (0, None)
        slate = Drawn(("b", "a"), (2, 1))
        r = led.reserve("u", "r", b"f", 0.5, "gem")  # the request_id is still free
        assert isinstance(r, Reservation)
        with r:
            first = led.commit(r, slate)
        assert first == Charge(StoredAnswer(("b", "a"), (2, 1), "gem", 500_000_000_000, 0.5, 0.5), replayed=False)
        replay = led.reserve("u", "r", b"f", 0.5, "gem")
        assert replay == Replay(first.answer)  # typed, exactly as committed; nothing drawn or spent
        with pytest.raises(RequestConflict):
            led.reserve("u", "r", b"other", 0.5)
        assert (led.user("u").spent_units, led.user("u").requests) == (500_000_000_000, 1)

    def test_restart_keeps_spend_and_answers(self, stores: Stores) -> None:
        led = stores.open(budget=2.0)
        slate = Drawn(("x", 'ü-é "q"', "3"), (7, 0, 2**32 - 1))  # ids and rows as stored, whatever they hold
        first = led.charge("u", "r", b"f", 1.5, slate, "gem")
        led.close()
        stores.opened.remove(led)
        again = stores.open(budget=2.0)
        assert (again.user("u").spent_units, again.user("u").requests) == (1_500_000_000_000, 1)
        replay = again.charge("u", "r", b"f", 1.5, resp("NEW"))
        assert (replay.replayed, replay.answer) == (True, first.answer)
        assert replay.answer == StoredAnswer(slate.item_ids, slate.item_rows, "gem", 1_500_000_000_000, 1.5, 0.5)
        with pytest.raises(BudgetExceeded):
            again.charge("u", "r2", b"g", 0.6, resp("y"))

    def test_200_concurrent_requests_against_a_budget_for_50(self, stores: Stores) -> None:
        led = stores.open(budget=5.0, pool_size=8)
        draws: list[int] = []

        def one(i: int) -> str:
            def draw() -> int:
                draws.append(i)
                return i

            try:
                drawn_charge(led, "u", f"r{i}", f"d{i}".encode(), 0.1, draw)
                return "ok"
            except BudgetExceeded:
                return "refused"

        with ThreadPoolExecutor(32) as pool:
            outcomes = list(pool.map(one, range(200)))
        assert (outcomes.count("ok"), outcomes.count("refused")) == (50, 150)
        u = led.user("u")
        assert (u.spent_units, u.requests) == (5 * 10**12, 50)
        assert 50 <= len(draws) <= 200  # the pre-check refuses most late requests before they draw

    def test_duplicates_draw_once_and_replays_and_refusals_draw_nothing(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        draws: list[str] = []

        def call(rid: str, digest: bytes = b"d") -> str:
            def draw() -> int:
                draws.append(rid)
                return len(draws)

            return said(drawn_charge(led, "u", rid, digest, 0.5, draw))

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: call("same"), range(8)))
        assert (len(set(answers)), draws) == (1, ["same"])  # one draw, one charge, one stored answer
        assert led.user("u").spent_units == 500_000_000_000
        call("same")  # a replay draws nothing
        call("r2")
        with pytest.raises(BudgetExceeded):
            call("r3")
        with pytest.raises(RequestConflict):
            call("same", b"other")
        assert draws == ["same", "r2"]  # neither the refusal nor the conflict drew

    def test_the_draw_holds_no_lock(self, stores: Stores) -> None:
        """A draw that blocks delays no other charge, not even one of the same user."""
        led = stores.open(budget=10.0)
        drawing, release = threading.Event(), threading.Event()

        def slow_draw() -> int:
            drawing.set()
            assert release.wait(20)
            return 1

        slow = threading.Thread(target=drawn_charge, args=(led, "u", "slow", b"s", 1.0, slow_draw))
        slow.start()
        try:
            assert drawing.wait(10)
            t0 = time.monotonic()
            drawn_charge(led, "u", "fast", b"f", 1.0, lambda: 2)
            drawn_charge(led, "other", "fast", b"f", 1.0, lambda: 2)
            assert time.monotonic() - t0 < 5.0
            assert led.user("u").requests == 1  # only the fast one is charged while the slow one draws
        finally:
            release.set()
            slow.join(20)
        assert (led.user("u").requests, led.user("u").spent_units) == (2, 2 * 10**12)

    def test_a_sample_that_lost_the_race_is_discarded_unreleased(self, stores: Stores) -> None:
        """The pre-check passes, then another charge spends the budget while we draw: the charge
        inside the transaction refuses, and the drawn sample is never stored."""
        led = stores.open(budget=1.0)

        def draw_while_other_spends() -> int:
            led.charge("u", "other", b"o", 0.8, resp("other"))
            return 7

        with pytest.raises(BudgetExceeded):
            drawn_charge(led, "u", "mine", b"m", 0.5, draw_while_other_spends)
        assert (led.user("u").spent_units, led.lookup("u", "mine")) == (800_000_000_000, None)
        assert issubclass(BudgetExceeded, LedgerError)

    def test_a_renewable_budget_renews_at_the_utc_window_boundary(self, stores: Stores) -> None:
        day = 19_723  # 2024-01-01, a Monday
        clock = Clock(day * DAY + DAY - 1.0)  # 23:59:59 UTC: the last second of the window
        led = stores.open(budget=1.0, window="1d", clock=clock)
        assert said(led.charge("u", "r1", b"d1", 0.6, resp("a"), mechanism="rnm")) == "a|0.400000"
        led.charge("u", "r2", b"d2", 0.4, resp("b"))
        with pytest.raises(BudgetExceeded, match="only 0 of 1 remains"):
            led.charge("u", "r3", b"d3", 0.01, resp("c"))
        u = led.user("u")
        assert (u.spent_units, u.requests, u.window_start, u.window_end) == (10**12, 2, day * DAY, (day + 1) * DAY)
        clock.now = (day + 1) * DAY  # exactly 00:00:00 UTC: the next window has started
        u = led.user("u")
        assert (u.spent_units, u.requests, u.remaining, u.window_start, u.window_end) == (
            0,
            0,
            1.0,
            (day + 1) * DAY,
            (day + 2) * DAY,
        )
        assert said(led.charge("u", "r3", b"d3", 0.7, resp("c"))) == "c|0.300000"  # the refused request, now fits
        with pytest.raises(BudgetExceeded, match=r"only 0\.3 of 1 remains"):
            led.charge("u", "r4", b"d4", 0.4, resp("d"))
        # A request charged in the previous window still replays: never a fresh draw, never a new charge.
        draws: list[int] = []
        old = drawn_charge(led, "u", "r1", b"d1", 0.6, lambda: draws.append(1))
        assert (old.replayed, said(old), draws) == (True, "a|0.400000", [])
        with pytest.raises(RequestConflict):
            led.charge("u", "r2", b"other", 0.4, resp("x"))
        assert (led.user("u").spent_units, led.user("u").requests) == (700_000_000_000, 1)
        assert led.totals() == {"u": pytest.approx(0.7)}
        clock.now = (day + 1) * DAY - 0.5  # a clock that steps back: the row's window never moves backwards
        assert led.user("u").spent_units == 700_000_000_000
        with pytest.raises(BudgetExceeded):
            led.charge("u", "r5", b"d5", 0.4, resp("e"))

    def test_seven_day_windows_are_epoch_aligned(self, stores: Stores) -> None:
        clock = Clock(19_723 * DAY + 5.0)  # Monday 2024-01-01 00:00:05 UTC
        led = stores.open(budget=1.0, window="7d", clock=clock)
        led.charge("u", "r1", b"d", 1.0, resp("a"))
        u = led.user("u")
        # 19,719 days after the epoch is Thursday 2023-12-28 (1970-01-01 was a Thursday)
        assert (u.window_start, u.window_end) == (19_719 * DAY, 19_726 * DAY)
        assert datetime.fromtimestamp(u.window_start, UTC).strftime("%A %Y-%m-%d %H:%M") == "Thursday 2023-12-28 00:00"
        clock.now = 19_726 * DAY - 1  # Wednesday 23:59:59: still exhausted
        with pytest.raises(BudgetExceeded):
            led.charge("u", "r2", b"d", 0.5, resp("b"))
        clock.now = 19_726 * DAY
        assert said(led.charge("u", "r2", b"d", 0.5, resp("b"))) == "b|0.500000"

    def test_a_lifetime_budget_never_renews(self, stores: Stores) -> None:
        clock = Clock(19_723 * DAY)
        led = stores.open(budget=1.0, clock=clock)  # the default window: lifetime
        led.charge("u", "r1", b"d", 1.0, resp("a"))
        clock.now += 10 * 365 * DAY
        u = led.user("u")
        assert (u.spent_units, u.requests, u.window_start, u.window_end) == (10**12, 1, 0, 0)
        with pytest.raises(BudgetExceeded):
            led.charge("u", "r2", b"d", 1e-12, resp("b"))

    def test_every_process_on_a_ledger_must_use_its_window(self, stores: Stores) -> None:
        stores.open(budget=1.0, window="7d").close()
        with pytest.raises(ParamError, match=r"budget_window 1d differs from the budget window 7d .*same window"):
            stores.open(budget=1.0, window="1d")
        with pytest.raises(ParamError, match=r"budget_window lifetime differs from the budget window 7d"):
            stores.open(budget=1.0)
        again = stores.open(budget=1.0, window="7d")  # the same window: accepted
        assert again.window.name == "7d"

    def test_every_process_on_a_ledger_must_use_its_budget(self, stores: Stores) -> None:
        stores.open(budget=1.0).close()
        with pytest.raises(ParamError, match=r"budget 5 differs from the budget ε=1 that the ledger .* is pinned to"):
            stores.open(budget=5.0)
        with pytest.raises(ParamError, match=r"budget 0.5 differs .* run `recsvc ledger set-budget"):
            stores.open(budget=0.5)  # smaller is refused too: the pin says what every process uses
        assert stores.open(budget=1.0).budget_units == 10**12

    def test_set_budget_is_the_one_way_to_change_it_and_is_recorded(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        led.charge("u", "r", b"f", 1.0, resp("a"))
        led.close()
        stores.opened.remove(led)
        _, change = set_budget(stores.target, 3.0)
        assert change is not None and (change.old_units, change.new_units) == (10**12, 3 * 10**12)
        assert change.changed_by and abs(change.time - time.time()) < 60
        assert set_budget(stores.target, 3.0)[1] is None  # already 3: nothing recorded
        with pytest.raises(ParamError, match=r"budget 1 differs from the budget ε=3"):
            stores.open(budget=1.0)
        again = stores.open(budget=3.0)
        u = again.user("u")
        assert (u.spent_units, u.budget_units) == (10**12, 3 * 10**12)  # the spend is kept
        again.charge("u", "r2", b"g", 2.0, resp("b"))
        with pytest.raises(BudgetExceeded):
            again.charge("u", "r3", b"h", 1e-12, resp("c"))
        history = budget_changes(stores.target)
        assert [(c.old_units, c.new_units) for c in history] == [(10**12, 3 * 10**12)]
        with pytest.raises(ParamError, match=r"budget must be a finite number > 0"):
            set_budget(stores.target, float("inf"))
        assert len(budget_changes(stores.target)) == 1

    def test_a_batch_is_one_transaction_decided_in_order(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        led.charge("v", "old", b"dv", 0.5, resp("v"))
        commits = led.commits
        draws: list[list[int]] = []
        items = [
            BatchItem("u", "a", b"da", 0.4, "rnm"),
            BatchItem("u", "b", b"db", 0.5, "rnm"),
            BatchItem("u", "c", b"dc", 0.3, "rnm"),  # does not fit after a and b
            BatchItem("u", "d", b"dd", 0.1, "rnm"),  # a later, smaller item that still fits
            BatchItem("u", "a", b"da", 0.4, "rnm"),  # repeats item 0: its answer, never a second charge
            BatchItem("v", "old", b"dv", 0.5, "pf"),  # stored before the batch: replayed
            BatchItem("v", "old2", b"dv", 0.5, "pf"),
            BatchItem("v", "old", b"zz", 0.5, "pf"),  # stored with another fingerprint: conflict
            BatchItem("w", "x", b"dx", 2.0, "pf"),
        ]  # beyond the whole budget
        got = [_outcome(o) for o in _batch(led, items, draws)]
        assert got == [
            ("s0|0.600000", False),
            ("s1|0.100000", False),
            "BudgetExceeded",
            ("s3|0.000000", False),
            ("s0|0.600000", True),
            ("v|0.500000", True),
            ("s6|0.000000", False),
            "RequestConflict",
            "BudgetExceeded",
        ]
        assert draws == [[0, 1, 3, 6]]  # replays, conflicts and refusals draw nothing
        assert led.commits == commits + 1  # one transaction for the whole batch
        assert [(led.user(u).spent_units, led.user(u).requests) for u in "uvw"] == [(10**12, 3), (10**12, 2), (0, 0)]
        assert led.lookup("u", "c") is None and _response(led, "u", "d") == "s3|0.000000"

    def test_a_batch_of_only_uncountable_items_refuses_each_and_reads_nothing_stored(self, stores: Stores) -> None:
        led = stores.open(budget=1.0)
        draws: list[list[int]] = []
        got = _batch(led, [BatchItem("u", "a", b"da", 1e-300, "rnm"), BatchItem("v", "b", b"db", 1e-13, "rnm")], draws)
        assert [_outcome(o) for o in got] == ["InvalidCharge", "InvalidCharge"] and draws == []
        assert led.commits == 0 and led.totals() == {}

    def test_concurrent_batches_and_single_charges_against_a_budget_for_50(self, stores: Stores) -> None:
        """8 batches of 20 items and 40 single charges of one user, all at once, against a budget
        for 50: exactly 50 are charged, whichever path they took."""
        led = stores.open(budget=5.0, pool_size=8)

        def batch(b: int) -> list[str]:
            items = [BatchItem("u", f"b{b}-{i}", f"d{b}-{i}".encode(), 0.1, "rnm") for i in range(20)]
            return ["ok" if isinstance(o, Charge) else type(o).__name__ for o in _batch(led, items)]

        def single(i: int) -> list[str]:
            try:
                drawn_charge(led, "u", f"s{i}", f"e{i}".encode(), 0.1, lambda: i)
                return ["ok"]
            except BudgetExceeded:
                return ["BudgetExceeded"]

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(batch, b) for b in range(8)] + [pool.submit(single, i) for i in range(40)]
            outcomes = [o for f in futures for o in f.result()]
        assert (outcomes.count("ok"), outcomes.count("BudgetExceeded"), len(outcomes)) == (50, 150, 200)
        assert (led.user("u").spent_units, led.user("u").requests) == (5 * 10**12, 50)
