"""Fixtures of the mechanisms tests: throwaway mechanisms that a test registers for its own
duration (the built-in registry is the same before and after).

Reusable audit and reference helpers live in :mod:`recsvc.mechanisms.testing`."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from recsvc.mechanisms import (
    MECHANISMS,
    PARAMS,
    Audit,
    AuditKind,
    Mechanism,
    Neighbouring,
    ParamSpec,
    Privacy,
    param_specs,
    pure,
    registered,
)

ALPHA = ParamSpec("alpha", 0.5, 0.0, 1.0, "share α of ε the tempered exponential mechanism uses", high_inclusive=True)


def _tempered_u(q, d, epsilon, p, scale):
    return q * (scale * p["alpha"] * epsilon / (2.0 * d.max()))


def tempered_em(name: str, scale: float = 1.0, privacy_map=pure) -> Mechanism:
    """An exponential mechanism at scale·αε, P(a) ∝ exp(scale · α ε q_a / 2Δmax), declaring
    ``privacy_map``: it is (scale·αε)-DP, so ``pure`` is an honest declaration for scale = 1 and
    an understatement for scale = 2 (the audit must catch it)."""

    def sample(q, d, epsilon, p, rng, size):
        """Gumbel-max trick. Privacy: (scale·α·ε)-DP: each exponent moves by ≤ scale·αε/2."""
        u = _tempered_u(q, d, epsilon, p, scale)
        return np.argmax(u + rng.gumbel(size=(size, q.shape[0])), axis=1).astype(np.int64)

    def log_probabilities(q, d, epsilon, p):
        u = _tempered_u(q, d, epsilon, p, scale)
        u = u - u.max()
        return u - np.log(np.exp(u).sum())

    privacy = Privacy(
        privacy_map,
        Neighbouring.BOUNDED,
        Audit(AuditKind.EXACT, ({}, {"alpha": 1.0}), reach=0.4),
        "docs/concepts/privacy-proofs.md#em",
    )
    return Mechanism(
        name,
        f"exponential mechanism at {scale:g}·αε: P(a) ∝ exp({scale:g} α ε q_a / 2Δmax)",
        sample,
        log_probabilities,
        param_specs(ALPHA),
        privacy=privacy,
    )


@pytest.fixture
def make_toy():
    """:func:`tempered_em`, for tests that register a variant themselves (``with registered(...)``)."""
    return tempered_em


@pytest.fixture
def toy() -> Iterator[Mechanism]:
    """``tempered_em`` (honestly declared ε-DP, α ≤ 1), registered for this test only."""
    with registered(tempered_em("tempered_em")) as mech:
        yield mech
    assert "tempered_em" not in MECHANISMS and "alpha" not in PARAMS
