"""Streaming parsers for the large rating files (Netflix Prize, ML-20M ``ratings.csv``).

The file is read in blocks of whole lines; a compiled scanner turns each block into integer id
and rating arrays (no per-line strings or Python objects: 100 M ratings cost 12 bytes each).
The scanner takes only plain lines (digits, one optional decimal of a rating, no stray blanks);
any other line is handed to the loader's line parser (``slow``), which either reads it by the
dataset's full rules or raises the DataError that names the file and the line. So the rules
live in one place and big files keep the exact errors of small ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from data_prep.datasets.base import DataError

BLOCK_BYTES = 64 << 20
NETFLIX, CSV4 = 0, 1  # line formats: 'MovieID:' + 'user,rating,date'; 'user,item,rating,anything'
_MAX_DIGITS = 18  # longer ids go to the line parser (int64 range)

# slow(line_text, line_no, movie) -> (kind, a, b, c): kind 0 blank, 1 movie a, 2 rating (user a, item b, rating c)
SlowLine = Callable[[str, int, int], tuple[int, int, int, float]]


@numba.njit(cache=True, inline="always")
def _space(c: int) -> bool:
    return c == 32 or (9 <= c <= 13)


@numba.njit(cache=True)
def _newlines(buf: np.ndarray, a: int, b: int) -> int:
    n = 0
    for k in range(a, b):
        n += buf[k] == 10
    return n


@numba.njit(cache=True)
def _digits(buf: np.ndarray, a: int, b: int) -> int:
    """The non-negative integer written in buf[a:b], or -1 if it is not plain digits."""
    if b <= a or b - a > _MAX_DIGITS:
        return -1
    v = 0
    for k in range(a, b):
        c = buf[k]
        if c < 48 or c > 57:
            return -1
        v = v * 10 + (c - 48)
    return v


@numba.njit(cache=True)
def _rating(buf: np.ndarray, a: int, b: int) -> float:
    """'D…' or 'D….D' as a float (exactly as strtod rounds), or -1.0 for anything else."""
    dot = -1
    for k in range(a, b):
        if buf[k] == 46:
            dot = k
            break
    if dot < 0:
        v = _digits(buf, a, b)
        return float(v) if v >= 0 else -1.0
    whole, frac = _digits(buf, a, dot), _digits(buf, dot + 1, b)
    if whole < 0 or frac < 0 or b - dot != 2 or whole > 10**15:
        return -1.0
    return (whole * 10 + frac) / 10.0


@numba.njit(cache=True)
def _scan(
    buf: np.ndarray,
    start: int,
    fmt: int,
    movie: int,
    users: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    n: int,
) -> tuple[int, int, int, int]:
    """Parses plain lines from ``start``; returns (stop, movie, n, unusual): unusual = 1 means the
    line at ``stop`` is not plain (the caller parses it and resumes after it)."""
    end = buf.size
    i = start
    while i < end:
        j = i
        while j < end and buf[j] != 10:
            j += 1
        a, b = i, j
        while a < b and _space(buf[a]):
            a += 1
        while b > a and _space(buf[b - 1]):
            b -= 1
        if a == b:
            i = j + 1
            continue
        if fmt == NETFLIX and buf[b - 1] == 58:
            m = _digits(buf, a, b - 1)
            if m < 0:
                return i, movie, n, 1
            movie = m
            i = j + 1
            continue
        if fmt == NETFLIX and movie < 0:
            return i, movie, n, 1
        c0 = c1 = c2 = -1
        found = 0
        for k in range(a, b):
            if buf[k] == 44:
                if found == 0:
                    c0 = k
                elif found == 1:
                    c1 = k
                elif found == 2:
                    c2 = k
                else:
                    return i, movie, n, 1
                found += 1
        want = 2 if fmt == NETFLIX else 3
        if found != want:
            return i, movie, n, 1
        u = _digits(buf, a, c0)
        if fmt == NETFLIX:
            it, r = movie, _rating(buf, c0 + 1, c1)
            tail_a = c1 + 1
        else:
            it, r = _digits(buf, c0 + 1, c1), _rating(buf, c1 + 1, c2)
            tail_a = c2 + 1
        if u < 0 or it < 0 or r < 0 or tail_a >= b or _space(buf[tail_a]):
            return i, movie, n, 1
        users[n], items[n], ratings[n] = u, it, r
        n += 1
        i = j + 1
    return end, movie, n, 0


@dataclass
class Parsed:
    users: np.ndarray  # int64 ids
    items: np.ndarray  # int64 ids
    ratings: np.ndarray  # float32
    movie: int  # the last 'MovieID:' seen (Netflix), −1 if none


def parse(path: Path, fmt: int, slow: SlowLine, first_line: int = 1, skip_bytes: int = 0) -> Parsed:
    """All ratings of ``path`` (from byte ``skip_bytes``, which is line ``first_line``), read
    ``BLOCK_BYTES`` at a time."""
    users: list[np.ndarray] = []
    items: list[np.ndarray] = []
    ratings: list[np.ndarray] = []
    movie, line_no, carry = -1, first_line, b""
    with open(path, "rb") as f:
        f.seek(skip_bytes)
        while True:
            block = f.read(BLOCK_BYTES)  # looked up per call: tests shrink it
            data = carry + block
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if block else len(data)
            carry, data = data[cut:], data[:cut]
            buf = np.frombuffer(data, dtype=np.uint8)
            lines = _newlines(buf, 0, buf.size)
            cap = lines + 1
            out_u, out_i = np.empty(cap, np.int64), np.empty(cap, np.int64)
            out_r, n, pos = np.empty(cap, np.float64), 0, 0
            while pos < buf.size:
                stop, movie, n, unusual = _scan(buf, pos, fmt, movie, out_u, out_i, out_r, n)
                if not unusual:
                    break
                eol = data.find(b"\n", stop)
                eol = len(data) if eol < 0 else eol
                at = line_no + _newlines(buf, 0, stop)
                try:
                    text = data[stop:eol].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}, line {at}: not UTF-8 text ({exc}); expected a text file") from None
                kind, a, b, c = slow(text, at, movie)
                if kind == 1:
                    movie = a
                elif kind == 2:
                    out_u[n], out_i[n], out_r[n] = a, b, c
                    n += 1
                pos = eol + 1
            line_no += lines
            users.append(_narrow(out_u[:n]))
            items.append(_narrow(out_i[:n]))
            ratings.append(out_r[:n].astype(np.float32))
            if not block:
                break
    return Parsed(_cat(users, np.int32), _cat(items, np.int32), _cat(ratings, np.float32), movie)


def _narrow(ids: np.ndarray) -> np.ndarray:
    """int32 when the block's ids fit (they always do in Netflix and MovieLens): half the memory."""
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        return ids.copy()
    return ids.astype(np.int32)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
