"""Public API of recsvc.mechanisms: registry, validation (bad input draws nothing), batching."""

import json

import numpy as np
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.mechanisms import (
    MECHANISMS,
    MechanismInputError,
    NonPrivateMechanismError,
    get_mechanism,
    probabilities,
    select,
    select_batch,
)
from recsvc.rng import user_stream

NAMES = ["rnm", "rnm_laplace", "em", "pf", "krr", "random", "rnmh", "rs", "rs_improved", "gem", "mgem", "combined_gem"]
NAMES += ["oneshot", "gumbel", "clm"]  # one-shot top-k
EXACT = {"rnm", "rnm_laplace", "em", "pf", "krr", "random", "gem", "mgem", "combined_gem", "oneshot", "gumbel", "clm"}

Q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
D = np.array([0.5, 2.0, 0.2, 1.0, 0.7])


def test_registry_names_and_flags():
    assert list(MECHANISMS) == NAMES
    assert [n for n, m in MECHANISMS.items() if not m.private] == ["rnmh"]
    assert {n for n, m in MECHANISMS.items() if m.exact} == EXACT
    for m in MECHANISMS.values():
        assert m.description and m.privacy.label == ("ε-DP" if m.private else "NOT DP")
        assert "Privacy:" in (m.sample.__doc__ or ""), f"{m.name}: docstring must state its privacy"


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_select_returns_valid_index_for_every_mechanism(name):
    rng = np.random.default_rng(0)
    picks = {select(name, Q, D, 2.0, rng=rng, allow_non_private=True) for _ in range(200)}
    assert picks <= set(range(5)) and len(picks) >= 2
    assert all(isinstance(i, int) for i in picks)


def test_select_default_rng_is_csprng_and_works():
    picks = [select("rnm", Q, D, 50.0) for _ in range(20)]
    assert picks.count(1) >= 15  # ε = 50: the argmax (index 1) nearly always


def test_rnmh_requires_explicit_opt_in():
    with pytest.raises(NonPrivateMechanismError, match="NOT differentially private"):
        select("rnmh", Q, D, 1.0)
    with pytest.raises(NonPrivateMechanismError):
        select_batch("rnmh", Q[None], D, 1.0, 3, 0)
    with pytest.raises(ValueError):
        get_mechanism("rnmh")
    assert get_mechanism("rnmh", allow_non_private=True).name == "rnmh"
    assert select("rnmh", Q, D, 1.0, rng=np.random.default_rng(0), allow_non_private=True) in range(5)


@pytest.mark.parametrize("name", ["rs", "rs_improved", "rnmh"])
def test_probabilities_not_implemented_without_exact_form(name):
    with pytest.raises(NotImplementedError, match="no exact"):
        probabilities(name, Q, D, 1.0)


BAD_CASES = [
    (dict(scores=[0.1, np.nan, 0.3]), "scores must be finite"),
    (dict(scores=[0.1, np.inf, 0.3]), "scores must be finite"),
    (dict(sensitivities=[1.0, 0.0, 1.0]), "sensitivities must be > 0"),
    (dict(sensitivities=[1.0, -1.0, 1.0]), "sensitivities must be > 0"),
    (dict(sensitivities=[1.0, np.nan, 1.0]), "sensitivities must be finite"),
    (dict(sensitivities=[1.0, 1.0]), "same length"),
    (dict(scores=[], sensitivities=[]), "n = 0"),
    (dict(scores=[[0.1, 0.2, 0.3]]), "1-D"),
    (dict(epsilon=0.0), "epsilon must be a positive"),
    (dict(epsilon=-1.0), "epsilon must be a positive"),
    (dict(epsilon=float("nan")), "epsilon must be a positive"),
    (dict(epsilon=float("inf")), "epsilon must be a positive"),
    (dict(epsilon="1"), "epsilon must be a positive"),
    (dict(name="nope"), "unknown mechanism 'nope'; expected one of rnm"),
    (dict(params=dict(beta=0.0)), r"beta must be in the open interval \(0, 1\)"),
    (dict(params=dict(beta=1.5)), "beta must be in"),
    (dict(params=dict(gamma=1.0)), "gamma must be in"),
    (dict(params=dict(corr_budget_fraction=0.0)), "corr_budget_fraction must be in"),
    (dict(params=dict(corr_budget_fraction=1.0)), "corr_budget_fraction must be in"),
    (dict(params=dict(delta=0.1)), "unknown mechanism parameter"),
]


