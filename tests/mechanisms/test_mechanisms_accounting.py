"""What a selection is charged: the budget split (Split) gives each step's ε as the samplers run
it, adding up to at most ε on the reals, and the charge is the sum of the stages' privacy maps — for slates,
two-stage selection and combined GEM's correlation bit — down to the last bit of ε. A mechanism
registered by a test is charged by its own declared map, by the library and by the service."""

import itertools
import math
import sys
from fractions import Fraction

import numpy as np
import pytest

from recsvc.mechanisms import (
    MECHANISMS,
    MechanismInputError,
    Privacy,
    Split,
    Stage,
    charged_epsilon,
    registered,
    selection_split,
)
from recsvc.mechanisms.gem import correlation_split
from recsvc.mechanisms.slate import slate_split
from recsvc.mechanisms.two_stage import two_stage_split

EPSILONS = [1e-9, 0.1, 0.3, 0.7, 1.0, 2.5, 1 / 3, 7.123456789, 1e6]
PRIVATE = [n for n, m in MECHANISMS.items() if m.private]


def _sum_of_stages(stages):
    """Σ steps · map(step ε) over (steps, step ε, map) in exact arithmetic: the test's own sum."""
    total = Fraction(0)
    for steps, step, privacy_map in stages:
        used = privacy_map(step)
        if used == math.inf:
            return math.inf
        total += steps * Fraction(used)
    return total


def _combined(c):
    """combined_gem's map of one run at ε, from its two stages: cε for the bit, the rest for gem."""
    return lambda eps: _sum_of_stages([(1, eps * Fraction(c), lambda e: e), (1, eps - eps * Fraction(c), lambda e: e)])


# --- the one split: each step's ε, as the samplers compute it --------------------------------------


def _down_to(x, bound, times=1):
    """The test's own rule: the largest float ≤ x with times·x ≤ bound on the reals."""
    while times * Fraction(x) > bound:
        x = math.nextafter(x, 0.0)
    return x


@pytest.mark.parametrize("eps", EPSILONS)
def test_stage_epsilons_are_the_samplers_floats_rounded_down_onto_the_reals(eps):
    """Each step ε is the float quotient (or difference) unless that exceeds its share on the
    reals, and then the float just below: never more than one rounding from the nominal split."""
    for k in (1, 2, 3, 7, 10):
        assert slate_split(k).stage_epsilons(eps) == (_down_to(eps / k, Fraction(eps), k),)
    for f, m, k in itertools.product((0.1, 0.3, 0.5, 0.77), (1, 3, 20), (1, 2, 3)):
        e1 = f * eps
        e2 = _down_to(eps - e1, Fraction(eps) - Fraction(e1))
        assert two_stage_split(f, m, k).stage_epsilons(eps) == (
            _down_to(e1 / m, Fraction(e1), m),
            _down_to(e2 / k, Fraction(e2), k),
        )
    for c in (0.2, 0.6, 0.9):
        e_c = c * eps
        assert correlation_split({"corr_budget_fraction": c}).stage_epsilons(eps) == (
            e_c,
            _down_to(eps - e_c, Fraction(eps) - Fraction(e_c)),
        )


def _adversarial_epsilons():
    """1e-3 … the largest float: a log-uniform sweep and a uniform one up to 50, powers of 2 and 10
    spread over every exponent range, each with its neighbours (the extremes of a mantissa), thirds
    and tenths (quotients that round up), and the extremes. A few hundred: each is checked against
    every split in exact arithmetic, and a float quotient rounds up for about half of any ε."""
    rng = np.random.default_rng(36)
    out = list(10.0 ** rng.uniform(-3, 308, 80)) + list(rng.uniform(1e-3, 50.0, 80))
    for base in [2.0**e for e in range(-9, 1024, 41)] + [10.0**e for e in range(-3, 309, 13)]:
        out += [base, math.nextafter(base, 0.0), math.nextafter(base, math.inf)]
    out += [x / 3 for x in (1.0, 2.0, 10.0, 0.1)] + [0.1 * j for j in range(1, 40)] + [1e-3, sys.float_info.max]
    return [e for e in out if 1e-3 <= e <= sys.float_info.max]


