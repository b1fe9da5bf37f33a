"""Checked once, then drawn: valid_slate/draw_slate and valid_two_stage/draw_two_stage are
select_slate and select_two_stage in two steps, with the same draws, refusals and messages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from recsvc.mechanisms import (
    MechanismInputError,
    NonPrivateMechanismError,
    ValidSlate,
    ValidTwoStage,
    draw_slate,
    draw_two_stage,
    select_slate,
    select_two_stage,
    valid_slate,
    valid_slates,
    valid_two_stage,
)

Q = np.random.default_rng(3).uniform(0.0, 1.0, 12)
D = np.random.default_rng(4).uniform(0.1, 0.5, 12)


# rnm and em peel step by step, gem and mgem peel natively (peel_fn), oneshot and gumbel are one-shot
@pytest.mark.parametrize("name", ["rnm", "em", "gem", "mgem", "oneshot", "gumbel"])
@pytest.mark.parametrize("k", [1, 4])
def test_the_two_steps_draw_what_select_slate_draws(name: str, k: int) -> None:
    for seed in range(3):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        v = valid_slate(name, Q, D, 2.0, k)
        assert isinstance(v, ValidSlate) and v.k == k
        assert draw_slate(v, a).tolist() == select_slate(name, Q, D, 2.0, k, b).tolist()
        assert a.random() == b.random()  # the generator moved exactly as far


@pytest.mark.parametrize(("name", "candidate"), [("rnm", "oneshot"), ("gem", "gumbel"), ("em", "rnm")])
def test_the_two_steps_draw_what_select_two_stage_draws(name: str, candidate: str) -> None:
    for seed in range(3):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        v = valid_two_stage(name, Q, D, 2.0, 6, 0.4, 2, candidate)
        assert isinstance(v, ValidTwoStage) and (v.candidates.k, v.k) == (6, 2)
        got = draw_two_stage(v, a).tolist()
        assert got == select_two_stage(name, Q, D, 2.0, 6, 0.4, 2, b, candidate).tolist()
        assert a.random() == b.random()


@pytest.mark.parametrize(
    ("args", "params"),
    [
        (("rnm", Q, D, 0.0, 2), {}),
        (("rnm", np.r_[Q[:-1], np.nan], D, 1.0, 2), {}),
        (("rnm", Q, -D, 1.0, 2), {}),
        (("rnm", Q, D[:3], 1.0, 2), {}),
        (("rnm", Q, D, 1.0, 13), {}),
        (("gem", Q, D, 1.0, 2), {"beta": 2.0}),
        (("nope", Q, D, 1.0, 2), {}),
        (("rnm", Q, D, 1e308, 2), {}),
    ],
)
def test_bad_input_is_refused_by_the_check_with_select_slates_message(
    args: tuple[str, np.ndarray, np.ndarray, float, int], params: dict
) -> None:
    name, q, d, epsilon, k = args
    with pytest.raises(MechanismInputError) as want:
        select_slate(name, q, d, epsilon, k, np.random.default_rng(0), **params)
    with pytest.raises(MechanismInputError) as got:
        valid_slate(name, q, d, epsilon, k, **params)
    assert str(got.value) == str(want.value) and type(got.value) is type(want.value)


def test_non_private_mechanisms_are_refused_unless_allowed_and_a_check_pickles() -> None:
    with pytest.raises(NonPrivateMechanismError):
        valid_slate("rnmh", Q, D, 1.0, 2)
    with pytest.raises(NonPrivateMechanismError):
        valid_two_stage("rnm", Q, D, 1.0, 4, 0.5, 2, "rnmh")
    v = valid_two_stage("gem", Q, D, 1.0, 4, 0.5, 2, "oneshot", beta=0.3)
    assert v.values == {"beta": 0.3} and "q=" not in repr(v)  # checked parameters; no scores in a repr
    again = pickle.loads(pickle.dumps(v))  # a service sends it to a draw process
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    assert draw_two_stage(again, a).tolist() == draw_two_stage(v, b).tolist()


def test_valid_slates_gives_each_row_what_valid_slate_gives_it_alone() -> None:
    """Rows checked together (one compiled pass) come out as each alone: the same checked record,
    or the same refusal with the same message (an ε too large for one row's range, a NaN score,
    Δ = 0, a row shorter than k); a lone row takes check_inputs' own pass."""
    rows = [Q[:4], np.array([0.0, 1e300]), np.array([0.1, np.nan, 0.2]), Q[4:9], Q[9:11]]
    sens = [D[:4], np.ones(2), np.ones(3), np.r_[D[4:8], 0.0], D[9:11]]
    eps = [0.5, 1e300, 1.0, 2.0, 0.25]
    lengths = np.array([r.size for r in rows])
    for k in (1, 3):
        got = valid_slates("gem", np.concatenate(rows), np.concatenate(sens), lengths, eps, k, beta=0.1)
        for g, q, d, e in zip(got, rows, sens, eps, strict=True):
            try:
                want: ValidSlate | MechanismInputError = valid_slate("gem", q, d, e, k, beta=0.1)
            except MechanismInputError as exc:
                want = exc
            assert type(g) is type(want)
            if isinstance(want, ValidSlate):
                assert isinstance(g, ValidSlate) and _fields(g) == _fields(want)
            else:
                assert str(g) == str(want)
        assert sum(isinstance(g, ValidSlate) for g in got) == (2 if k == 1 else 1)  # rows 0 and 4; 4 is short of k = 3
    (alone,) = valid_slates("rnm", Q, D, np.array([12]), [1.0], 2)
    assert isinstance(alone, ValidSlate) and alone.q.tolist() == Q.tolist() and alone.eps_step == 0.5


def _fields(v: ValidSlate) -> tuple:
    return v.mechanism, v.q.tolist(), v.d.tolist(), v.eps_step, v.k, dict(v.values)
