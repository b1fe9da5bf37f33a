"""SelectBatch's fast path: one vectorised draw per mechanism group, one ledger transaction per batch.

Every item is checked and clipped by :meth:`recsvc.service.selection.Selector.prepare_many`
(so an item's refusals are exactly a single Select's). Then :func:`execute_batch` follows the
ledger's batch protocol (:meth:`recsvc.ledger.Ledger.draw_and_charge_batch`): pre-check all items on one
snapshot (replays, conflicts and refusals draw nothing), draw the rest OUTSIDE any lock, and
charge them all in ONE transaction with per-item outcomes.

The draw: single-item answers (k = 1) of a mechanism :func:`recsvc.mechanisms.select_rows`
vectorises (rnm, rnm_laplace, pf) are drawn together, one call per mechanism, from this
thread's CSPRNG; ``select_rows`` makes exactly the draws the per-item path would make in the
same order, so each item's answer has a single Select's distribution. Everything else (slates,
other mechanisms, heavy random-stopping draws) is drawn item by item as Select draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from recsvc.ledger import BatchItem, Charge, Ledger
from recsvc.ledger.units import charge_units, to_epsilon
from recsvc.mechanisms.rows import VECTORISED, select_rows
from recsvc.rng import thread_csprng
from recsvc.service.requests import Prepared, Selected, draw
from recsvc.service.selection import Selector


def vectorisable(p: Prepared) -> bool:
    return p.k == 1 and p.stage is None and p.mechanism in VECTORISED


def joined(ps: Sequence[Prepared], column: str) -> np.ndarray:
    """``np.concatenate`` of the items' ``column`` (scores or sensitivities), without the copy when
    they are adjacent slices of one array, in order: Selector.prepare_many clips a batch as ONE array.
    Adjacency is read off the slices' own addresses in their base, so nothing else has to record it."""
    parts = [getattr(p, column) for p in ps]
    base = parts[0].base
    if not isinstance(base, np.ndarray) or base.ndim != 1 or not base.flags.c_contiguous:
        return np.concatenate(parts)
    step, origin = base.itemsize, base.ctypes.data
    start = end = (parts[0].ctypes.data - origin) // step
    for a in parts:
        in_place = a.base is base and a.dtype == base.dtype and a.flags.c_contiguous
        if not in_place or a.ctypes.data != origin + end * step:
            return np.concatenate(parts)
        end += a.size
    return base[start:end]


def draw_many(
    selector: Selector, prepared: Sequence[Prepared], rng: np.random.Generator
) -> list[np.ndarray | Exception]:
    """Each item's slate (candidate indices), vectorised per mechanism group where possible; an
    item whose draw failed gets the exception (it is then refused alone, nothing spent)."""
    out: list[np.ndarray | Exception | None] = [None] * len(prepared)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prepared):
        if vectorisable(p):
            groups.setdefault(p.mechanism, []).append(i)
    for name, idx in groups.items():
        ps = [prepared[i] for i in idx]
        try:
            picked = select_rows(
                name,
                joined(ps, "scores"),
                joined(ps, "sensitivities"),
                np.array([p.scores.size for p in ps]),
                np.array([p.epsilon for p in ps]),
                rng,
            )
        except Exception as exc:
            for i in idx:
                out[i] = exc
            continue
        for i, j in zip(idx, picked.tolist(), strict=False):
            out[i] = np.array([j], np.int64)
    allow = selector.policy.selection.allow_non_private
    for i, p in enumerate(prepared):
        if out[i] is None:  # as Select draws it; a heavy draw is made by a draw process
            try:
                out[i] = selector.heavy.draw(p, allow, partial(draw, p, rng, allow))
            except Exception as exc:
                out[i] = exc
    return out  # type: ignore[return-value]  # the loop above replaced every None


def execute_batch(
    selector: Selector, ledger: Ledger, prepared: Sequence[Prepared], encode: Callable[[Selected], bytes]
) -> list[Charge | Exception]:
    """Charges every prepared item in one ledger transaction (either store); one outcome per item, in order."""
    items = [BatchItem(p.user_id, p.request_id, p.fingerprint, p.charge, p.mechanism) for p in prepared]

    def draws(todo: list[int]) -> list[np.ndarray | Exception]:  # no lock held
        return draw_many(selector, [prepared[i] for i in todo], thread_csprng())

    def build(i: int, picked: np.ndarray, remaining: float) -> bytes:  # inside the transaction: encoding only
        p = prepared[i]
        ids, rows = p.answer(picked)
        return encode(Selected(ids, p.mechanism, to_epsilon(charge_units(p.charge)), remaining, p.request_id, rows))

    return ledger.draw_and_charge_batch(items, draws, build)