def test_every_split_adds_up_to_at_most_epsilon_on_the_reals():
    """For the splits the samplers run at (combined GEM's ε_c + ε_g, a slate's k·ε/k, both stages
    of a two-stage selection), Σ steps · step ε ≤ ε in exact rational arithmetic, from 1e-3 to the
    largest float; the naive float split exceeds ε for some of these ε in each of the three
    families (the check has teeth)."""
    families = {
        "correlation": [correlation_split({"corr_budget_fraction": c}) for c in (0.6, 0.25, 0.1, 1 / 3, 0.999, 1e-9)],
        "slate": [slate_split(k) for k in (2, 3, 7, 10, 100)],
        "two-stage": [
            two_stage_split(f, m, k) for f, m, k in itertools.product((0.1, 0.3, 1 / 3), (1, 3, 20), (1, 3, 10))
        ],
    }
    naive_over = dict.fromkeys(families, 0)
    for eps in _adversarial_epsilons():
        exact = Fraction(eps)
        for family, splits in families.items():
            for split in splits:
                steps = split.stage_epsilons(eps)
                sums = sum(s.steps * Fraction(x) for s, x in zip(split.stages, steps, strict=True))
                assert sums <= exact, (split, eps)
                assert sum(Fraction(b) for b in split.budgets(eps)) <= exact
                parts = [f * eps for f in split.fractions]
                parts.append(eps - sum(parts))
                naive = sum(s.steps * Fraction(b / s.steps) for s, b in zip(split.stages, parts, strict=True))
                naive_over[family] += naive > exact
    assert min(naive_over.values()) > 300, naive_over  # 603 to 4,707 of these ε·split pairs per family


def test_the_correlation_split_the_sampler_uses_is_the_exact_one(monkeypatch):
    """combined_gem's sampler runs the bit at ε_c (its keep probability's bounds) and the
    selection at ε_g (the race's utilities) from the split."""
    import recsvc.mechanisms.gem as gem
    import recsvc.mechanisms.gem_combined as gc

    bit_eps, race_eps = [], []
    keep, races = gem.keep_bounds, gc._races
    monkeypatch.setattr(gem, "keep_bounds", lambda e_c: bit_eps.append(e_c) or keep(e_c))
    monkeypatch.setattr(gc, "_races", lambda q, d, t, e_g, *rest: race_eps.append(e_g) or races(q, d, t, e_g, *rest))
    q = np.array([0.0, 0.4, 1.0])
    for eps in (0.1, 1.0, 1 / 3, 7.123456789):
        MECHANISMS["combined_gem"].sample(
            q, np.ones(3), eps, {"beta": 0.05, "corr_budget_fraction": 0.2}, np.random.default_rng(0), 1
        )
        e_c, e_g = bit_eps[-1], race_eps[-1]
        assert (e_c, e_g) == correlation_split({"corr_budget_fraction": 0.2}).stage_epsilons(eps)
        assert Fraction(e_c) + Fraction(e_g) <= Fraction(eps)


def test_a_step_or_part_that_rounds_to_zero_is_refused_with_its_name():
    with pytest.raises(MechanismInputError, match=r"^epsilon/k = 5e-324/2 rounds to 0; expected a larger epsilon$"):
        slate_split(2).stage_epsilons(5e-324)
    with pytest.raises(
        MechanismInputError,
        match=r"^epsilon=5e-324 is too small to split \(candidate_fraction=0\.5\): "
        r"a part rounds to 0; expected a larger epsilon$",
    ):
        two_stage_split(0.5, 3, 2).stage_epsilons(5e-324)
    with pytest.raises(MechanismInputError, match=r"^candidate_fraction·epsilon/num_candidates = 1e-323/5 rounds to 0"):
        two_stage_split(0.5, 5, 1, m_label="num_candidates").stage_epsilons(2e-323)
    with pytest.raises(MechanismInputError, match=r"too small to split \(corr_budget_fraction=0\.6\)"):
        correlation_split({"corr_budget_fraction": 0.6}).stage_epsilons(5e-324)
    for bad in (0.0, 1.0, float("nan"), True, "0.5"):
        with pytest.raises(MechanismInputError, match="candidate_fraction must be"):
            two_stage_split(bad)
    with pytest.raises(ValueError, match="2 stages take 1 fraction"):
        Split((Stage("a"), Stage("b")))
    with pytest.raises(ValueError, match="leave a share for the last stage"):
        Split((Stage("a"), Stage("b"), Stage("c")), (0.5, 0.5))


