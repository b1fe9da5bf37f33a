"""SelectBatch's fast path: one draw per mechanism group, one ledger transaction per batch.

Every item is checked and clipped by :meth:`recsvc.service.selection.Selector.prepare_many`
(so an item's refusals are exactly a single Select's). Then :func:`execute_batch` reads as a
single Select does (:mod:`recsvc.ledger.base`): reserve all items on one snapshot (replays,
conflicts and refusals draw nothing), draw the rest holding no ledger lock, and commit them all
in ONE transaction with per-item outcomes.

The draw: single-item answers (k = 1) of a mechanism with a ``rows`` sampler (rnm, pf) are drawn
together, one compiled pass per mechanism and parameters, from this thread's CSPRNG
(:func:`recsvc.mechanisms.draw_rows`: the words the per-item draws would take, in their order,
so each item's answer has a single Select's law). Everything else (slates, other mechanisms,
heavy random-stopping draws) is drawn item by item as Select draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from recsvc.ledger import BatchItem, Drawn, Ledger
from recsvc.mechanisms import ValidSlate, draw_rows, rows_drawable
from recsvc.rng import thread_csprng
from recsvc.service.requests import Prepared, Selected, draw
from recsvc.service.selection import Selector


def draw_many(
    selector: Selector, prepared: Sequence[Prepared], rng: np.random.Generator
) -> list[np.ndarray | Exception]:
    """Each item's slate (candidate indices), drawn together per mechanism group where possible;
    an item whose draw failed gets the exception (it is then refused alone, nothing spent)."""
    out: list[np.ndarray | Exception | None] = [None] * len(prepared)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prepared):
        if isinstance(p.valid, ValidSlate) and rows_drawable(p.valid):
            groups.setdefault((p.mechanism, tuple(p.valid.values.items())), []).append(i)
    for idx in groups.values():
        try:
            picked = draw_rows([prepared[i].valid for i in idx], rng)  # type: ignore[misc]  # ValidSlate, above
        except Exception as exc:
            for i in idx:
                out[i] = exc
            continue
        for i, j in zip(idx, picked.tolist(), strict=True):
            out[i] = np.array([j], np.int64)
    for i, p in enumerate(prepared):
        if out[i] is None:  # as Select draws it; a heavy draw is made by a draw process
            try:
                out[i] = selector.heavy.draw(p, partial(draw, p, rng))
            except Exception as exc:
                out[i] = exc
    return out  # type: ignore[return-value]  # the loop above replaced every None


def items_of(prepared: Sequence[Prepared]) -> list[BatchItem]:
    """What the ledger reserves for each prepared item."""
    return [BatchItem(p.user_id, p.request_id, p.fingerprint, p.charge, p.mechanism) for p in prepared]


def execute_batch(selector: Selector, ledger: Ledger, prepared: Sequence[Prepared]) -> list[Selected | Exception]:
    """Charges every prepared item in one ledger transaction (either store); one outcome per item,
    in order: its answer, or the exception that refused it (nothing spent)."""
    with ledger.reserve_batch(items_of(prepared)) as reserved:
        todo = [prepared[i] for i in reserved.todo]
        picked = draw_many(selector, todo, thread_csprng()) if todo else []
        drawn = [s if isinstance(s, Exception) else Drawn(*p.answer(s)) for p, s in zip(todo, picked, strict=True)]
        charged = ledger.commit_batch(reserved, drawn)
    return [
        c if isinstance(c, Exception) else Selected(c.answer, p.request_id, c.replayed)
        for p, c in zip(prepared, charged, strict=True)
    ]
