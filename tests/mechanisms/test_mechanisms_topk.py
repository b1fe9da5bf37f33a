"""One-shot top-k (oneshot, gumbel, clm): a slate is one run of the mechanism's own sampler at ε,
never k peeled selections, and is charged the declared map once. Exact slate laws against
references written from the definitions (quadrature, peeling em, all k-subsets), samplers
against exact laws, clm's utility classes against brute force, DP audits on neighbours (the
declaration-driven ones in test_mechanisms_privacy.py / test_mechanisms_slate.py run as well),
and bad input refused before any draw."""

import itertools
import math

import numpy as np
import pytest

from recsvc.mechanisms import (
    MECHANISMS,
    Audit,
    AuditKind,
    Mechanism,
    MechanismInputError,
    MechanismParamError,
    Neighbouring,
    Privacy,
    charged_epsilon,
    default_mechanisms,
    probabilities,
    registered,
    select,
    select_slate,
    select_two_stage,
    selection_split,
    slate_log_probabilities,
    slate_probabilities,
    two_stage_probabilities,
)
from recsvc.mechanisms.clm import _negative_noise, _sorted_order, classes
from recsvc.mechanisms.testing import (
    chisquare_pvalue,
    clm_direct_log_probabilities,
    clm_direct_sample,
    clm_loss,
    linf_distance_to_top_k,
    max_log_ratio,
    neighbour_vertices,
    noisy_top_k_probabilities_quad,
)

ONE_SHOT = ["oneshot", "gumbel", "clm"]
ALPHA = 1e-3
Q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
D = np.array([0.5, 2.0, 0.2, 1.0, 0.7])


def test_the_one_shot_mechanisms_are_registered_outside_the_default_set():
    assert [n for n, m in MECHANISMS.items() if m.one_shot] == ONE_SHOT
    assert all(MECHANISMS[n].private and MECHANISMS[n].exact for n in ONE_SHOT)
    assert default_mechanisms() == tuple(n for n, m in MECHANISMS.items() if m.private and n not in ONE_SHOT)


# --- k = 1 --------------------------------------------------------------------------------------


def test_k1_is_rnm_em_and_rnm_at_gamma_epsilon():
    for eps in (0.3, 2.0):
        np.testing.assert_allclose(probabilities("oneshot", Q, D, eps), probabilities("rnm", Q, D, eps), rtol=1e-12)
        np.testing.assert_allclose(probabilities("gumbel", Q, D, eps), probabilities("em", Q, D, eps), rtol=1e-12)
        for g in (0.25, 0.5, 1.0):
            want = probabilities("rnm", Q, D, g * eps)
            np.testing.assert_allclose(probabilities("clm", Q, D, eps, loss_weight=g), want, rtol=1e-10)
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert [select("oneshot", Q, D, 1.0, a) for _ in range(20)] == [select("rnm", Q, D, 1.0, b) for _ in range(20)]


# --- slates: native, one pass, charged once ----------------------------------------------------------


def _spy(name, privacy_map):
    """A one-shot mechanism (oneshot's sampler) that records which sampler ran, declaring ``privacy_map``."""
    calls = []
    base = MECHANISMS["oneshot"]

    def sample(q, d, eps, p, rng, size):
        """Privacy: as oneshot's (k = 1)."""
        calls.append(("sample", size))
        return base.sample(q, d, eps, p, rng, size)

    def top_k(q, d, eps, p, rng, k):
        calls.append(("top_k", k, eps))
        return base.top_k(q, d, eps, p, rng, k)

    privacy = Privacy(
        privacy_map, Neighbouring.BOUNDED, Audit(AuditKind.EXACT), "docs/concepts/privacy-proofs.md#oneshot"
    )
    mech = Mechanism(
        name, "oneshot, recording its calls", sample, base.log_probabilities_fn, privacy=privacy, top_k=top_k
    )
    return mech, calls


