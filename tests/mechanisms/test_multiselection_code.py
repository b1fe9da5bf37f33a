"""The code signal is exactly ε-local-DP: the law of one randomised-response round, enumerated
over the words it reads, gives output probabilities whose ratio between any two codes is at most
e^ε and reaches it; the sampler follows that law (chi-square); the shared test vectors
(docs/reference/multiselect-vectors.json, "code_vectors") give the same code and the same sent
index from exactly their words; the server's posterior is the randomised-response likelihood."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from recsvc.checks import ParamError
from recsvc.model import Model
from recsvc.multiselection import (
    Population,
    Words,
    blind_codebook,
    choose_size,
    code_log_likelihood,
    code_of,
    greedy,
    prototype_codes,
    randomized_response,
    respond_code,
    rr_law,
)

VECTORS = Path(__file__).parents[2] / "docs" / "reference" / "multiselect-vectors.json"


def _round_law(index: int, size: int, accept: Fraction) -> list[Fraction]:
    """P(a round returns y) for each y, from the round's own steps: uniform_below(C) reads one
    word masked to b bits and retries values ≥ C (so every y < C has the same share of the 2^b
    masked values), then keeps y = index, or any other y with probability ``accept``
    (Bernoulli(exp(−ε)), whose exactness test_bernoulli_exp_has_probability_exp_minus_gamma checks)."""
    b = (size - 1).bit_length()
    hits = [0] * size
    for masked in range(1 << b):  # the masked word values, each equally likely
        if masked < size:
            hits[masked] += 1
    total = sum(hits)
    return [Fraction(h, total) * (1 if y == index else accept) for y, h in enumerate(hits)]


@pytest.mark.parametrize("size", [2, 5, 16, 33])
def test_the_exact_law_ratio_never_exceeds_epsilon_and_reaches_it(size: int) -> None:
    # Output law = a round's law given that it returns (rounds are independent, each ends the
    # loop with probability ≥ 1/C). With q = exp(−ε) the log-ratio between two codes is
    # log(P(y | x) / P(y | x')) = log of a ratio of {1, q}, exactly ±ε or 0. q is carried as a
    # symbol: the exact rationals below stand for q = 1/2, 1/7 and 1/1000.
    for q in (Fraction(1, 2), Fraction(1, 7), Fraction(1, 1000)):
        laws = []
        for x in range(size):
            r = _round_law(x, size, q)
            laws.append([p / sum(r) for p in r])
            assert sum(laws[-1]) == 1
            assert laws[-1][x] == 1 / (1 + (size - 1) * q)  # = e^ε / (e^ε + C − 1)
        worst = max(laws[x][y] / laws[xp][y] for x in range(size) for xp in range(size) for y in range(size))
        assert worst == 1 / q  # e^ε exactly, and never more
        np.testing.assert_allclose([float(p) for p in laws[1]], rr_law(1, size, -math.log(float(q))), rtol=1e-12)


@pytest.mark.parametrize(("size", "epsilon"), [(5, 1.0), (16, 4.0), (2, 0.3)])
def test_the_sampler_follows_the_randomised_response_law(size: int, epsilon: float) -> None:
    n = 6000  # chi-square over C cells; p < 1e-4 fails (fixed seed)
    words = Words(np.random.default_rng(size))
    x = size // 2
    draws = np.array([randomized_response(x, size, epsilon, words) for _ in range(n)])
    counts = np.bincount(draws, minlength=size)
    expected = rr_law(x, size, epsilon) * n
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    assert counts[x] / n == pytest.approx(math.exp(epsilon) / (math.exp(epsilon) + size - 1), abs=0.03)


def test_bad_codes_and_sizes_are_refused_and_draw_nothing() -> None:
    words = Words([1, 2, 3])
    for index, size, match in (
        (3, 3, r"the code must be an integer in \[0, 3\); got 3"),
        (-1, 3, "got -1"),
        (0, 1, "size must be an integer ≥ 2"),
    ):
        with pytest.raises(ParamError, match=match):
            randomized_response(index, size, 1.0, words)
    with pytest.raises(ParamError, match="epsilon must be a positive"):
        randomized_response(0, 3, 0.0, words)
    assert words.used == 0


def test_the_shared_vectors_give_the_same_code_and_sent_index_from_exactly_their_words() -> None:
    doc = json.loads(VECTORS.read_text())
    w1, w2 = (np.array(doc["code_model"][k]) for k in ("w1", "w2"))
    n = w1.shape[0]
    model = Model(w1=sp.csr_matrix(w1), w2=sp.csr_matrix(w2), item_ids=np.array([f"i{j}" for j in range(n)]))
    assert len(doc["code_vectors"]) >= 5
    for v in doc["code_vectors"]:
        rows = np.array(sorted(set(v["history_rows"])), dtype=np.int64)
        book = np.array(v["codebook"], dtype=np.int64)
        s = model.score_items(rows, book)
        s[np.isin(book, rows)] = -np.inf
        assert [None if math.isinf(x) else x for x in s.tolist()] == v["scores"], v["name"]  # bit for bit
        assert code_of(s) == v["code"], v["name"]
        words = Words(v["words"])
        assert randomized_response(v["code"], book.size, v["epsilon"], words) == v["sent"], v["name"]
        assert words.used == len(v["words"])
        with pytest.raises(ParamError, match="ran out"):
            randomized_response(v["code"], book.size, v["epsilon"], Words(v["words"][:-1]))
    assert {v["code"] for v in doc["code_vectors"]} != {0} and any(v["sent"] != v["code"] for v in doc["code_vectors"])


@pytest.fixture(scope="module")
def population() -> Population:
    rng = np.random.default_rng(3)
    p, n, top = 80, 30, 8
    pref = rng.integers(0, 3, p)  # three tastes: items 0-9, 10-19, 20-29
    index = np.stack([rng.choice(np.arange(10) + 10 * t, top, replace=False) for t in pref])
    score = -np.sort(-rng.gamma(3.0, 1.0, (p, top)), axis=1) + 1.0
    return Population(rng.normal(size=(p, 2)), index, score, n).warm()


def test_the_posterior_is_the_randomised_response_likelihood(population: Population) -> None:
    book = blind_codebook(population, 4)
    assert book.tolist() == greedy(population, np.full(population.size, 1 / population.size), 4).tolist()
    codes = prototype_codes(population, book)
    assert len(set(codes.tolist())) >= 2
    ll = code_log_likelihood(2, codes, 1.5)
    assert set(ll.tolist()) <= {0.0, 1.5} and (ll == 1.5).tolist() == (codes == 2).tolist()
    w = np.where(codes == 2, math.exp(1.5), 1.0)
    assert respond_code(population, codes, 2, 1.5, 3).tolist() == greedy(population, w / w.sum(), 3).tolist()


def test_prep_chooses_the_size_with_the_best_estimate(population: Population) -> None:
    choice = choose_size(population, (2, 4, 8))
    assert set(choice.estimates) == {2, 4, 8} and choice.epsilon == 4.0
    assert choice.estimates[choice.size] == max(choice.estimates.values())
    assert all(0 < u <= 1 for u in choice.estimates.values())
    with pytest.raises(ParamError, match=r"codebook size must be in 2\.\.30"):
        blind_codebook(population, 31)
