"""Scoring a selected feature set: accuracy against a reference set, the TOP / GREAT / GOOD
classes of Shekelyan & Loukides on the order statistics of the scores, and their 95% intervals."""

from __future__ import annotations

import math
import warnings

import numpy as np
import numpy.typing as npt
from scipy.stats import binomtest, ttest_ind

from eval.bandit.tables import ci as mean_ci

# class → (the share of k that must be the very top ranks, the share of k the rest must rank within)
CLASSES: dict[str, tuple[float, float]] = {"TOP": (1.0, 1.0), "GREAT": (0.1, 1.1), "GOOD": (0.01, 1.5)}


def accuracy(selected: np.ndarray, reference: np.ndarray, k: int) -> npt.NDArray[np.float64]:
    """|S ∩ R| / k for each row S of ``selected`` (rows of k feature indices)."""
    return np.isin(selected, reference).sum(axis=-1) / k


def class_bounds(name: str, k: int) -> tuple[int, int]:
    """(must, pool): the top ⌈share·k⌉ ranks must all be chosen and every choice must rank within
    the top ⌈share·k⌉. The ceilings keep GREAT and GOOD distinct from TOP at small k (k = 5:
    GREAT is the top 1 plus four of the top 6, GOOD the top 1 plus four of the top 8)."""
    must, pool = CLASSES[name]
    return min(k, math.ceil(must * k - 1e-9)), math.ceil(pool * k - 1e-9)


def rank_classes(selected: np.ndarray, scores: np.ndarray, k: int) -> dict[str, npt.NDArray[np.bool_]]:
    """For each row of ``selected`` and each class, whether the row is in it (ranks by descending
    score; the scores are continuous, so ties have probability 0)."""
    ranks = np.empty(scores.shape[0], dtype=np.int64)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(scores.shape[0])
    r = np.sort(ranks[np.atleast_2d(selected)], axis=-1)
    out = {}
    for name in CLASSES:
        must, pool = class_bounds(name, k)
        head = (r[:, :must] == np.arange(must)).all(axis=-1)
        out[name] = head & (r[:, -1] < pool)
    return out


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of a mean (the point for constant values)."""
    m, lo, hi = mean_ci(values)
    if math.isnan(lo):
        return m, m, m
    return m, max(0.0, lo), min(1.0, hi)


def rate_interval(hits: np.ndarray) -> tuple[float, float, float]:
    """(rate, low, high): the exact (Clopper–Pearson) 95% interval of a proportion."""
    n, x = int(hits.size), int(np.count_nonzero(hits))
    ci = binomtest(x, n).proportion_ci(0.95, method="exact")
    return x / n, float(ci.low), float(ci.high)


def compare(a: np.ndarray, b: np.ndarray, level: float = 0.05) -> tuple[int, float]:
    """(+1 if the mean of ``a`` is significantly above ``b``'s, −1 if below, 0 if neither; the
    p-value) by Welch's two-sided t-test at ``level``. Two constant samples differ (p = 0) iff
    their values do."""
    ma, mb = float(np.mean(a)), float(np.mean(b))
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return (0, 1.0) if ma == mb else (1 if ma > mb else -1, 0.0)
    with warnings.catch_warnings():  # nearly constant samples: scipy warns, the p-value still stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return ((1 if ma > mb else -1) if p < level else 0), p