# --- the charge is the sum of the stages ---------------------------------------------------------


@pytest.mark.parametrize("eps", EPSILONS)
def test_a_slate_is_charged_the_sum_of_its_steps(eps):
    for name, k in itertools.product(PRIVATE, (1, 2, 3, 5)):
        step = _combined(0.6) if name == "combined_gem" else (lambda e: e)
        expected = _sum_of_stages([(k, Fraction(eps) / k, step)])
        assert charged_epsilon(name, eps, k) == float(expected) == eps
        assert selection_split(name, k).consumed(Fraction(eps)) == expected


@pytest.mark.parametrize("eps", EPSILONS)
def test_two_stage_is_charged_the_sum_of_both_stages(eps):
    for (name, cand), f, (m, k) in itertools.product(
        [("rnm", "rnm"), ("gem", "combined_gem"), ("combined_gem", "em"), ("krr", "rs")],
        (0.1, 0.5, 0.77),
        [(1, 1), (20, 3), (500, 10)],
    ):
        maps = {n: _combined(0.25) if n == "combined_gem" else (lambda e: e) for n in (name, cand)}
        e1 = Fraction(eps) * Fraction(f)
        expected = _sum_of_stages([(m, e1 / m, maps[cand]), (k, (Fraction(eps) - e1) / k, maps[name])])
        got = charged_epsilon(
            name, eps, k, m=m, candidate_fraction=f, candidate_mechanism=cand, corr_budget_fraction=0.25
        )
        assert got == float(expected) == eps


def test_combined_gem_is_charged_its_bit_and_its_selection():
    for c, eps in itertools.product((0.05, 0.25, 0.6, 0.95), EPSILONS):
        split = correlation_split({"corr_budget_fraction": c})
        assert split.consumed(eps) == float(_combined(c)(Fraction(eps))) == eps
        assert charged_epsilon("combined_gem", eps, corr_budget_fraction=c) == eps
        assert MECHANISMS["combined_gem"].privacy.privacy_map(eps) == eps  # the declared map: the split's, for every c


def test_a_non_private_mechanism_in_any_stage_makes_the_charge_infinite():
    assert charged_epsilon("rnmh", 1.0) == math.inf
    assert charged_epsilon("rnmh", 1.0, 3) == math.inf
    assert charged_epsilon("rnm", 1.0, 1, m=5, candidate_fraction=0.5, candidate_mechanism="rnmh") == math.inf
    assert charged_epsilon("rnmh", 1.0, 1, m=5, candidate_fraction=0.5, candidate_mechanism="rnm") == math.inf


def test_a_mechanism_with_its_own_map_is_charged_by_it(make_toy):
    """A throwaway mechanism that honestly declares 2ε (it runs at 2αε; α ≤ 1) is charged 2ε per
    selection, 2ε per slate, and ε₁ + 2ε₂ as the selecting stage of a two-stage selection."""
    with registered(make_toy("doubler", scale=2.0, privacy_map=lambda e: 2 * e)) as mech:
        assert mech.private and mech.privacy.label == "ε-DP"
        assert charged_epsilon("doubler", 0.3) == 0.6
        assert charged_epsilon("doubler", 0.3, 3) == float(_sum_of_stages([(3, Fraction(0.3) / 3, lambda e: 2 * e)]))
        assert charged_epsilon("doubler", 0.3, 3) == 0.6
        two = charged_epsilon("doubler", 1.0, 2, m=4, candidate_fraction=0.25, candidate_mechanism="rnm")
        assert two == 0.25 + 2 * 0.75
        assert charged_epsilon("rnm", 1.0, 2, m=4, candidate_fraction=0.25, candidate_mechanism="doubler") == 0.5 + 0.75
    assert "doubler" not in MECHANISMS


