"""Each private mechanism's privacy map d_in → d_out (``Mechanism.distance_map``: ε, k and its
parameters as arguments) bounds the worst log-ratio of its exact output law over neighbouring
score vectors at tiny n, at d_in = ½, 1 and 2, for single selections and 2-slates; a map declared
tight is attained; a wrong map fails the same check; and the charge is the map at d_in = 1, equal
to the budget split's composition for every request."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pytest

from recsvc.mechanisms import MECHANISMS, Mechanism, charged_epsilon, registered, selection_map, selection_split
from recsvc.mechanisms.privacy import DistanceMap, any_change, scaled
from recsvc.mechanisms.slate import slate_log_probabilities
from recsvc.mechanisms.testing import REFERENCE, max_log_ratio

EPS = 1.0
# The exact laws are float64 log-probabilities, within ~1e-12 of the real ones at n ≤ 3; the
# exact audit's tolerance (recsvc.mechanisms.testing.TOL) covers that with room.
SLACK = 1e-9
REACH = 0.9  # a tight map: the worst ratio found at d_in = 1 is within 10 % of it
DISTANCES = (Fraction(1, 2), Fraction(1), Fraction(2))
PRIVATE = [n for n, m in MECHANISMS.items() if m.private]
Case = tuple[np.ndarray, np.ndarray]  # (q, Δ)


TIES, FAR, SPREAD = 0, 1, 2


def _base(which: int, n: int) -> Case:
    """TIES: equal scores, Δ over three orders; FAR: a far gap with equal Δ (where the bounds are
    approached); SPREAD: close scores with heterogeneous Δ, whose corners swap the leader."""
    if which == TIES:
        return np.zeros(n), np.array([1.0, 1e-3, 3.0])[:n]
    if which == FAR:
        return np.r_[0.0, np.full(n - 1, -40.0)], np.ones(n)
    return np.array([0.0, -0.2, -0.9])[:n], np.array([0.25, 1.0, 1e-2])[:n]


# (n, k, d_in, bases): the neighbours are the corners q + s·d_in·Δ, s ∈ {−1, +1}ⁿ, where the worst
# case of a regular mechanism lies. Every audited setting runs the first rows; the defaults all.
PLAN = (
    (2, 1, Fraction(1), (TIES, FAR, SPREAD)),
    (3, 2, Fraction(1), (TIES,)),
    (2, 1, Fraction(1, 2), (SPREAD, FAR)),
    (2, 1, Fraction(2), (SPREAD, FAR)),
    (3, 1, Fraction(1), (TIES,)),
    (3, 2, Fraction(1), (FAR,)),
)
FIRST_ROWS = 2
# Without exact probabilities the quadrature reference (1-D integrals, ~75 ms a law) runs at
# n = 2 on close scores with heterogeneous Δ (on a far gap random stopping's uniform draws leave
# the law almost unmoved), against the neighbours that raise one score and lower the other.
REFERENCE_PLAN = ((2, 1, Fraction(1), (SPREAD,)),)


def _settings(m: Mechanism) -> list[dict[str, float]]:
    """The mechanism's parameters at each setting its audit declares (defaults filled in)."""
    return [{p: float(s.get(p, spec.default)) for p, spec in m.params.items()} for s in m.privacy.audit.settings]


def _law(name: str, q: np.ndarray, d: np.ndarray, k: int, params: Mapping[str, float]) -> Mapping[Any, float]:
    """The exact log-law of a selection (k = 1) or an ordered k-slate; for a mechanism without
    exact probabilities, its quadrature reference (k = 1)."""
    if MECHANISMS[name].exact:
        return slate_log_probabilities(name, q, d, EPS, k, **params)
    reference = cast(Callable[..., np.ndarray], REFERENCE[name])  # its lambdas carry no annotations
    return dict(enumerate(np.log(reference(q, d, EPS, **params)).tolist()))


Key = tuple[int, int, Fraction, tuple[tuple[str, float], ...]]


@functools.cache
def _worst(name: str) -> dict[Key, float]:
    """The worst |log P(o|q) − log P(o|q′)| per (n, k, d_in, setting) over the plan's neighbours."""
    m = MECHANISMS[name]
    out: dict[Key, float] = {}
    for i, params in enumerate(_settings(m)):
        key = tuple(sorted(params.items()))
        plan = PLAN if m.exact else REFERENCE_PLAN
        for n, k, dist, bases in plan if i == 0 else plan[:FIRST_ROWS]:
            signs = itertools.product((-1.0, 1.0), repeat=n) if m.exact else ((1.0, -1.0), (-1.0, 1.0))
            worst = out.get((n, k, dist, key), 0.0)
            for which, s in itertools.product(bases, list(signs)):
                q, d = _base(which, n)
                moved = q + float(dist) * np.array(s) * d
                worst = max(worst, max_log_ratio(_base_law(name, which, n, k, key), _law(name, moved, d, k, params)))
            out[n, k, dist, key] = worst
    return out


