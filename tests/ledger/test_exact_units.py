"""Exact ε accounting (integer units of 1e-12) and the draw-outside-the-lock protocol, on the ledger itself."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from recsvc.ledger import BudgetExceeded, Charge, InvalidCharge, RequestConflict
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import drawn_charge, resp, said
from recsvc.ledger.units import (
    MAX_UNITS,
    budget_units,
    charge_units,
    float_units_up,
    format_units,
    to_epsilon,
)


@pytest.mark.parametrize(
    ("epsilon", "units"),
    [
        (0.1, 100_000_000_000),  # the decimal the client wrote: 0.1 exactly, not the double's 0.1000…0555
        (0.02, 20_000_000_000),
        (1e-12, 1),  # the unit itself
        (1.5e-12, 2),  # rounded UP
        (1.0000000000001, 1_000_000_000_001),  # 13 decimals: rounded up to 12
        (0.30000000000000004, 300_000_000_001),  # 0.1 + 0.2 in floats: its extra digits round up
    ],
)
def test_charges_are_rounded_up_to_the_unit(epsilon: float, units: int) -> None:
    assert charge_units(epsilon) == units


@pytest.mark.parametrize(
    ("epsilon", "message"),
    [
        (4e-16, "below the ledger's unit 1e-12"),
        (9.99e-13, "below the ledger's unit 1e-12"),
        (5e-324, "below the ledger's unit 1e-12"),
        (1e7, r"too large for the ledger to count; expected epsilon <= 9223372\.036854775807"),
        (1e300, "too large"),
        (
            9_223_372.036854775807,
            "too large",
        ),  # the double's shortest decimal 9223372.036854776 exceeds 2**63 - 1 units
        (0.0, "positive finite"),
        (-1.0, "positive finite"),
        (float("nan"), "positive finite"),
        (float("inf"), "positive finite"),
    ],
)
def test_uncountable_charges_are_refused(epsilon: float, message: str) -> None:
    with pytest.raises(InvalidCharge, match=message):
        charge_units(epsilon)


def test_budget_rounds_down_and_stored_floats_round_up() -> None:
    assert budget_units(10.0) == 10**13 and budget_units(1.5e-12) == 1 and budget_units(1e-13) is None
    assert charge_units(9_223_372.036854) == 9_223_372_036_854_000_000 < MAX_UNITS
    assert budget_units(1e7) is None and budget_units(float("nan")) is None
    assert float_units_up(0.1) == 100_000_000_001  # the double 0.1000000000000000055… rounds UP
    assert float_units_up(8.0) == 8 * 10**12 and float_units_up(0.0) == 0
    assert format_units(100_000_000_001) == "0.100000000001" and format_units(10**13) == "10" and format_units(0) == "0"
    assert to_epsilon(8 * 10**12 + 200) == 8.0000000002


def test_tiny_charges_no_longer_vanish(tmp_path: Path) -> None:
    """The finding: after 8.0, 200 charges of 4e-16 left a float total at exactly 8.0."""
    led = SQLiteLedger(tmp_path / "l.db", budget=10.0)
    led.charge("u", "big", b"d", 8.0, resp("x"))
    for i in range(200):
        with pytest.raises(InvalidCharge, match="below the ledger's unit"):
            led.charge("u", f"tiny-{i}", b"d", 4e-16, resp("x"))
    for i in range(200):  # just above the unit: each is rounded up to 2 units and counted
        led.charge("u", f"small-{i}", b"d", 1.5e-12, resp("x"))
    u = led.user("u")
    assert (u.spent_units, u.requests) == (8 * 10**12 + 400, 201)
    assert u.spent > 8.0 and led.lookup("u", "tiny-0") is None


def test_budget_comparison_is_exact(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    for i in range(10):  # 10 × 0.1 = 1 exactly (as floats the sum is 0.9999999999999999)
        led.charge("u", f"r{i}", b"d", 0.1, resp("x"))
    stored = led.lookup("u", "r9")
    assert stored is not None and stored.answer.remaining == 0.0 and led.user("u").spent_units == 10**12
    with pytest.raises(BudgetExceeded, match=r"requested epsilon=0\.000000000001 but only 0 of 1 remains"):
        led.charge("u", "one-more-unit", b"d", 1e-12, resp("x"))


# -- reserve, draw, commit: the sample is drawn outside the write transaction -----------------------


def test_the_draw_runs_outside_the_write_lock_and_refusals_never_draw(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    held: list[bool] = []

    def draw(tag: str):
        def run() -> str:
            held.append(led._write_lock.locked() or led._writer_conn().in_transaction)
            return tag

        return run

    assert said(drawn_charge(led, "u", "r1", b"d1", 0.75, draw("a")), 3) == "a|0.250"
    replay = drawn_charge(led, "u", "r1", b"d1", 0.75, draw("fresh?"))
    assert (replay.replayed, said(replay, 3)) == (True, "a|0.250")  # the stored answer, no draw
    with pytest.raises(RequestConflict):
        drawn_charge(led, "u", "r1", b"other", 0.75, draw("conflict"))
    with pytest.raises(BudgetExceeded):  # the pre-check refuses before drawing
        drawn_charge(led, "u", "r2", b"d2", 0.5, draw("over"))
    with pytest.raises(InvalidCharge):
        drawn_charge(led, "u", "r3", b"d3", 1e-13, draw("tiny"))
    assert held == [False]  # one draw in all, and no lock or transaction was held during it
    assert (led.user("u").requests, led.user("u").spent_units) == (1, 750_000_000_000)


def test_a_sample_the_transaction_refuses_is_discarded_unreleased(tmp_path: Path) -> None:
    """The pre-check passed, but while drawing, another request spent the budget: the drawn
    sample is thrown away, nothing is spent or stored, and the caller gets BudgetExceeded."""
    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)

    def draw_while_someone_spends() -> str:
        led.charge("u", "other", b"o", 0.6, resp("other"))
        return "never released"

    with pytest.raises(BudgetExceeded, match=r"only 0\.4 of 1 remains"):
        drawn_charge(led, "u", "r", b"d", 0.5, draw_while_someone_spends)
    assert led.lookup("u", "r") is None and led.user("u").spent_units == 600_000_000_000

    def draw_raises() -> str:
        raise RuntimeError("mechanism failed")

    with pytest.raises(RuntimeError):  # a failing draw spends nothing and stores nothing
        drawn_charge(led, "u", "r", b"d", 0.1, draw_raises)
    assert led.lookup("u", "r") is None and led.user("u").requests == 1


def test_concurrent_duplicates_draw_once_and_all_get_the_stored_answer(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "l.db", budget=5.0)
    draws: list[int] = []
    release = threading.Event()

    def slow_draw() -> str:
        draws.append(1)
        release.wait(10)  # every duplicate is in flight while the first one draws
        return f"sample-{len(draws)}"

    out: list[Charge] = []
    threads = [
        threading.Thread(target=lambda: out.append(drawn_charge(led, "u", "dup", b"d", 0.5, slow_draw)))
        for _ in range(12)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while led._flights.waiting(("u", "dup")) < 12 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert led._flights.waiting(("u", "dup")) == 12 and len(draws) == 1  # all twelve in flight, one drawing
    release.set()
    for t in threads:
        t.join(10)
    assert len(draws) == 1 and len(out) == 12
    assert {said(c, 3) for c in out} == {"sample-1|4.500"}
    assert sorted(c.replayed for c in out) == [False] + [True] * 11
    assert (led.user("u").requests, led.user("u").spent_units) == (1, 500_000_000_000)
    assert led._flights._flights == {}  # no per-request lock is left behind


def test_float_charges_are_converted_once_and_refusals_every_time() -> None:
    from recsvc.ledger import units as ledger_units

    before = ledger_units._float_charge_units.cache_info()
    assert [charge_units(0.3) for _ in range(3)] == [300_000_000_000] * 3
    after = ledger_units._float_charge_units.cache_info()
    assert after.hits - before.hits >= 2
    for _ in range(2):  # a refusal is never cached: raised on every call
        with pytest.raises(InvalidCharge, match="below the ledger's unit"):
            charge_units(4e-13)
    assert charge_units(3) == 3 * 10**12 and charge_units(1e-12) == 1  # ints take the uncached path


def test_the_largest_sendable_epsilon_is_the_documented_double() -> None:
    """docs/reference/grpc-api.md: 9223372.036854774 is the largest double the 63-bit units hold."""
    largest = 9223372.036854774
    assert charge_units(largest) == 9223372036854774000 <= 2**63 - 1
    with pytest.raises(InvalidCharge):
        charge_units(math.nextafter(largest, math.inf))
    assert charge_units(1.0000000000001) == 1000000000001  # epsilon_spent: ε rounded up to 1e-12