def test_the_privacy_declaration_is_checked():
    with pytest.raises(ValueError, match=r"proof must link a section of docs/concepts/privacy-proofs.md"):
        Privacy(lambda e: e, MECHANISMS["rnm"].privacy.neighbouring, MECHANISMS["rnm"].privacy.audit, "README.md")
    with pytest.raises(ValueError, match="kind 'none' is for a mechanism with an infinite map"):
        Privacy(
            lambda e: e,
            MECHANISMS["rnm"].privacy.neighbouring,
            MECHANISMS["rnmh"].privacy.audit,
            "docs/concepts/privacy-proofs.md#rnm",
        )


# --- the service charges the composed map --------------------------------------------------------


def test_the_service_charges_a_registered_mechanisms_own_map(make_toy, artifact, tmp_path):
    """Nothing in the service names the throwaway ``doubler`` (declared 2ε): a Select slate, a
    SelectBatch item and a two-stage Recommend are each charged their composed map, and the
    answer reports the ε charged."""
    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    with registered(make_toy("doubler", scale=2.0, privacy_map=lambda e: 2 * e)):
        handle = start(
            ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=10.0, min_candidates=4)
        )
        try:
            cands = [(f"it{i}", 0.1 * i) for i in range(8)]
            with Client(f"127.0.0.1:{handle.port}", retries=0) as c:
                r = c.select("u-slate", cands, mechanism="doubler", epsilon=0.5, k=2)
                assert (r.epsilon_spent, len(r.item_ids), r.budget_remaining) == (1.0, 2, 9.0)
                [b] = c.select_batch([c.select_request("u-batch", cands, mechanism="doubler", epsilon=0.25)])
                assert b.response.epsilon_spent == 0.5
                rec = c.recommend(
                    "u-two",
                    ["it1", "it2"],
                    mechanism="doubler",
                    epsilon=1.0,
                    k=2,
                    num_candidates=4,
                    candidate_fraction=0.25,
                )
                assert rec.epsilon_spent == 0.25 + 2 * 0.75
                plain = c.select("u-rnm", cands, mechanism="rnm", epsilon=0.3, k=3)
                assert plain.epsilon_spent == 0.3  # a private built-in: exactly the request
            spent = {u: handle.ledger.user(u).spent for u in ("u-slate", "u-batch", "u-two", "u-rnm")}
            assert spent == {"u-slate": 1.0, "u-batch": 0.5, "u-two": 1.75, "u-rnm": 0.3}
        finally:
            handle.stop(grace=1)


def test_the_service_refuses_a_non_private_mechanism_and_charges_nothing(artifact, tmp_path):
    import grpc

    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    handle = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db"))
    try:
        with Client(f"127.0.0.1:{handle.port}", retries=0) as c, pytest.raises(grpc.RpcError) as err:
            c.select("u", [("it1", 0.2), ("it2", 0.4)], mechanism="rnmh", epsilon=1.0)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not differentially private" in err.value.details()
        assert handle.ledger.user("u").spent == 0.0
    finally:
        handle.stop(grace=1)


def test_charging_is_cheap_once_seen():
    """The service asks once per request: a repeated (mechanism, ε, k, …) is a cache hit."""
    import timeit

    charged_epsilon("combined_gem", 0.5, 3, m=20, candidate_fraction=0.3)
    per_call = (
        timeit.timeit(lambda: charged_epsilon("combined_gem", 0.5, 3, m=20, candidate_fraction=0.3), number=2000) / 2000
    )
    assert per_call < 50e-6
    assert np.isfinite(per_call)