def test_a_slate_runs_the_native_sampler_once_at_the_whole_epsilon_never_peeling():
    mech, calls = _spy("spy", lambda e: e)
    with registered(mech):
        a, b = np.random.default_rng(9), np.random.default_rng(9)
        got = select_slate("spy", Q, D, 1.5, 4, a)
        assert calls == [("top_k", 4, 1.5)]
        assert got.tolist() == MECHANISMS["oneshot"].top_k(Q, D, 1.5, {}, b, 4).tolist()
        assert a.bit_generator.state == b.bit_generator.state  # one pass: n draws, nothing else
        calls.clear()
        select_two_stage("spy", Q, D, 1.0, 4, 0.5, 2, np.random.default_rng(0), candidate_mechanism="spy")
        assert calls == [("sample", 1), ("top_k", 4, 0.5), ("top_k", 2, 0.5)]  # a discarded check, then one run each


def test_the_charge_of_a_one_shot_slate_is_the_declared_map_once():
    """A map that is not linear tells map(ε) from k·map(ε/k): the charge the service computes
    (charged_epsilon) is the declared map at ε, for every k, also inside two-stage selection."""
    mech, _ = _spy("affine", lambda e: e + 1)
    with registered(mech):
        for eps, k in itertools.product((0.1, 1.0, 3.7), (1, 2, 5)):
            assert charged_epsilon("affine", eps, k) == MECHANISMS["affine"].privacy.privacy_map(eps) == eps + 1
        (stage,) = selection_split("affine", 5).stages
        assert (stage.steps, stage.label) == (1, "epsilon")
        got = charged_epsilon("affine", 2.0, 3, m=10, candidate_fraction=0.25, candidate_mechanism="affine")
        assert got == pytest.approx((0.5 + 1) + (1.5 + 1), rel=1e-15)
        assert (
            charged_epsilon("rnm", 2.0, 3, m=10, candidate_fraction=0.25, candidate_mechanism="affine")
            == (0.5 + 1) + 1.5
        )
    for name, k in itertools.product(ONE_SHOT, (1, 3, 10)):
        assert charged_epsilon(name, 0.7, k) == MECHANISMS[name].privacy.privacy_map(0.7) == 0.7


@pytest.mark.parametrize("name", ONE_SHOT)
def test_large_epsilon_gives_the_top_k(name):
    got = select_slate(name, Q, D, 2000.0, 3, np.random.default_rng(0))
    want = [1, 3, 0]
    assert (sorted(got.tolist()) if name == "clm" else got.tolist()) == (sorted(want) if name == "clm" else want)


@pytest.mark.parametrize("name", ONE_SHOT)
@pytest.mark.parametrize("k", [2, 3])
def test_sampler_matches_the_exact_slate_law(name, k):
    q, d = Q[:4], D[:4]
    p = slate_probabilities(name, q, d, 2.0, k)
    assert sum(p.values()) == pytest.approx(1.0, abs=1e-12)
    index = {s: i for i, s in enumerate(p)}
    rng = np.random.default_rng(20 + k)
    counts = np.zeros(len(p))
    for _ in range(6_000):
        counts[index[tuple(select_slate(name, q, d, 2.0, k, rng).tolist())]] += 1
    assert chisquare_pvalue(counts, np.array(list(p.values()))) > ALPHA


# --- oneshot and gumbel: exact laws against quadrature and peeling em ---------------------------------


@pytest.mark.parametrize("name,noise", [("oneshot", "exponential"), ("gumbel", "gumbel")])
def test_exact_slate_law_matches_quadrature(name, noise):
    q = np.array([0.3, 1.0, -0.5, 0.8, 0.8])  # a tie included
    for eps, k in ((0.7, 1), (2.0, 2), (9.0, 2)):
        u = (q - q.max()) * eps / (2 * k * D.max())
        want = noisy_top_k_probabilities_quad(u, noise, k)
        got = slate_probabilities(name, q, D, eps, k)
        assert got.keys() == want.keys()
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=1e-8)


