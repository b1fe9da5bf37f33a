"""Each test user's candidates as rectangular per-user rows (users × rank), from either of two
sources with identical results:

- :class:`MappedRows`: ``candidates/{user_ids,item_index,scores}.npy``, which ``recsvc prep``
  writes beside ``candidates.parquet`` (:func:`write_candidate_arrays`). Every reader process
  opens them with ``np.load(mmap_mode="r")``, so processes on one host share the page cache and a
  chunk reads only its own rows (docs/reference/artifact-format.md#memory-mapped-candidates).
- :class:`UserRows`: a candidates-schema table cut into rows; artifacts written without the
  arrays, and ``population.parquet``, are read this way.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import polars as pl

from recsvc.artifact.format import (
    CANDIDATE_ITEM_INDEX,
    CANDIDATE_SCORES,
    CANDIDATE_USER_IDS,
    ITEMS,
    ArtifactError,
)

Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # user ids, item index, raw scores, counts


@dataclass(frozen=True)
class CandidateMatrix:
    """Candidates as rectangular arrays (users × n), padded where a user has fewer than n.

    ``count[b]`` is user b's real candidate count; padded slots have score −inf, Δ 1 and
    item index −1. Scores here are RAW; :meth:`clipped` applies each item's clip range.
    """

    user_ids: np.ndarray  # (B,) str
    item_index: np.ndarray  # (B, n) int64 row in items, −1 for padding
    scores: np.ndarray  # (B, n) float64 raw
    lo: np.ndarray  # (B, n)
    hi: np.ndarray  # (B, n)
    sensitivity: np.ndarray  # (B, n)
    count: np.ndarray  # (B,) int

    def clipped(self) -> np.ndarray:
        return np.clip(self.scores, self.lo, self.hi)

    def take(self, rows: np.ndarray) -> CandidateMatrix:
        """Only the users ``rows`` (indices into this matrix)."""
        return CandidateMatrix(*(getattr(self, f.name)[rows] for f in fields(self)))


class CandidateRows(abc.ABC):
    """Per-user rectangular candidate rows over the artifact's ``items``, from either source."""

    items: pl.DataFrame
    user_ids: np.ndarray  # every user, in artifact order (the order of :meth:`matrix` rows)

    @abc.abstractmethod
    def rows(self, users: int | None = None, start: int = 0) -> Rows:
        """(user ids, item index (B, n) int64, raw scores (B, n), counts) of ``users`` users from
        position ``start``, n the slice's largest count; only that slice is materialised."""

    def matrix(self, users: int | None = None, start: int = 0) -> CandidateMatrix:
        """``users`` users from position ``start`` (all remaining if None), −1/−inf padded and
        completed with each item's clip range and Δ; only that slice is materialised, so callers
        can walk the users in bounded-memory chunks."""
        user_ids, idx, scores, counts = self.rows(users, start)
        pad = idx < 0
        take = np.where(pad, 0, idx)
        lo = np.where(pad, -np.inf, self.items["lo"].to_numpy()[take])
        hi = np.where(pad, -np.inf, self.items["hi"].to_numpy()[take])
        sens = np.where(pad, 1.0, self.items["sensitivity"].to_numpy()[take])
        return CandidateMatrix(user_ids, idx, scores, lo, hi, sens, counts)


def _slice(total: int, users: int | None, start: int) -> tuple[int, int]:
    if start < 0 or (users is not None and users < 0):
        raise ValueError(f"candidate_matrix: start and users must be ≥ 0, got start={start}, users={users}")
    stop = total if users is None else min(total, start + users)
    return min(start, total), stop


class UserRows(CandidateRows):
    """A candidates-schema table (``candidates.parquet`` or ``population.parquet``) cut into
    per-user rectangular arrays over the artifact's items."""

    def __init__(self, frame: pl.DataFrame, items: pl.DataFrame, item_index: dict[str, int], what: str) -> None:
        self.sorted = frame.sort(["user_id", "rank"], maintain_order=True)
        self.items, self.item_index, self.what = items, item_index, what
        self.user_ids = self.sorted["user_id"].unique(maintain_order=True).to_numpy().astype(str)
        # Row offset of each user's first candidate in the sorted frame (+ the total at the end).
        counts = self.sorted.group_by("user_id", maintain_order=True).len()["len"].to_numpy()
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def rows(self, users: int | None = None, start: int = 0) -> Rows:
        start, stop = _slice(len(self.user_ids), users, start)
        offs = self.offsets
        cands = self.sorted.slice(int(offs[start]), int(offs[stop] - offs[start]))
        user_ids = self.user_ids[start:stop]
        row_of_user = {u: i for i, u in enumerate(user_ids.tolist())}
        rows = np.fromiter((row_of_user[u] for u in cands["user_id"].to_list()), np.int64, cands.height)
        counts = np.bincount(rows, minlength=len(user_ids))
        n = int(counts.max()) if len(counts) else 0
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        cols = np.arange(cands.height) - starts[rows]
        idx = np.full((len(user_ids), n), -1, dtype=np.int64)
        try:
            idx[rows, cols] = np.fromiter(
                (self.item_index[i] for i in cands["item_id"].to_list()), np.int64, cands.height
            )
        except KeyError as exc:
            raise ArtifactError(f"{self.what}: item_id {exc.args[0]!r} is not in {ITEMS}") from None
        scores = np.full((len(user_ids), n), -np.inf)
        scores[rows, cols] = cands["score"].to_numpy()
        return user_ids, idx, scores, counts


