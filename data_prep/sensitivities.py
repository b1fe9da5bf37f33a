"""Per-item clip ranges and sensitivities from a population of users (docs/reference/specification.md §4 step 5), and
the population's Spearman statistics (step 6).

For item a: lo = p_lo and hi = p_hi percentile (numpy's default linear interpolation) of a's
dense score over the population users whose input does NOT contain a, exact zeros included;
Δ = max(hi − lo, 1e-6). Items no such user exists for get lo = hi = 0 (Δ = 1e-6).

Scores of all population users × items do not fit in memory at scale, so they go to a scratch
file laid out in item-column blocks (block-major): a chunk of users is written as one
contiguous piece per block, and a block of items is read back contiguously for its exact
percentiles. Peak memory is one user chunk or one item block, whatever the population size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recsvc.artifact import MIN_SENSITIVITY
from recsvc.model import TopK
from recsvc.stats import spearman_rows

BLOCK_BYTES = 64 << 20


def percentiles_along_rows(values: np.ndarray, q: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of ``values`` (NaN = excluded): the two percentiles and the count included.

    Same definition as ``np.nanpercentile(..., method="linear")``, vectorised over columns.
    """
    s = np.sort(values, axis=0)  # NaN sorts last
    count = (~np.isnan(values)).sum(axis=0)
    cols = np.arange(values.shape[1])
    out = []
    for p in q:
        pos = np.maximum(count - 1, 0) * (p / 100.0)
        lo_i = np.floor(pos).astype(np.int64)
        hi_i = np.minimum(lo_i + 1, np.maximum(count - 1, 0))
        frac = pos - lo_i
        a, b = s[lo_i, cols], s[hi_i, cols]
        d = b - a  # NaN only for an empty column, which has no percentile
        # numpy's _lerp, term for term, so results equal np.nanpercentile bit for bit.
        v = np.where(frac >= 0.5, b - d * (1 - frac), a + d * frac)
        out.append(np.where(count > 0, v, 0.0))
    return out[0], out[1], count


@dataclass
class BlockStore:
    """A users × items float64 matrix on disk, stored as item-column blocks."""

    path: Path
    users: int
    items: int
    block: int

    @classmethod
    def create(cls, path: Path, users: int, items: int) -> BlockStore:
        block = max(1, min(items, BLOCK_BYTES // (8 * max(users, 1))))
        with open(path, "wb") as f:
            f.truncate(8 * users * items)
        return cls(path, users, items, block)

    def blocks(self) -> list[range]:
        return [range(s, min(s + self.block, self.items)) for s in range(0, self.items, self.block)]

    def _offset(self, cols: range, row: int) -> int:
        return 8 * (cols.start * self.users + row * len(cols))

    def write_rows(self, row0: int, values: np.ndarray) -> None:
        with open(self.path, "r+b") as f:
            for cols in self.blocks():
                f.seek(self._offset(cols, row0))
                f.write(np.ascontiguousarray(values[:, cols.start : cols.stop], dtype=np.float64).tobytes())

    def read_block(self, cols: range) -> np.ndarray:
        with open(self.path, "rb") as f:
            f.seek(self._offset(cols, 0))
            data = np.fromfile(f, dtype=np.float64, count=self.users * len(cols))
        return data.reshape(self.users, len(cols))


@dataclass(frozen=True)
class ItemRanges:
    lo: np.ndarray
    hi: np.ndarray
    count: np.ndarray  # population users that scored each item (input does not contain it)

    @property
    def sensitivity(self) -> np.ndarray:
        return np.maximum(self.hi - self.lo, MIN_SENSITIVITY)


def item_ranges(store: BlockStore, q: tuple[float, float], progress=None) -> ItemRanges:
    lo = np.zeros(store.items)
    hi = np.zeros(store.items)
    count = np.zeros(store.items, dtype=np.int64)
    for cols in store.blocks():
        lo[cols.start : cols.stop], hi[cols.start : cols.stop], count[cols.start : cols.stop] = percentiles_along_rows(
            store.read_block(cols), q
        )
        if progress is not None:
            progress(len(cols))
    return ItemRanges(lo, hi, count)


def population_spearman(top: TopK, ranges: ItemRanges, chunk_users: int = 1000) -> dict[str, float | int]:
    """Per population user: Spearman(clipped top-k scores, Δ of those items); summary stats.

    Users with fewer than 2 candidates have no defined ρ and are not counted; an undefined ρ
    (constant input) counts as 0, as in combined GEM. ``top`` may be disk-backed: it is read
    ``chunk_users`` rows at a time, so only the per-user ρ values are held in memory.
    """
    sens = ranges.sensitivity
    rhos: list[np.ndarray] = []
    for start in range(0, top.index.shape[0], chunk_users):
        idx = np.asarray(top.index[start : start + chunk_users])
        take = np.maximum(idx, 0)  # padding (−1) sits past each row's count and is ignored
        clipped = np.clip(np.asarray(top.score[start : start + chunk_users]), ranges.lo[take], ranges.hi[take])
        rho = spearman_rows(clipped, sens[take], (idx >= 0).sum(axis=1), undefined=0.0)
        rhos.append(rho[~np.isnan(rho)])  # NaN: fewer than 2 candidates, not counted
    rho = np.concatenate(rhos) if rhos else np.zeros(0)
    if rho.size == 0:
        return {"median": 0.0, "mean": 0.0, "frac_positive": 0.0, "users": 0}
    return {
        "median": float(np.median(rho)),
        "mean": float(rho.mean()),
        "frac_positive": float((rho > 0).mean()),
        "users": int(rho.size),
    }