@pytest.mark.parametrize("case,message", BAD_CASES)
def test_bad_input_raises_clear_error_and_draws_nothing(case, message):
    args = dict(name="combined_gem", scores=[0.1, 0.2, 0.3], sensitivities=[1.0, 1.0, 1.0], epsilon=1.0, params={})
    args.update(case)
    rng = np.random.default_rng(123)
    before = rng.bit_generator.state
    with pytest.raises(MechanismInputError, match=message):
        select(args["name"], args["scores"], args["sensitivities"], args["epsilon"], rng=rng, **args["params"])
    assert rng.bit_generator.state == before  # nothing drawn
    if args["name"] in MECHANISMS and MECHANISMS[args["name"]].exact and np.ndim(args["scores"]) == 1:
        with pytest.raises(ValueError, match=message):
            probabilities(args["name"], args["scores"], args["sensitivities"], args["epsilon"], **args["params"])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(trials=0), "trials must be an integer >= 1"),
        (dict(trials=2.5), "trials must be an integer"),
        (dict(seed=-1), "seed must be a non-negative integer"),
        (dict(user_offset=-3), "user_offset must be"),
        (dict(scores=np.zeros(4)), r"shape \(B, n\)"),
        (dict(sensitivities=np.ones(3)), "sensitivities must have shape"),
        (dict(sensitivities=np.ones((2, 4)) * [[1], [0]]), "must be > 0"),
    ],
)
def test_select_batch_bad_input(kwargs, message):
    args = dict(scores=np.zeros((2, 4)), sensitivities=np.ones(4), trials=3, seed=0)
    args.update(kwargs)
    extra = {k: v for k, v in args.items() if k == "user_offset"}
    with pytest.raises(ValueError, match=message):
        select_batch("rnm", args["scores"], args["sensitivities"], 1.0, args["trials"], args["seed"], **extra)


def test_select_rejects_non_generator_rng():
    with pytest.raises(ValueError, match=r"numpy.random.Generator"):
        select("rnm", Q, D, 1.0, rng=np.random.RandomState(0))


def test_none_params_mean_defaults():
    a = select("gem", Q, D, 1.0, rng=np.random.default_rng(5), beta=None, gamma=None)
    b = select("gem", Q, D, 1.0, rng=np.random.default_rng(5))
    assert a == b
    np.testing.assert_array_equal(
        probabilities("gem", Q, D, 1.0, beta=None), probabilities("gem", Q, D, 1.0, beta=0.05)
    )


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_select_batch_reproducible_and_chunk_invariant(name):
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(6, 7))
    sens = rng.uniform(0.2, 2.0, size=(6, 7))
    full = select_batch(name, scores, sens, 1.0, 9, 42, allow_non_private=True)
    assert full.shape == (6, 9) and full.dtype == np.int64
    assert full.min() >= 0 and full.max() < 7
    np.testing.assert_array_equal(full, select_batch(name, scores, sens, 1.0, 9, 42, allow_non_private=True))
    head = select_batch(name, scores[:2], sens[:2], 1.0, 9, 42, allow_non_private=True)
    tail = select_batch(name, scores[2:], sens[2:], 1.0, 9, 42, user_offset=2, allow_non_private=True)
    np.testing.assert_array_equal(np.vstack([head, tail]), full)
    assert not np.array_equal(full, select_batch(name, scores, sens, 1.0, 9, 43, allow_non_private=True))


def test_select_batch_row_uses_user_stream():
    """Row b draws from user_stream(seed, b): for `random` that is integers(0, n, trials)."""
    scores = np.array([[0.0, 0.5, 1.0, 0.2]] * 3)
    out = select_batch("random", scores, np.ones(4), 1.0, 5, 7)
    for b in range(3):
        np.testing.assert_array_equal(out[b], user_stream(7, b).integers(0, 4, 5))


def test_shared_and_per_user_sensitivities_agree():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(3, 5))
    np.testing.assert_array_equal(
        select_batch("gem", scores, D, 1.0, 4, 0), select_batch("gem", scores, np.tile(D, (3, 1)), 1.0, 4, 0)
    )


def test_select_batch_empty_batch():
    assert select_batch("rnm", np.zeros((0, 3)), np.ones(3), 1.0, 4, 0).shape == (0, 4)


def test_cli_lists_mechanisms(capsys):
    assert recsvc_main(["mechanisms"]) == 0
    out = capsys.readouterr().out
    rnmh = next(line for line in out.splitlines() if line.startswith("rnmh"))
    assert "NOT DP" in rnmh and " no " in rnmh
    assert recsvc_main(["mechanisms", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in table] == NAMES
    assert {r["name"]: r["privacy"] for r in table}["gem"] == "ε-DP"
    assert {r["name"] for r in table if r["exact"]} == EXACT


@pytest.mark.parametrize("name", ["rs", "rs_improved"])
def test_gamma_below_the_floor_is_refused_before_any_draw(name):
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    with pytest.raises(MechanismInputError, match=r"gamma must be at least 1e-06 .*got 1e-09"):
        select(name, Q, D, 1.0, rng=rng, gamma=1e-9)
    assert rng.bit_generator.state == state  # nothing drawn
    assert select(name, Q, D, 1.0, rng=rng, gamma=1e-6) in range(5)  # the floor itself is allowed


@pytest.mark.parametrize("name", ["gem", "mgem", "combined_gem"])
@pytest.mark.parametrize("eps", [1e-308, 5e-324])
def test_gem_family_refuses_an_epsilon_that_overflows_t(name, eps):
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    with pytest.raises(MechanismInputError, match="too small"):
        select(name, Q, D, eps, rng=rng)
    with pytest.raises(MechanismInputError, match="too small"):
        probabilities(name, Q, D, eps)
    assert rng.bit_generator.state == state
    # A tiny but representable ε is still the mechanism: probabilities finite and summing to 1.
    p = probabilities(name, Q, D, 1e-300)
    assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0)