@pytest.mark.parametrize("n", [4, 5])
def test_gumbel_slate_is_peeling_em_at_epsilon_over_k(n):
    """Equal in distribution, exactly, when Δmax stays the same while peeling (equal sensitivities)."""
    q = np.random.default_rng(n).normal(size=n)
    d = np.full(n, 0.7)
    for eps, k in itertools.product((0.5, 3.0), (1, 2, 3)):
        got, want = slate_probabilities("gumbel", q, d, eps, k), slate_probabilities("em", q, d, eps, k)
        assert got.keys() == want.keys()
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=1e-12)


def test_oneshot_slate_law_is_not_peeling_rnm():
    """Exponential noise is not max-stable: one draw is not k peeled rnm draws (so its map needs
    its own proof; test_one_shot_slate_loss below shows it is tight)."""
    got, want = slate_probabilities("oneshot", Q, D, 2.0, 2), slate_probabilities("rnm", Q, D, 2.0, 2)
    assert max(abs(got[s] - want[s]) for s in got) > 1e-3


# --- clm: classes, the direct definition, the sampler ------------------------------------------------


def _brute_class(ranks, k):
    """(h, t) of a subset from the definitions: h = the largest h < k whose top-h it contains,
    t = the smallest t ≥ k whose top-t contains it (ranks 1-based)."""
    h = max(h for h in range(k) if set(range(1, h + 1)) <= set(ranks))
    t = min(t for t in range(k, len(ranks) + 100) if set(ranks) <= set(range(1, t + 1)))
    return h, t


@pytest.mark.parametrize("n", range(1, 8))
def test_clm_utility_classes_partition_every_k_subset(n):
    x = np.sort(np.random.default_rng(n).normal(size=n))[::-1]  # ranks 1..n are positions 0..n-1
    for k in range(1, n + 1):
        ht, log_size, loss = classes(x, k, 0.3)
        members: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for y in itertools.combinations(range(1, n + 1), k):
            members.setdefault(_brute_class(y, k), []).append(y)
        listed = [(int(h), int(t)) for h, t in ht]
        assert len(listed) == len(set(listed)) == k * (n - k) + 1
        assert set(members) <= set(listed)
        for (h, t), size, lo in zip(listed, np.exp(log_size), loss, strict=True):
            ys = members.get((h, t), [])
            want = math.comb(t - h - 2, k - h - 1) if t > k else 1  # the top class: the top k alone
            assert round(float(size)) == len(ys) == want
            for y in ys:  # one loss per class: the definition's, for every member
                assert clm_loss(x, [r - 1 for r in y], 0.3) == pytest.approx(float(lo), abs=1e-12)
        assert sum(round(float(s)) for s in np.exp(log_size)) == math.comb(n, k)
        if 2 <= k < n - 1:  # seed 004's count C(t − h − 1, k − h − 1) over-counts
            seed = 1 + sum(math.comb(t - h - 1, k - h - 1) for h, t in listed[1:])
            assert seed > math.comb(n, k)


def test_clm_sorted_order_is_the_stable_descending_order():
    """The fast sort is kept only when the scores are distinct; ties, signed zeros and NaN take
    the stable sort, so a seed picks the same slate everywhere."""
    rng = np.random.default_rng(3)
    cases = [rng.normal(size=200), np.round(rng.normal(size=200), 1), np.array([0.0, -0.0, 1.0, 0.0])]
    cases += [np.array([1.0, np.nan, 2.0, np.nan]), np.array([5.0]), np.empty(0)]
    for q in cases:
        assert _sorted_order(q).tolist() == np.argsort(-q, kind="stable").tolist()


def test_clm_class_sizes_are_cached_read_only():
    x = np.sort(np.random.default_rng(1).normal(size=9))[::-1]
    ht, log_size, _ = classes(x, 3, 0.5)
    again, log_again, _ = classes(x + 1.0, 3, 0.5)
    assert again is ht and log_again is log_size  # they depend on (n, k) only
    for arr in (ht, log_size):
        with pytest.raises(ValueError):
            arr[0] = 0