@functools.cache
def _base_law(name: str, which: int, n: int, k: int, key: tuple[tuple[str, float], ...]) -> Mapping[Any, float]:
    q, d = _base(which, n)
    return _law(name, q, d, k, dict(key))


def _violations(name: str, privacy_map: DistanceMap) -> list[str]:
    return [
        f"n={n} k={k} d_in={dist} {dict(key)}: worst {worst:.6g} > map {float(bound):.6g}"
        for (n, k, dist, key), worst in _worst(name).items()
        if worst > (bound := privacy_map(dist, EPS, k, dict(key))) + SLACK
    ]


@pytest.mark.parametrize("name", PRIVATE)
def test_the_map_bounds_the_exact_law_and_reaches_it_where_the_proof_is_tight(name):
    m = MECHANISMS[name]
    assert m.exact or name in REFERENCE, f"{name}: no exact law to check its map against"
    assert not _violations(name, m.distance_map)
    if m.distance_map.tight:
        for params in _settings(m):
            key = tuple(sorted(params.items()))
            found = max(w for (_, _, dist, p), w in _worst(name).items() if dist == 1 and p == key)
            assert found >= REACH * float(m.distance_map(1, EPS, 1, params)), (name, params, found)


def test_a_wrong_map_fails_the_same_check():
    """Half of em's ε, or a map that ignores how far the scores move, is refused by the check."""
    assert not _violations("em", MECHANISMS["em"].distance_map)
    assert _violations("em", DistanceMap(lambda d_in, eps, p: d_in * eps / 2))
    wrong = _violations("em", DistanceMap(any_change))  # ε at every d_in: too little at d_in = 2
    assert wrong and all("d_in=2" in v for v in wrong)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_charge_is_the_map_at_distance_one_and_unchanged(name):
    """charged_epsilon evaluates the map; it equals the split's composition for every request
    shape (slates, two-stage with a peeled or a one-shot candidate stage, every audited setting),
    so no accepted request is charged differently, and a private built-in is charged its ε."""
    m = MECHANISMS[name]
    for params, eps, k in itertools.product(_settings(m), (1e-3, 1 / 3, 7.123456789), (1, 5)):
        old = selection_split(name, k, params=params).consumed(eps)
        assert charged_epsilon(name, eps, k, **params) == old == (eps if m.private else math.inf)
        assert m.distance_map(1, eps, 1, params) == m.privacy.consumed(Fraction(eps), params)
        for cand, f, size in (("rnm", 0.3, 4), ("oneshot", 0.77, 9), ("combined_gem", 0.5, 3)):
            got = charged_epsilon(name, eps, k, m=size, candidate_fraction=f, candidate_mechanism=cand, **params)
            split = selection_split(name, k, m=size, candidate_fraction=f, candidate_mechanism=cand, params=params)
            assert got == split.consumed(eps)
    if m.private:
        assert selection_map(name, 3, params=_settings(m)[0])(0, 1.0) == 0


def test_a_declaration_of_epsilon_only_is_extended_by_group_privacy(make_toy):
    """A mechanism that declares ε ↦ 2ε and no distance map is charged 2ε, and d_in = 2.5 costs
    three neighbour steps; a map that composes a slate unlike the sampler is refused."""
    with registered(make_toy("doubler", scale=2.0, privacy_map=lambda e: 2 * e)) as mech:
        assert charged_epsilon("doubler", 0.3, 3) == 2 * 0.3
        assert mech.distance_map(Fraction(5, 2), Fraction(1, 3), 1, {"alpha": 1.0}) == 2
        assert mech.distance_map(Fraction(1, 2), 1, 2, {"alpha": 1.0}) == 2
    em = MECHANISMS["em"]
    privacy = type(em.privacy)(
        em.privacy.privacy_map,
        em.privacy.neighbouring,
        em.privacy.audit,
        em.privacy.proof,
        None,
        DistanceMap(scaled, True),
    )
    with pytest.raises(ValueError, match="composes a slate in one run, its sampler by peeling"):
        Mechanism("em_wrong_map", "em declaring a one-shot map", em.sample, em.log_probabilities_fn, privacy=privacy)
