"""Exact discrete Laplace noise from 32-bit random words, the same in every language
(docs/reference/client-bundle.md, "The noise"; the proof is in docs/concepts/privacy-proofs.md).

The device's noise on the lattice has P(x) ∝ exp(−|x|·s/t) on the integers, for positive integers
s and t. It is drawn by Canonne, Kamath and Steinke's algorithms (2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1 and 2): Bernoulli(exp(−γ)) for a rational γ by exact integer
comparisons, a geometric variate by rejection, and a sign. Every random choice is a uniform
integer below some n, made from 32-bit words by masking and rejection, so the output is an exact
function of the word sequence: Python's ints and JavaScript's BigInt compute the same integers
from the same words, with no floating point anywhere.

The exact em/krr samplers (:mod:`recsvc.mechanisms.exact_sampling`) decide a finite choice on a
real uniform against float inputs; this law has infinite support and a language-neutral word
protocol, so it is drawn here instead.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction

import numpy as np

from recsvc.checks import ParamError

WORD_BITS = 32
_CHUNK = 256  # words drawn from a generator at a time: one numpy call serves a whole signal


class Words:
    """A stream of uniform 32-bit words: from a generator (a CSPRNG whenever the result leaves the
    device, :func:`recsvc.rng.csprng`), or a fixed sequence (test vectors), which raises a
    ParamError when it runs out. ``next`` is a C-level iterator's ``__next__``: the device takes
    hundreds of words per signal, and a Python method per word would double its time."""

    def __init__(self, source: np.random.Generator | Sequence[int]) -> None:
        self.fixed = not isinstance(source, np.random.Generator)
        if isinstance(source, np.random.Generator):
            rng = source
            chunks = iter(lambda: rng.integers(0, 1 << WORD_BITS, size=_CHUNK, dtype=np.uint64).tolist(), None)
            self._it: Iterator[int] = itertools.chain.from_iterable(chunks)
            self._size = 0
        else:
            words = [_word(w) for w in source]
            self._it, self._size = iter(words), len(words)
        self.next: Callable[[], int] = self._it.__next__

    @property
    def used(self) -> int:
        """Words consumed from a fixed sequence."""
        return self._size - operator.length_hint(self._it) if self.fixed else 0

    def draw(self, fn: Callable[[Callable[[], int]], int]) -> int:
        """``fn(next)``, a ParamError if a fixed sequence runs out during it."""
        try:
            return fn(self.next)
        except StopIteration:
            raise ParamError(
                "the random words ran out after {used}; expected enough words for the draw", used=self._size
            ) from None


def _word(w: object) -> int:
    if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 0 <= int(w) < 1 << WORD_BITS:
        raise ParamError("a random word must be an integer in [0, 2**32); got {value}", value=repr(w))
    return int(w)


def _below(n: int, nxt: Callable[[], int]) -> int:
    if n == 1:
        return 0
    b = (n - 1).bit_length()
    mask = (1 << b) - 1
    if b <= WORD_BITS:  # the common case, kept tight
        while True:
            x = nxt() & mask
            if x < n:
                return x
    count = -(-b // WORD_BITS)
    while True:
        x = 0
        for _ in range(count):
            x = (x << WORD_BITS) | nxt()
        x &= mask
        if x < n:
            return x


def _bernoulli_exp(num: int, den: int, nxt: Callable[[], int]) -> bool:
    while num > den:
        if not _bernoulli_exp(1, 1, nxt):
            return False
        num -= den
    k = 1
    while _below(den * k, nxt) < num:
        k += 1
    return k % 2 == 1


def _discrete_laplace(s: int, t: int, nxt: Callable[[], int]) -> int:
    while True:
        u = _below(t, nxt)
        if not _bernoulli_exp(u, t, nxt):
            continue
        v = 0
        while _bernoulli_exp(1, 1, nxt):
            v += 1
        y = (u + t * v) // s
        negative = _below(2, nxt) < 1
        if negative and y == 0:
            continue
        return -y if negative else y


def _randomized_response(index: int, size: int, s: int, t: int, nxt: Callable[[], int]) -> int:
    while True:
        y = _below(size, nxt)
        if y == index or _bernoulli_exp(s, t, nxt):
            return y


def uniform_below(n: int, words: Words) -> int:
    """A uniform integer in [0, n): ⌈b/32⌉ words (b the bit length of n − 1), first word most
    significant, masked to b bits, retried while ≥ n. n = 1 takes no word."""
    return words.draw(lambda nxt: _below(n, nxt))


def bernoulli_exp(num: int, den: int, words: Words) -> bool:
    """Bernoulli(exp(−num/den)) for num ≥ 0, den ≥ 1 (CKS Algorithm 1): while γ > 1, a
    Bernoulli(exp(−1)) that must succeed and γ ← γ − 1; then for γ ≤ 1 the least K with
    Bernoulli(γ/K) false (uniform_below(den·K) ≥ num), success iff K is odd."""
    return bool(words.draw(lambda nxt: _bernoulli_exp(num, den, nxt)))


def discrete_laplace(s: int, t: int, words: Words) -> int:
    """One draw with P(x) ∝ exp(−|x|·s/t) on the integers (CKS Algorithm 2): X = U + t·V is
    geometric with ratio exp(−1/t) (U uniform below t accepted with probability exp(−U/t), V the
    number of Bernoulli(exp(−1)) successes), Y = ⌊X/s⌋ is geometric with ratio exp(−s/t), and a
    sign bit (uniform_below(2) < 1: negative), rejecting −0 so that 0 is not counted twice."""
    return words.draw(lambda nxt: _discrete_laplace(s, t, nxt))


def discrete_laplace_vector(s: int, t: int, count: int, words: Words) -> list[int]:
    """``count`` independent draws of :func:`discrete_laplace`, in order."""
    return [words.draw(lambda nxt: _discrete_laplace(s, t, nxt)) for _ in range(count)]


def randomized_response_draw(index: int, size: int, s: int, t: int, words: Words) -> int:
    """C-ary randomised response of ``index`` < C = ``size`` at ε = s/t, exactly: rounds of
    uniform_below(C), the round's Y kept if it is ``index``, else kept iff bernoulli_exp(s, t);
    a round that keeps nothing starts again (the law is in :mod:`.code`)."""
    return words.draw(lambda nxt: _randomized_response(index, size, s, t, nxt))


def rate(epsilon: float, sensitivity: int) -> tuple[int, int]:
    """(s, t) in lowest terms with s/t = ε/Δ exactly, ε read as the exact rational its float64
    denotes: the noise P(x) ∝ exp(−|x|·ε/Δ) then loses at most ε between lattice points at L1
    distance Δ, exactly."""
    if sensitivity < 1:
        raise ParamError("the sensitivity must be a positive integer; got {value}", value=sensitivity)
    r = Fraction(epsilon) / sensitivity
    return r.numerator, r.denominator