def test_clm_class_draw_survives_classes_of_more_than_e_to_the_700_subsets():
    """Two classes of equal utility with e^750 and e^760 subsets: the larger wins with probability
    1/(1 + e^−10). Each class's best noise is about its log size; e^{−log size} underflows, which
    must not make it +inf (the first class would then always win)."""
    rng = np.random.default_rng(8)
    log_size = np.array([750.0, 760.0])
    wins = [int(_negative_noise(log_size, rng.random(2)).argmin()) for _ in range(50)]
    assert sum(wins) >= 49
    rows = _negative_noise(log_size, rng.random((50, 2))).argmin(axis=1)  # first_item_means' shape: (draws, classes)
    assert int(rows.sum()) >= 49


def test_clm_loss_at_one_half_is_the_linf_distance_to_having_that_top_k():
    rng = np.random.default_rng(5)
    for n, k in ((4, 2), (6, 3), (5, 1)):
        x = np.round(rng.normal(size=n), 1)  # ties included
        for y in itertools.combinations(range(n), k):
            assert clm_loss(x, y, 0.5) == pytest.approx(linf_distance_to_top_k(x, y), abs=1e-12)


@pytest.mark.parametrize("n,k", [(n, k) for n in range(2, 8) for k in range(1, min(n, 3) + 1)])
def test_clm_set_law_equals_the_direct_definition_over_all_k_subsets(n, k):
    rng = np.random.default_rng(10 * n + k)
    q = np.round(rng.normal(size=n), 1)  # ties included
    d = rng.uniform(0.2, 1.0, n)
    for eps, g in ((1.0, 0.5), (4.0, 0.0), (2.0, 1.0), (0.3, 0.8)):
        slate = slate_log_probabilities("clm", q, d, eps, k, loss_weight=g)
        sets = {}
        for s, lp in slate.items():  # every order of a set is equally likely
            sets.setdefault(tuple(sorted(s)), []).append(lp)
        assert all(max(v) - min(v) < 1e-12 for v in sets.values())
        got = {s: float(np.logaddexp.reduce(v)) for s, v in sets.items()}
        want = clm_direct_log_probabilities(q, d, eps, k, g)
        assert got.keys() == want.keys()
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=1e-8, atol=1e-9)


def test_clm_sampler_matches_the_direct_sampler():
    q, d, eps, k = Q, D, 3.0, 2
    rng = np.random.default_rng(31)
    direct = clm_direct_sample(q, d, eps, k, 0.5, rng, 8_000)
    native = [tuple(sorted(select_slate("clm", q, d, eps, k, rng).tolist())) for _ in range(8_000)]
    subsets = list(itertools.combinations(range(5), k))
    table = np.array([[direct.count(s) for s in subsets], [native.count(s) for s in subsets]], dtype=float)
    # two-sample χ² (homogeneity), pooled expected counts
    p = table.sum(axis=0) / table.sum()
    assert chisquare_pvalue(table[1], p) > ALPHA and chisquare_pvalue(table[0], p) > ALPHA


# --- DP audits ----------------------------------------------------------------------------------------


def _worst(name, q, d, k, eps, count=None, **params):
    base = slate_log_probabilities(name, q, d, eps, k, **params)
    return max(
        max_log_ratio(base, slate_log_probabilities(name, q2, d, eps, k, **params))
        for q2 in neighbour_vertices(q, d, count, seed=k)
    )


@pytest.mark.parametrize("g", [0.0, 1.0])
def test_clm_slate_audit_at_the_ends_of_the_loss_weight(g):
    q = np.random.default_rng(2).normal(size=5) * 2
    d = np.array([0.05, 1.0, 3.0, 0.4, 1.7])
    for k in (2, 3):
        assert _worst("clm", q, d, k, 1.0, 40, loss_weight=g) <= 1.0 + 1e-9


