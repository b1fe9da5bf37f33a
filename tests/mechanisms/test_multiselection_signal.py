"""The device's d-dimensional embedding: every clipped embedding is inside the L1 ball of radius R
(what bounds the lattice signal's sensitivity; its exact ε audit is test_multiselection_lattice.py),
and the embedding's version is a digest of the factors and R."""

from __future__ import annotations

import numpy as np
import pytest

from recsvc.multiselection import clip_l1, embed, embedding_version

pytestmark = pytest.mark.float_paths  # its floats come from BLAS, numpy's SIMD loops or numba

D, N_ITEMS, R = 6, 50, 1.5
FACTORS = np.random.default_rng(11).normal(size=(N_ITEMS, D))


def test_every_clipped_embedding_is_within_the_radius():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = rng.choice(N_ITEMS, int(rng.integers(0, 20)), replace=False)
        assert np.abs(clip_l1(embed(rows, FACTORS), R)).sum() <= R * (1 + 1e-12)


def test_the_embedding_version_is_a_digest_of_the_factors_and_the_radius():
    v = embedding_version(FACTORS, R)
    assert len(v) == 64 and v == embedding_version(FACTORS.copy(), R)
    assert v != embedding_version(FACTORS, R * (1 + 1e-15))
    bumped = FACTORS.copy()
    bumped[3, 2] = np.nextafter(bumped[3, 2], np.inf)
    assert v != embedding_version(bumped, R)
