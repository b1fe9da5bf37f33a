"""Rank statistics shared by the mechanisms (combined GEM), the pipeline and the evaluation."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def spearman(x: np.ndarray, y: np.ndarray, undefined: float = 0.0) -> np.ndarray | float:
    """Spearman's ρ along the last axis, with average ranks for ties.

    Rows where either input is constant (ρ undefined) get ``undefined``; SPEC §2 counts them
    as 0 for combined GEM. Returns a float for 1-D input, else an array of the leading shape.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"spearman: shapes differ, {x.shape} vs {y.shape}")
    if x.shape[-1] < 2:
        raise ValueError(f"spearman: need at least 2 values per row, got {x.shape[-1]}")
    rx = rankdata(x, axis=-1)
    ry = rankdata(y, axis=-1)
    rx -= rx.mean(axis=-1, keepdims=True)
    ry -= ry.mean(axis=-1, keepdims=True)
    num = (rx * ry).sum(axis=-1)
    den = np.sqrt((rx * rx).sum(axis=-1) * (ry * ry).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, num / np.where(den > 0, den, 1.0), undefined)
    rho = np.clip(rho, -1.0, 1.0)
    return float(rho) if rho.ndim == 0 else rho
