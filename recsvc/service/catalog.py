"""The artifact's catalog as the service sees it: public per-item data by items.parquet row, the
catalog version that row-encoded requests are tied to, and server-side SANSA over it.

A request names its candidates by item id or, in the compact encoding, by items.parquet ROW
(``SelectRequest.item_rows``). Rows mean something only for one item list, so a row-encoded
request carries the :func:`catalog_version` it was built for and the server refuses any other
(nothing spent). The version is a digest of the item ids in row order, computed here and only
here: replicas serving the same artifact report the same version.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import overload

import numba
import numpy as np

from recsvc.artifact import Artifact
from recsvc.service.errors import InvalidRequest, Unavailable

VERSION_PREFIX = "items-sha256:"


def short(s: str, limit: int = 64) -> str:
    """An id for an error message, cut to ``limit`` characters."""
    return repr(s if len(s) <= limit else s[:limit] + "…")


def catalog_version(item_ids: Iterable[str]) -> str:
    """SHA-256 of the item ids in row order (each UTF-8, length-prefixed, so no two lists collide)."""
    h = hashlib.sha256()
    for item in item_ids:
        data = item.encode()
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return VERSION_PREFIX + h.hexdigest()[:32]


class Catalog:
    """Public per-item data from the artifact, as arrays indexed by items.parquet row."""

    def __init__(self, artifact: Artifact) -> None:
        self.index: dict[str, int] = artifact.item_index
        self.item_ids: list[str] = artifact.items["item_id"].to_list()
        self.version = catalog_version(self.item_ids)
        self.lo = artifact.items["lo"].to_numpy().astype(np.float64)
        self.hi = artifact.items["hi"].to_numpy().astype(np.float64)
        self.sensitivity = artifact.items["sensitivity"].to_numpy().astype(np.float64)
        self._local = threading.local()

    def rows(self, *parts: Sequence[str]) -> np.ndarray:
        """The rows of the ids of ``parts`` in order, in one pass (straight from protobuf fields:
        no list); −1 for an unknown id."""
        count = sum(map(len, parts))
        try:  # every id known: the common case, without get's default per id
            return np.fromiter(map(self.index.__getitem__, chain.from_iterable(parts)), np.int64, count)
        except KeyError:
            return np.fromiter(map(self.index.get, chain.from_iterable(parts), repeat(-1, count)), np.int64, count)

    def unknown_id(self, item_ids: Sequence[str], rows: np.ndarray) -> InvalidRequest:
        pos = int(np.flatnonzero(rows < 0)[0])
        return InvalidRequest(
            f"unknown item_id {short(item_ids[pos])} (candidate #{pos}); expected an item_id "
            f"from the artifact's items.parquet ({len(self.item_ids)} items)"
        )

    def bad_row(self, rows: np.ndarray) -> InvalidRequest:
        pos = int(np.flatnonzero(rows >= len(self.item_ids))[0])
        return InvalidRequest(
            f"item_rows[{pos}] = {int(rows[pos])} is out of range; expected a row of the "
            f"artifact's items.parquet, 0 <= row < {len(self.item_ids)}"
        )

    def check_version(self, version: str, required: bool) -> None:
        """A row-encoded request must name this catalog; any request that names one must name this one."""
        if not version and required:
            raise InvalidRequest(
                f"item_rows without catalog_version; expected the catalog_version the rows "
                f"index (this server's is {self.version!r}, see ListMechanisms)"
            )
        if version and version != self.version:
            raise Unavailable(
                f"catalog_version {short(version)} is not this server's catalog ({self.version!r}); "
                "re-map the items with the artifact this server serves, nothing was spent"
            )

    def screen(self, rows: np.ndarray, raw: np.ndarray, lengths: np.ndarray) -> Screened:
        """Every candidate of several requests (their rows and raw scores concatenated, ``lengths``
        per request) clipped to its item's public [lo, hi], with its Δ, and what is wrong with each
        request, in one compiled pass. Clipping is what makes Δ a true bound
        (docs/reference/specification.md §1): never skip it."""
        slot = getattr(self._local, "slot", None)
        if slot is None:  # per thread; stamped per request, so it never needs clearing
            slot = self._local.slot = np.full(len(self.item_ids), -1, np.int64)
            self._local.stamp = 0
        stamp = self._local.stamp
        self._local.stamp = stamp + lengths.size
        q, d, flags = _screen(rows, raw, lengths, self.lo, self.hi, self.sensitivity, slot, stamp)
        return Screened(q, d, flags)


NONFINITE, BAD_ROW, DUPLICATE = 1, 2, 4  # Screened.flags bits


@dataclass(frozen=True)
class Screened:
    """:meth:`Catalog.screen`'s result: clipped scores and Δ (a request's bad rows get its raw
    score and Δ = 1), and per request the bits of what is wrong with its candidates."""

    scores: np.ndarray = field(repr=False)
    sensitivities: np.ndarray = field(repr=False)
    flags: np.ndarray  # int64 per request: NONFINITE | BAD_ROW | DUPLICATE


@numba.njit(cache=True, nogil=True)
def _screen(
    rows: np.ndarray,
    raw: np.ndarray,
    lengths: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    sens: np.ndarray,
    slot: np.ndarray,
    stamp: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """min(max(raw, lo), hi) (np.clip's formula) and Δ per candidate; per request, whether a score
    is not finite, a row is outside the catalog, or a row repeats (``slot`` holds the last
    request stamp that named each row)."""
    q = np.empty(raw.shape[0])
    d = np.empty(raw.shape[0])
    flags = np.zeros(lengths.shape[0], np.int64)
    n = lo.shape[0]
    j = 0
    for b in range(lengths.shape[0]):
        mark = stamp + b
        for _ in range(lengths[b]):
            r, x = rows[j], raw[j]
            if not math.isfinite(x):
                flags[b] |= 1
            if r < 0 or r >= n:
                flags[b] |= 2
                q[j], d[j] = x, 1.0
            else:
                if slot[r] == mark:
                    flags[b] |= 4
                slot[r] = mark
                q[j], d[j] = min(max(x, lo[r]), hi[r]), sens[r]
            j += 1
    return q, d, flags


class RowIds(Sequence[str]):
    """The item ids of a row-encoded request's candidates, looked up only when read (the answer's few)."""

    def __init__(self, catalog_ids: list[str], rows: np.ndarray) -> None:
        self.catalog_ids, self.rows = catalog_ids, rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.catalog_ids[r] for r in self.rows[i].tolist()]
        return self.catalog_ids[int(self.rows[i])]


class Recommender:
    """Server-side SANSA over the full catalog: history → raw scores of EVERY items.parquet row.

    Nothing is excluded: a seen item keeps its score (excluding it would make its probability 0
    depending on the history, outside the ε accounting); a client drops seen items from the
    answer itself, which is free post-processing. A catalog item the model has no column for
    scores 0, a constant that depends on no one's data.
    """

    def __init__(self, artifact: Artifact, catalog: Catalog) -> None:
        self.model = artifact.model
        self.index = self.model.index
        self.columns = len(self.model.item_ids)
        col = np.array([self.index.get(i, -1) for i in catalog.item_ids], np.int64)
        # items.parquet row → model column; None when they coincide (the pipeline's artifacts).
        self.col_of_row: np.ndarray | None = None if np.array_equal(col, np.arange(self.columns)) else col

    def scores(self, history: Sequence[str]) -> np.ndarray:
        """Raw SANSA scores of every catalog row (items.parquet order), seen items included. The
        history is a set, refused as Select's candidates are: an unknown or repeated item id is
        INVALID_ARGUMENT. An empty one is a user with no interactions (every score 0)."""
        first: dict[int, int] = {}
        for pos, item in enumerate(history):
            col = self.index.get(item)
            if col is None:
                raise InvalidRequest(
                    f"unknown item_id {short(item)} in history (position {pos}); expected item ids "
                    f"known to the model ({len(self.index)} items)"
                )
            if col in first:
                raise InvalidRequest(
                    f"duplicate item_id {short(item)} in history (positions {first[col]} and {pos}); "
                    "expected each item once"
                )
            first[col] = pos
        dense = self.model.score_one(np.sort(np.fromiter(first, np.int64, len(first))))
        if self.col_of_row is None:
            return dense
        return np.where(self.col_of_row >= 0, dense[self.col_of_row], 0.0)
