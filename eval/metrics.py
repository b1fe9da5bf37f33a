"""Per-user metrics, shared by the main evaluation (eval.evaluation) and multi-selection (eval.multiselect)
(docs/reference/specification.md §6; main paper §VIII and Appendix I).

All functions are row-wise over users: inputs are (users, n) arrays of clipped scores and
sensitivities, and optional ``count`` (users,) for padded rows (only the first count[b]
columns of row b are real candidates).
"""

from __future__ import annotations

import numpy as np

WEIGHTED_BUCKETS = 5  # Appendix I: "which we set to 5 in our evaluation"


def weighted_correlation(
    q: np.ndarray, sens: np.ndarray, count: np.ndarray | None = None, buckets: int = WEIGHTED_BUCKETS
) -> np.ndarray:
    """Appendix I, eq. (17): Pearson correlation of (q, Δ) with weights w_a = Δ_a / max Δ in a's bucket.

    The score range [q_min, q_max] is cut into ``buckets`` equal half-open intervals (the last one
    closed). NaN where undefined (constant scores or sensitivities, or < 2 candidates).
    """
    if buckets < 1:
        raise ValueError(f"buckets must be ≥ 1, got {buckets}")
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    sens = np.atleast_2d(np.broadcast_to(np.asarray(sens, dtype=np.float64), q.shape))
    mask = np.arange(q.shape[1]) < (q.shape[1] if count is None else np.asarray(count)[:, None])  # False: padding
    qmin = np.where(mask, q, np.inf).min(axis=1, keepdims=True)
    qmax = np.where(mask, q, -np.inf).max(axis=1, keepdims=True)
    width = (qmax - qmin) / buckets
    with np.errstate(invalid="ignore", divide="ignore"):
        b = np.floor((q - qmin) / np.where(width > 0, width, 1.0))
    bucket = np.clip(np.nan_to_num(b, nan=0.0), 0, buckets - 1).astype(np.int64)  # q_max → last bucket
    sens_m = np.where(mask, sens, 0.0)
    bucket_max = np.stack([np.where(bucket == k, sens_m, 0.0).max(axis=1) for k in range(buckets)], axis=1)
    w = np.where(mask, sens_m / np.take_along_axis(bucket_max, bucket, axis=1), 0.0)
    q0 = np.where(mask, q, 0.0)
    wsum = w.sum(axis=1, keepdims=True)
    mu_q = (w * q0).sum(axis=1, keepdims=True) / wsum
    mu_d = (w * sens_m).sum(axis=1, keepdims=True) / wsum
    dq, dd = np.where(mask, q0 - mu_q, 0.0), np.where(mask, sens_m - mu_d, 0.0)
    num = (w * dq * dd).sum(axis=1)
    den = np.sqrt((w * dq * dq).sum(axis=1) * (w * dd * dd).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return np.clip(rho, -1.0, 1.0)


def selected_stats(q: np.ndarray, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo: per user, MSE = mean over trials of (max q − q_selected)² and the mean selected score.

    ``q`` (users, n) clipped (padding −inf is never selected), ``selected`` (users, trials) indices.
    """
    picked = np.take_along_axis(q, selected, axis=1)
    if not np.isfinite(picked).all():
        raise ValueError("a padded (non-candidate) slot was selected; expected indices < count")
    gap = q.max(axis=1, keepdims=True) - picked
    return (gap * gap).mean(axis=1), picked.mean(axis=1)


def expected_stats(q: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Exact: E[(max q − q_A)²] and E[q_A] for one user with selection probabilities ``probs``."""
    q = np.asarray(q, dtype=np.float64)
    gap = q.max() - q
    return float(probs @ (gap * gap)), float(probs @ q)


def log_ratio(mean_mgem: np.ndarray, mean_gem: np.ndarray) -> np.ndarray:
    """Paper Figure 13(d–f): log(mean selected score of mGEM / that of GEM).

    Only defined when both means are > 0 (SANSA scores usually are); NaN otherwise, and callers
    report how many users were NaN.
    """
    a, b = np.asarray(mean_mgem, dtype=np.float64), np.asarray(mean_gem, dtype=np.float64)
    ok = (a > 0) & (b > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, np.log(np.where(ok, a, 1.0) / np.where(ok, b, 1.0)), np.nan)


AGGREGATE_BLOCK = 64  # users per merge step of RunningMean


class RunningMean:
    """Mean and M2 of per-user values (NaNs skipped), merged block by block (Chan et al.).

    Users are merged in fixed blocks of ``block`` consecutive users, whatever chunks they
    arrive in, so the aggregates are the same bits for any chunk size, worker count or engine
    (float addition is not associative: merging per chunk would tie them to the chunking).
    Memory: at most one block plus one chunk of rows is buffered.
    """

    def __init__(self, shape: tuple[int, ...], block: int = AGGREGATE_BLOCK) -> None:
        self.n = np.zeros(shape)
        self.mean = np.zeros(shape)
        self.m2 = np.zeros(shape)
        self.block = block
        self._pending: list[np.ndarray] = []
        self._rows = 0

    def add(self, x: np.ndarray) -> None:
        """x: (B, *shape), the next B users in user order."""
        self._pending.append(np.asarray(x, dtype=np.float64))
        self._rows += len(x)
        if self._rows < self.block:
            return
        rows = np.concatenate(self._pending)
        full = len(rows) - len(rows) % self.block
        for start in range(0, full, self.block):
            self._merge(rows[start : start + self.block])
        self._pending = [rows[full:]] if full < len(rows) else []
        self._rows = len(rows) - full

    def _merge(self, x: np.ndarray) -> None:
        ok = np.isfinite(x)
        nb = ok.sum(axis=0).astype(np.float64)
        xs = np.where(ok, x, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mb = np.where(nb > 0, xs.sum(axis=0) / np.maximum(nb, 1), 0.0)
        m2b = (np.where(ok, x - mb, 0.0) ** 2).sum(axis=0)
        tot = self.n + nb
        delta = mb - self.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(tot > 0, nb / np.maximum(tot, 1), 0.0)
        self.mean = self.mean + delta * frac
        self.m2 = self.m2 + m2b + delta * delta * self.n * frac
        self.n = tot

    def flush(self) -> None:
        """Merges the last, partial block (after the last user)."""
        if self._rows:
            self._merge(np.concatenate(self._pending))
        self._pending, self._rows = [], 0

    def ci(self, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
        """(mean, half-width of the normal 95% CI); NaN where undefined. Call after :meth:`flush`."""
        if self._rows:
            raise RuntimeError("RunningMean.ci() before flush(): the last block is not merged yet")
        with np.errstate(invalid="ignore", divide="ignore"):
            var = self.m2 / np.maximum(self.n - 1, 1)
            half = np.where(self.n > 1, z * np.sqrt(var / np.maximum(self.n, 1)), np.nan)
        return np.where(self.n > 0, self.mean, np.nan), half
