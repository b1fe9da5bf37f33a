"""SelectBatch's fast path: one vectorised draw per mechanism group, one ledger transaction per batch.

Every item is checked and clipped by :meth:`recsvc.service.selection.Selector.prepare_many`
(so an item's refusals are exactly a single Select's). Then :func:`execute_batch` reads as a
single Select does (:mod:`recsvc.ledger.base`): reserve all items on one snapshot (replays,
conflicts and refusals draw nothing), draw the rest holding no ledger lock, and commit them all
in ONE transaction with per-item outcomes.

The draw: single-item answers (k = 1) of a mechanism :func:`recsvc.mechanisms.select_rows`
vectorises (rnm, rnm_laplace, pf) are drawn together, one call per mechanism, from this
thread's CSPRNG; ``select_rows`` makes exactly the draws the per-item path would make in the
same order, so each item's answer has a single Select's distribution. Everything else (slates,
other mechanisms, heavy random-stopping draws) is drawn item by item as Select draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from recsvc.ledger import BatchItem, Drawn, Ledger
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
    for i, p in enumerate(prepared):
        if out[i] is None:  # as Select draws it; a heavy draw is made by a draw process
            try:
                out[i] = selector.heavy.draw(p, partial(draw, p, rng))
            except Exception as exc:
                out[i] = exc
    return out  # type: ignore[return-value]  # the loop above replaced every None


def execute_batch(selector: Selector, ledger: Ledger, prepared: Sequence[Prepared]) -> list[Selected | Exception]:
    """Charges every prepared item in one ledger transaction (either store); one outcome per item,
    in order: its answer, or the exception that refused it (nothing spent)."""
    items = [BatchItem(p.user_id, p.request_id, p.fingerprint, p.charge, p.mechanism) for p in prepared]
    with ledger.reserve_batch(items) as reserved:
        todo = [prepared[i] for i in reserved.todo]
        picked = draw_many(selector, todo, thread_csprng()) if todo else []
        drawn = [s if isinstance(s, Exception) else Drawn(*p.answer(s)) for p, s in zip(todo, picked, strict=True)]
        charged = ledger.commit_batch(reserved, drawn)
    return [
        c if isinstance(c, Exception) else Selected(c.answer, p.request_id, c.replayed)
        for p, c in zip(prepared, charged, strict=True)
    ]
