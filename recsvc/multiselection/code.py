"""The code signal: the device's best of a public codebook of C items, its index sent by C-ary
randomised response (docs/concepts/multi-selection.md, "Choosing what the device sends"; the bit
recipe is docs/reference/client-bundle.md, the proof docs/concepts/privacy-proofs.md).

The codebook is the first C items of the server's greedy answer to no signal (uniform weights
over the public population): the items that best cover the population, public data. The device
scores them with its own model (seen items −∞) and keeps x, the index of its best (the earlier on
ties, 0 when all are seen). It sends y drawn exactly from

    P(y | x) = e^ε / (e^ε + C − 1) if y = x,   1 / (e^ε + C − 1) otherwise,

so for ANY two histories P(y | x) / P(y | x') ≤ e^ε, reached when x ≠ x' (y = x). The draw is a
rejection loop on integer words: a uniform Y below C is kept at once if Y = x, else kept with
probability exp(−ε) (Canonne–Kamath–Steinke's Bernoulli(exp(−γ)) for the exact rational γ = ε);
a rejected round starts again. Each round keeps y with probability (1/C)·a(y), a(x) = 1 and
a(y) = e^{−ε} otherwise, so the output has law a(y) / (1 + (C − 1)e^{−ε}): the law above, exactly,
with no floating point. A round ends the loop with probability ≥ 1/C.

The server weights each population prototype p by the likelihood of its own code c_p (its best
of the codebook by its top-L scores, items outside them at its floor): log P(y | c_p) = ε·[c_p = y]
up to a constant, and answers the greedy of that posterior.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError, check_epsilon
from recsvc.multiselection.discrete import Words, randomized_response_draw
from recsvc.multiselection.embedding import Floats
from recsvc.multiselection.greedy import greedy
from recsvc.multiselection.posterior import Ints, Population, weights_from_log_likelihood

#: the codebook sizes prep chooses among, and the ε it chooses at (the issue's target)
CODE_SIZES = (2, 4, 8, 16, 32)
SELECTION_EPSILON = 4.0


def codebook_bytes(item_ids: Sequence[str]) -> bytes:
    """codebook.json's bytes: a JSON array of the codebook's item ids, compact, UTF-8."""
    return json.dumps([str(i) for i in item_ids], ensure_ascii=False, separators=(",", ":")).encode()


def codebook_version(item_ids: Sequence[str]) -> str:
    """The codebook's public version: sha256 (hex) of :func:`codebook_bytes`."""
    return hashlib.sha256(codebook_bytes(item_ids)).hexdigest()


def blind_codebook(population: Population, size: int) -> Ints:
    """The codebook's item rows: the greedy's first ``size`` items for uniform weights."""
    if size < 2 or size > population.num_items:
        raise ParamError(
            "the codebook size must be in 2..{n} (distinct items of the catalog); got {value}",
            n=population.num_items,
            value=size,
        )
    return greedy(population, np.full(population.size, 1.0 / population.size), size)


def held_scores(population: Population, rows: npt.ArrayLike) -> Floats:
    """Each prototype's score of each codebook item (P × C): its top-L score, else its floor."""
    r = np.asarray(rows, dtype=np.int64)
    held = np.tile(population.floor[:, None], (1, r.size))
    for col, j in enumerate(r.tolist()):
        p, pos = np.nonzero(population.top_index == j)
        held[p, col] = population.top_score[p, pos]
    return np.asarray(held, dtype=np.float64)


def prototype_codes(population: Population, rows: npt.ArrayLike) -> Ints:
    """Each prototype's code: the first best of its :func:`held_scores`."""
    return np.asarray(np.argmax(held_scores(population, rows), axis=1), dtype=np.int64)


def code_of(scores: npt.ArrayLike) -> int:
    """The device's code: the index of its best codebook score (−∞ for a seen item), the earlier
    on ties, 0 when every item is seen."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size < 2 or np.isnan(s).any():
        raise ParamError(
            "the codebook scores must be a 1-D array of ≥ 2 numbers (no NaN); got shape {shape}", shape=str(s.shape)
        )
    return int(np.argmax(s))


def randomized_response(index: int, size: int, epsilon: float, words: Words) -> int:
    """y with P(y = index) = e^ε/(e^ε + C − 1), every other y 1/(e^ε + C − 1), drawn exactly
    (module docstring): rounds of uniform_below(C), kept if equal to ``index``, else kept iff
    bernoulli_exp(s, t) with s/t = ε exactly (ε read as the rational its float64 denotes)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 2:
        raise ParamError("the codebook size must be an integer ≥ 2; got {value}", value=repr(size))
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < size:
        raise ParamError("the code must be an integer in [0, {size}); got {value}", size=int(size), value=repr(index))
    r = Fraction(check_epsilon(epsilon, error=ParamError))
    return randomized_response_draw(int(index), int(size), r.numerator, r.denominator, words)


def rr_law(index: int, size: int, epsilon: float) -> Floats:
    """P(y | index) for every y: the law :func:`randomized_response` samples."""
    p = np.full(size, 1.0 / (math.exp(epsilon) + size - 1))
    p[index] = math.exp(epsilon) / (math.exp(epsilon) + size - 1)
    return p


def code_log_likelihood(sent: int, codes: Ints, epsilon: float) -> Floats:
    """log P(sent | c_p) up to a constant, per prototype: ε where c_p = sent, else 0."""
    return np.asarray(np.where(codes == sent, check_epsilon(epsilon, error=ParamError), 0.0), dtype=np.float64)


def respond_code(population: Population, codes: Ints, sent: int, epsilon: float, k: int) -> Ints:
    """The server's k items for a sent code: :func:`greedy` on the randomised-response posterior.
    A function of (sent, ε, k) and public data only (post-processing)."""
    return greedy(population, weights_from_log_likelihood(code_log_likelihood(sent, codes, epsilon)), k)


@dataclass(frozen=True)
class SizeChoice:
    """Prep's choice of C: each size's estimated greedy k = 1 utility fraction at ε on the
    population itself (prototypes as senders), and the best."""

    size: int
    epsilon: float
    estimates: dict[int, float]


def choose_size(
    population: Population, sizes: Sequence[int] = CODE_SIZES, epsilon: float = SELECTION_EPSILON
) -> SizeChoice:
    """The C of ``sizes`` with the largest expected greedy k = 1 utility at ε, each prototype
    sending its own code by randomised response and valuing the answer by its held score over its
    best (ties to the smaller C). Public data only: the population."""
    sizes = [c for c in sizes if 2 <= c <= population.num_items]
    if not sizes:
        raise ParamError("no codebook size fits a catalog of {n} items", n=population.num_items)
    full = blind_codebook(population, max(sizes))
    best = population.top_score[:, 0]
    estimates: dict[int, float] = {}
    for c in sizes:
        rows = full[:c]
        codes = prototype_codes(population, rows)
        answers = np.array([respond_code(population, codes, y, epsilon, 1)[0] for y in range(c)])
        value = held_scores(population, answers) / best[:, None]  # P × C: prototype p's worth of answer y
        law = np.stack([rr_law(int(x), c, epsilon) for x in codes])  # P × C: P(y | c_p)
        estimates[c] = float((law * value).sum(axis=1).mean())
    chosen = max(sizes, key=lambda c: (estimates[c], -c))
    return SizeChoice(chosen, epsilon, estimates)