@pytest.mark.parametrize("name,at_least", [("oneshot", 1.0 - 1e-9), ("gumbel", 0.6), ("clm", 0.45)])
def test_one_shot_slate_loss_exceeds_eps_over_k(name, at_least):
    """The three chosen items rise by Δ and the three others fall by Δ: the 3-slate's loss is
    far above ε/3, so the one-shot charge ε is not overstated (oneshot attains ε exactly)."""
    q, d = np.array([0.0, 0.0, 0.0, 3.0, 3.0, 3.0]), np.ones(6)
    q2 = q + np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    worst = max_log_ratio(slate_log_probabilities(name, q, d, 1.0, 3), slate_log_probabilities(name, q2, d, 1.0, 3))
    assert at_least <= worst <= 1.0 + 1e-9


# --- two-stage with one-shot stages ---------------------------------------------------------------------


def test_two_stage_runs_one_shot_stages_and_its_exact_law_sums_to_one():
    p = two_stage_probabilities("clm", Q, D, 2.0, 3, 0.4, 2, candidate_mechanism="gumbel")
    assert sum(p.values()) == pytest.approx(1.0, abs=1e-12)
    got = select_two_stage("gumbel", Q, D, 2.0, 3, 0.4, 2, np.random.default_rng(1), candidate_mechanism="oneshot")
    assert len(set(got.tolist())) == 2
    assert charged_epsilon("clm", 2.0, 2, m=3, candidate_fraction=0.4, candidate_mechanism="gumbel") == 2.0


# --- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ONE_SHOT)
@pytest.mark.parametrize(
    "k,match",
    [
        (0, r"^k = 0 is out of range; expected an integer with 1 ≤ k ≤ 5 \(the number of candidates\)$"),
        (6, r"^k = 6 is out of range; expected an integer with 1 ≤ k ≤ 5 \(the number of candidates\)$"),
        (2.5, r"^k must be an integer with 1 ≤ k ≤ 5"),
    ],
)
def test_k_outside_1_to_n_is_refused_before_any_draw(name, k, match):
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    with pytest.raises(MechanismInputError, match=match):
        select_slate(name, Q, D, 1.0, k, rng)
    with pytest.raises(MechanismInputError, match=match):
        slate_probabilities(name, Q, D, 1.0, k)
    assert rng.bit_generator.state == before


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.5", True])
def test_a_loss_weight_outside_its_range_is_refused_before_any_draw(value):
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    for call in (
        lambda: select_slate("clm", Q, D, 1.0, 2, rng, loss_weight=value),
        lambda: select("clm", Q, D, 1.0, rng, loss_weight=value),
        lambda: slate_probabilities("clm", Q, D, 1.0, 2, loss_weight=value),
        lambda: charged_epsilon("clm", 1.0, 2, loss_weight=value),
    ):
        with pytest.raises(
            MechanismParamError, match=r"loss_weight must be (a real number|in the closed interval) .*\[0, 1\]"
        ):
            call()
    assert rng.bit_generator.state == before


def test_the_service_charges_a_one_shot_slate_its_map_once(artifact, tmp_path):
    """Through the gRPC service: a k-slate of a one-shot mechanism declaring ε ↦ ε + 1 is charged
    ε + 1 (not k·(ε/k + 1)); clm's slate is charged exactly the request."""
    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    mech, calls = _spy("affine", lambda e: e + 1)
    with registered(mech):
        handle = start(
            ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=10.0, min_candidates=4)
        )
        try:
            cands = [(f"it{i}", 0.1 * i) for i in range(8)]
            with Client(f"127.0.0.1:{handle.port}", retries=0) as c:
                r = c.select("u-affine", cands, mechanism="affine", epsilon=0.5, k=3)
                assert (r.epsilon_spent, len(set(r.item_ids)), r.budget_remaining) == (1.5, 3, 8.5)
                assert [call[0] for call in calls] == ["top_k"]
                r = c.select("u-clm", cands, mechanism="clm", epsilon=0.7, k=4)
                assert (r.epsilon_spent, len(set(r.item_ids))) == (0.7, 4)
            assert handle.ledger.user("u-affine").spent == 1.5 and handle.ledger.user("u-clm").spent == 0.7
        finally:
            handle.stop(grace=1)
