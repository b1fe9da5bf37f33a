"""The multi-selection device in Python (docs/reference/client-bundle.md): a history's code (its
best item of the bundle's codebook) sent by exact C-ary randomised response, or its clipped
embedding's exactly ε-DP lattice signal (integers), and the local re-rank of the server's k items
with the true SANSA scores. Everything here runs on the user's side; nothing of it is sent but the
signal.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError
from recsvc.model import Model
from recsvc.multiselection import (
    Lattice,
    Words,
    check_radius,
    clip_l1,
    code_of,
    embed,
    local_choice,
    randomized_response,
)

if TYPE_CHECKING:
    from recsvc.artifact import ClientBundle

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_ROWS_KEPT = 8  # histories whose rows a Device keeps


@dataclass(frozen=True, eq=False)  # array fields: == would be ambiguous
class Device:
    """The public parts a device needs: the embedding factors E (n × d, rows in the model's item
    order), the L1 radius R, the embedding version the server expects, the scoring model, and the
    code signal's codebook (item rows) and its version."""

    model: Model
    factors: Floats
    radius: float
    version: str
    codebook: Ints
    codebook_version: str

    def __post_init__(self) -> None:
        n = len(self.model.item_ids)
        if self.factors.ndim != 2 or self.factors.shape[0] != n:
            raise ParamError(
                "the embedding factors must have one row per item ({n} x d); got shape {shape}",
                n=n,
                shape=str(self.factors.shape),
            )
        check_radius(self.radius)
        book = np.asarray(self.codebook)
        if book.ndim != 1 or book.size < 2 or np.unique(book).size != book.size or not ((book >= 0) & (book < n)).all():
            raise ParamError(
                "the codebook must be ≥ 2 distinct item rows below {n}; got {value}", n=n, value=repr(book)
            )

    @classmethod
    def of(cls, bundle: ClientBundle) -> Device:
        return cls(
            bundle.model, bundle.embedding, bundle.radius, bundle.version, bundle.codebook, bundle.codebook_version
        )

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Device:
        """The device of the client bundle in ``directory`` (an artifact's ``client/``), every file
        checked (:func:`recsvc.artifact.read_client_bundle`)."""
        from recsvc.artifact import read_client_bundle

        return cls.of(read_client_bundle(Path(directory)))

    @property
    def dim(self) -> int:
        return int(self.factors.shape[1])

    @property
    def lattice(self) -> Lattice:
        """The bundle's grid: step g = R/4096 and integer L1 radius K (the wire's grid_step)."""
        return Lattice.of(self.radius, self.dim)

    def rows(self, history: Iterable[str]) -> npt.NDArray[np.int64]:
        """The distinct rows of the history's items, ascending; ids not in the bundle are skipped.
        The last few histories' rows are kept: one request asks for them three times (its
        signal's memory, the code, the re-rank)."""
        key = tuple(map(str, history))
        cache, lock = self._rows
        hit = cache.get(key)
        if hit is not None:
            return hit.copy()  # a copy: the caller may write to it (and numba compiles for writable arrays)
        index = self.model.index
        rows = np.array(sorted({index[i] for i in key if i in index}), dtype=np.int64)
        with lock:
            cache[key] = rows
            if len(cache) > _ROWS_KEPT:
                cache.pop(next(iter(cache)))
        return rows.copy()

    @cached_property
    def _rows(self) -> tuple[dict[tuple[str, ...], Ints], threading.Lock]:
        return {}, threading.Lock()

    def embedding(self, history: Iterable[str]) -> Floats:
        """The history's embedding, clipped to the L1 ball of radius R."""
        return clip_l1(embed(self.rows(history), self.factors), self.radius)

    def signal(self, history: Iterable[str], epsilon: float, rng: np.random.Generator | Words) -> Ints:
        """What the device sends: the clipped embedding's lattice point plus exact discrete Laplace
        noise, integers (:meth:`recsvc.multiselection.Lattice.signal`). Pass a CSPRNG
        (:func:`recsvc.rng.csprng`), or fixed ``Words`` to reproduce a test vector."""
        words = rng if isinstance(rng, Words) else Words(rng)
        return self.lattice.signal(self.embedding(history), epsilon, words)

    @property
    def code_size(self) -> int:
        return int(self.codebook.shape[0])

    def code(self, history: Iterable[str]) -> int:
        """The history's code: the index of its best codebook item by the true scores (seen items
        −∞), the earlier on ties, 0 when all are seen."""
        rows = self.rows(history)
        s = self.model.score_items(rows, self.codebook)
        s[_seen(self.codebook, rows)] = -np.inf
        return code_of(s)

    def code_signal(self, history: Iterable[str], epsilon: float, rng: np.random.Generator | Words) -> int:
        """What the device sends by default: its code by exact C-ary randomised response
        (:func:`recsvc.multiselection.randomized_response`). Pass a CSPRNG (:func:`recsvc.rng.csprng`),
        or fixed ``Words`` to reproduce a test vector."""
        words = rng if isinstance(rng, Words) else Words(rng)
        return randomized_response(self.code(history), self.code_size, epsilon, words)

    def scores(self, history: Iterable[str], item_ids: Sequence[str]) -> Floats:
        """The true SANSA scores of ``item_ids`` for the history (x W1 W2), −∞ for history items."""
        index = self.model.index
        unknown = [i for i in item_ids if i not in index]
        if unknown:
            raise ParamError(
                "the server returned {count} item id(s) not in the client bundle, e.g. {example}; "
                "expected the bundle of the artifact the server serves",
                count=len(unknown),
                example=repr(unknown[0]),
            )
        rows = self.rows(history)
        items = np.array([index[i] for i in item_ids], dtype=np.int64)
        s = self.model.score_items(rows, items)
        s[_seen(items, rows)] = -np.inf
        return np.asarray(s, dtype=np.float64)

    def choose(self, history: Iterable[str], item_ids: Sequence[str]) -> int:
        """The index in ``item_ids`` of the item the device keeps (the best true score, ties to
        the earlier item)."""
        return local_choice(self.scores(list(history), item_ids))


