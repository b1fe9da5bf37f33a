"""Compile the project's numba kernels into numba's on-disk cache, once, in this one process.

scripts/test.sh runs it beside the linter. On a cold cache every process that needs a kernel
compiles it itself: each test server warms clm's, gem's and mgem's kernels in the background
(about 35 s of CPU), and a server that a test stops before that ends writes nothing, so the next
one starts over. Compiled here first, every later process loads them in well under a second.

    .venv/bin/python scripts/warm_kernels.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recsvc.mechanisms import MECHANISMS, probabilities, select_batch, select_slate
from recsvc.mechanisms.exact import exponential_noisy_max_expectation
from recsvc.service.selection import warm_kernels
from recsvc.stats import argsort_fast, spearman_rows

_PACKAGES = ("recsvc", "data_prep", "eval")


def drop_stale_kernels(roots: list[Path]) -> int:
    """Removes every numba cache file older than the newest source file under ``roots``; returns
    how many. numba checks only the stamp of the file that defines a cached kernel, so a kernel
    calling another module's kernels (clm_draw's call clm_tape's) would keep running the old
    callees after that module changed."""
    sources = [p for root in roots for p in root.rglob("*.py")]
    if not sources:
        return 0
    newest = max(p.stat().st_mtime for p in sources)
    stale = [f for root in roots for f in root.rglob("__pycache__/*.nb[ic]") if f.stat().st_mtime < newest]
    for f in stale:
        f.unlink(missing_ok=True)
    return len(stale)


def main() -> None:
    drop_stale_kernels([Path(__file__).resolve().parent.parent / p for p in _PACKAGES])
    import sansa  # noqa: F401  # its import compiles its typed numba kernels (~20 s of CPU), cached for prep's fits

    warm_kernels()  # what a server runs once it listens
    q = np.array([[0.0, 0.5, 1.0, 0.25]])
    d = np.array([[1.0, 0.5, 2.0, 1.0]])
    for name, mech in MECHANISMS.items():
        if mech.private:
            select_batch(name, q, d, 1.0, 2, seed=0)
            if mech.exact:
                probabilities(name, q[0], d[0], 1.0)
            if mech.one_shot:  # the slate samplers' own kernels (gumbel's exact peel, clm's draw)
                select_slate(name, q[0], d[0], 1.0, 2, np.random.default_rng(0))
    exponential_noisy_max_expectation(np.array([0.0, -1.0, -2.0]), np.array([0.0, 1.0, 4.0]))
    spearman_rows(np.arange(8.0).reshape(2, 4), np.array([1.0, 0.0, 3.0, 2.0]))
    argsort_fast(np.random.default_rng(0).random(5000))


if __name__ == "__main__":
    main()