def _open(path: Path, ndim: int, kind: str) -> np.ndarray:
    """``path`` memory-mapped read-only, checked to be an ``ndim``-dimensional array of dtype kind
    ``kind`` (no pickles: an .npy of objects is refused)."""
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(
            f"{path} is not a readable .npy array ({exc}); expected the file `recsvc prep` wrote"
        ) from None
    if a.ndim != ndim or a.dtype.kind != kind:
        raise ArtifactError(
            f"{path}: dtype {a.dtype}, shape {a.shape}; expected {ndim} dimensions of dtype kind {kind!r}"
        )
    return a


class MappedRows(CandidateRows):
    """The memory-mapped candidate arrays of an artifact: user ids (U,) str, item index (U, n)
    int32 (rows of items.parquet, −1 pads) and raw scores (U, n) float64 (−inf pads), users in
    :class:`UserRows`'s order. Only the rows a caller asks for are read and checked."""

    def __init__(self, directory: Path, items: pl.DataFrame) -> None:
        self.directory, self.items = directory, items
        self.user_ids = np.array(_open(directory / CANDIDATE_USER_IDS, 1, "U"))  # small: read whole
        self.item_index = _open(directory / CANDIDATE_ITEM_INDEX, 2, "i")
        self.scores = _open(directory / CANDIDATE_SCORES, 2, "f")
        if self.item_index.dtype != np.int32 or self.scores.dtype != np.float64:
            raise ArtifactError(
                f"{directory}: item index {self.item_index.dtype} and scores {self.scores.dtype}; "
                "expected int32 and float64"
            )
        if not (self.item_index.shape == self.scores.shape and self.item_index.shape[0] == len(self.user_ids)):
            raise ArtifactError(
                f"{directory}: user ids {self.user_ids.shape}, item index {self.item_index.shape} and scores "
                f"{self.scores.shape} disagree; expected (U,), (U, n) and (U, n)"
            )

    def rows(self, users: int | None = None, start: int = 0) -> Rows:
        """The same arrays as :meth:`UserRows.rows`, read from the mapped files."""
        start, stop = _slice(len(self.user_ids), users, start)
        idx = np.asarray(self.item_index[start:stop])
        valid = idx >= 0
        counts = valid.sum(axis=1)
        n = int(counts.max()) if len(counts) else 0
        scores = np.array(self.scores[start:stop, :n])
        where = f"{self.directory / CANDIDATE_ITEM_INDEX}, users {start}..{stop - 1}"
        if (counts == 0).any() or (valid != (np.arange(idx.shape[1]) < counts[:, None])).any():
            raise ArtifactError(f"{where}: a user without candidates or with a gap; expected −1 only after the last")
        if (idx >= self.items.height).any() or (idx < -1).any():
            raise ArtifactError(f"{where}: an item index outside −1..{self.items.height - 1}; expected rows of {ITEMS}")
        valid = valid[:, :n]
        if not (np.isfinite(scores[valid]).all() and np.isneginf(scores[~valid]).all()):
            raise ArtifactError(
                f"{self.directory / CANDIDATE_SCORES}, users {start}..{stop - 1}: expected finite scores, −inf padding"
            )
        return self.user_ids[start:stop], idx[:, :n].astype(np.int64), scores, counts


def write_candidate_arrays(directory: Path, rows: UserRows, block: int = 4096) -> None:
    """Writes ``rows`` (the validated candidates table) as the arrays :class:`MappedRows` reads,
    into the new directory ``directory``, ``block`` users at a time (bounded memory)."""
    directory.mkdir()
    total = len(rows.user_ids)
    width = int(np.diff(rows.offsets).max()) if total else 0
    np.save(directory / CANDIDATE_USER_IDS, rows.user_ids, allow_pickle=False)
    item_index = np.lib.format.open_memmap(directory / CANDIDATE_ITEM_INDEX, "w+", np.int32, (total, width))
    scores = np.lib.format.open_memmap(directory / CANDIDATE_SCORES, "w+", np.float64, (total, width))
    for start in range(0, total, block):
        _, idx, sc, _ = rows.rows(block, start)
        b, n = idx.shape
        item_index[start : start + b, :n], item_index[start : start + b, n:] = idx, -1
        scores[start : start + b, :n], scores[start : start + b, n:] = sc, -np.inf
    item_index.flush()
    scores.flush()
    del item_index, scores  # unmapped: the files are complete before the manifest hashes them