def _seen(items: Ints, rows: Ints) -> npt.NDArray[np.bool_]:
    """Which ``items`` are among the sorted ``rows`` (a binary search: faster than np.isin here)."""
    if rows.size == 0:
        return np.zeros(items.shape, dtype=bool)
    at = np.minimum(np.searchsorted(rows, items), rows.size - 1)
    return np.asarray(rows[at] == items)


SIGNAL_KINDS = ("code", "lattice")  # what a device may send; "code" is the bundle's default


class SignalMemory:
    """The signals a device sent, by (user_id, request_id), so that a repeated request resends the
    SAME signal: a fresh draw under a request_id the server has seen would give it a second,
    independent look at the history while it charges ε once (it refuses the mismatch, but only
    after seeing it). A request_id reused with another history, ε, k, signal kind or bundle is
    refused here, before anything is drawn. Holds the last ``size`` requests; thread-safe."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._sent: OrderedDict[tuple[str, str], tuple[tuple[object, ...], int | Ints]] = OrderedDict()
        self._lock = threading.Lock()

    def signal(
        self,
        device: Device,
        user_id: str,
        request_id: str,
        history: Sequence[str],
        epsilon: float,
        k: int,
        rng: np.random.Generator,
        kind: str = "code",
    ) -> int | Ints:
        """The signal of this request: the one sent before under (user_id, request_id), else a
        fresh :meth:`Device.code_signal` (``kind`` "code") or :meth:`Device.signal` ("lattice"),
        remembered."""
        if kind not in SIGNAL_KINDS:
            raise ParamError("signal must be one of {kinds}; got {value}", kinds=SIGNAL_KINDS, value=repr(kind))
        bundle = (device.version, device.codebook_version)
        inputs = (bundle, kind, tuple(device.rows(history).tolist()), float(epsilon), int(k))
        key = (user_id, request_id)
        with self._lock:
            sent = self._sent.get(key)
            if sent is not None:
                if sent[0] != inputs:
                    raise ParamError(
                        "{request_id} {value} was already sent by this device with another history, "
                        "epsilon, k, signal kind or bundle; a new request needs a new request_id",
                        value=repr(request_id),
                    )
                self._sent.move_to_end(key)
                return sent[1]
            signal: int | Ints = (
                device.code_signal(history, epsilon, rng) if kind == "code" else device.signal(history, epsilon, rng)
            )
            self._sent[key] = (inputs, signal)
            if len(self._sent) > self.size:
                self._sent.popitem(last=False)
            return signal
