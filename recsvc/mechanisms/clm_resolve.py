"""The slow path of clm's exact draw: a comparison of two tape nodes decided on the reals.

:mod:`recsvc.mechanisms.clm_draw` records every real quantity of a draw as a node with a float
enclosure. When two enclosures overlap, :class:`Resolver` evaluates both nodes again in
:mod:`decimal` at round r with 30 + 30r digits, each uniform involved known to 64r bits (its raw
word, then fresh words: more bits of the same real number), until the enclosures are apart. Each
operation is rounded outwards (arithmetic with floor/ceiling contexts; ``ln`` and ``exp``, which
:mod:`decimal` rounds correctly, widened by their last digit), so every enclosure holds the real
value and shrinks to it as r grows: the loop ends with probability 1 (ties have probability 0).
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from decimal import Decimal

import numpy as np

from recsvc.mechanisms import clm_tape as cd
from recsvc.mechanisms.exact_race import Enclosure, widen
from recsvc.mechanisms.exact_sampling import decimal_context

_INF = Decimal("Infinity")
_ZERO, _ONE, _TWO = Decimal(0), Decimal(1), Decimal(2)
_LN10 = 2.302585092994046
_EXACT = decimal_context(1100)  # exact for a sum, difference or double of two float64 values
_ROUNDS = 200  # 64·200 bits: a pair still undecided then is a fault, not chance


class _Arith:
    """Outward-rounded interval operations at one precision."""

    def __init__(self, digits: int) -> None:
        self.digits = digits
        self.down = decimal_context(digits, decimal.ROUND_FLOOR)
        self.up = decimal_context(digits, decimal.ROUND_CEILING)

    def add(self, x: Enclosure, y: Enclosure) -> Enclosure:
        return _safe(lambda: self.down.add(x[0], y[0]), -_INF), _safe(lambda: self.up.add(x[1], y[1]), _INF)

    def sub(self, x: Enclosure, y: Enclosure) -> Enclosure:
        return _safe(lambda: self.down.subtract(x[0], y[1]), -_INF), _safe(lambda: self.up.subtract(x[1], y[0]), _INF)

    def mul(self, x: Enclosure, y: Enclosure) -> Enclosure:
        lo = [self.down.multiply(a, b) for a in x for b in y]
        hi = [self.up.multiply(a, b) for a in x for b in y]
        return min(lo), max(hi)

    def ln(self, x: Decimal, extra: int = 0) -> Enclosure:
        """Bounds of ln x (x ≥ 0)."""
        if x <= 0:
            return -_INF, -_INF
        if x.is_infinite():
            return _INF, _INF
        return widen(decimal_context(self.digits + extra).ln(x), self.digits + extra)

    def exp(self, x: Decimal, extra: int = 0) -> Enclosure:
        if x.is_infinite():
            return (_ZERO, _ZERO) if x < 0 else (_INF, _INF)
        return widen(decimal_context(self.digits + extra).exp(x), self.digits + extra)

    def guard(self, x: Decimal) -> int:
        """Extra digits for 1 − e^{−x} or e^x − 1 at a small x: as many as x has leading zeros."""
        return max(0, -x.adjusted()) + 10 if x.is_finite() and x != 0 else 10

    def tail(self, z: Decimal) -> bool:
        """e^{−z} is below the precision: the series bounds are tighter than the formula."""
        return z > (self.digits + 10) * _LN10

    def phi(self, s: Decimal) -> Enclosure:
        """φ(s) = −ln(1 − e^{−s}) for s ≥ 0."""
        if s <= 0:
            return _INF, _INF
        if s.is_infinite():
            return _ZERO, _ZERO
        g = self.guard(s)
        t = self.exp(s.copy_negate(), g)
        if self.tail(s):  # φ ∈ [t, t/(1 − t)] ⊂ [t, t(1 + 2t)]
            return t[0], self.up.multiply(t[1], self.up.add(_ONE, self.up.multiply(_TWO, t[1])))
        one_minus = (self.down.subtract(_ONE, t[1]), self.up.subtract(_ONE, t[0]))
        lo = self.ln(one_minus[1], g)[1]
        hi = self.ln(one_minus[0], g)[0]
        return lo.copy_negate(), hi.copy_negate()

    def log_phi(self, z: Decimal) -> Enclosure:
        if z <= 0:
            return _INF, _INF
        if z.is_infinite():
            return -_INF, -_INF
        if self.tail(z):  # ln φ ∈ [−z, −z + 2e^{−z}]
            return z.copy_negate(), self.up.add(z.copy_negate(), self.up.multiply(_TWO, self.exp(z.copy_negate())[1]))
        p = self.phi(z)
        return self.ln(p[0])[0], self.ln(p[1])[1]

    def log_expm1(self, z: Decimal) -> Enclosure:
        """ln(e^z − 1) for z ≥ 0."""
        if z <= 0:
            return -_INF, -_INF
        if z.is_infinite():
            return _INF, _INF
        if self.tail(z):  # ln(e^z − 1) ∈ [z − 2e^{−z}, z]
            return self.down.subtract(z, self.up.multiply(_TWO, self.exp(z.copy_negate())[1])), z
        g = self.guard(z)
        e = self.exp(z, g)
        em1 = (self.down.subtract(e[0], _ONE), self.up.subtract(e[1], _ONE))
        return self.ln(em1[0], g)[0], self.ln(em1[1], g)[1]

    def log_add_exp(self, x: Decimal, y: Decimal) -> Enclosure:
        hi, lo = (x, y) if x > y else (y, x)
        if lo == -_INF or hi == _INF:
            return hi, hi
        t = self.exp(self.down.subtract(lo, hi), 10)
        l1p = (self.ln(self.down.add(_ONE, t[0]), 10)[0], self.ln(self.up.add(_ONE, t[1]), 10)[1])
        return self.down.add(hi, max(l1p[0], _ZERO)), self.up.add(hi, min(l1p[1], t[1]))


def _safe(f: Callable[[], Decimal], fallback: Decimal) -> Decimal:
    """∞ − ∞ has no value: the bound falls back to the widest."""
    try:
        return f()
    except decimal.InvalidOperation:
        return fallback


class Resolver:
    """Decides ``x < y`` for tape nodes, exactly; holds each uniform's extra bits across the calls
    of one draw (a rerun meets the same uniforms again)."""

    def __init__(self, inputs: cd.Inputs, fresh: Callable[[int], np.ndarray]) -> None:
        self.inputs = inputs
        self.fresh = fresh  # the generator's random_raw
        self.extra: dict[int, list[int]] = {}  # raw index → its uniform's words after the first
        self.cache: dict[tuple[int, int], Enclosure] = {}  # (round, node) → enclosure

    def less(self, tape: cd.Tape, raw: np.ndarray, x: int, y: int) -> bool:
        for r in range(1, _ROUNDS + 1):
            ex, ey = self._enclose(tape, raw, x, r), self._enclose(tape, raw, y, r)
            if ex[1] < ey[0]:
                return True
            if ex[0] >= ey[1]:
                return False
        raise RuntimeError(f"clm's exact draw could not separate two quantities in {_ROUNDS} rounds")

    def _enclose(self, tape: cd.Tape, raw: np.ndarray, node: int, r: int) -> Enclosure:
        """Node's enclosure at round r, evaluating what it depends on first (no recursion: tapes
        are long chains)."""
        ar = _Arith(30 + 30 * r)
        stack = [node]
        while stack:
            i = stack[-1]
            if (r, i) in self.cache:
                stack.pop()
                continue
            op, a0, a1 = (int(v) for v in tape.ops[i])
            deps = [
                a for a in ((a0,) if op in _UNARY else (a0, a1) if op in _BINARY else ()) if (r, a) not in self.cache
            ]
            if deps:
                stack.extend(deps)
                continue
            self.cache[(r, i)] = self._op(ar, tape, raw, i, op, a0, a1, r)
            stack.pop()
        return self.cache[(r, node)]

    def _op(self, ar: _Arith, tape: cd.Tape, raw: np.ndarray, i: int, op: int, a0: int, a1: int, r: int) -> Enclosure:
        c = self.cache
        if op == cd.CONST:
            v = Decimal(float(tape.vals[i, 2]))
            return v, v
        if op == cd.UTIL:
            return self._util(ar, a0, a1)
        if op == cd.LOG_SIZE:
            k = self.inputs.k
            return ar.ln(Decimal(math.comb(a1 - a0 - 2, k - a0 - 1)), 5)
        if op == cd.LOG_INT:
            return ar.ln(Decimal(a0), 5)
        if op in (cd.LOG_U, cd.LOG_E):
            lo_u, hi_u = self._uniform(ar, raw, a0, r)
            ln_lo, ln_hi = ar.ln(lo_u)[0], ar.ln(hi_u)[1]
            if op == cd.LOG_U:
                return ln_lo, ln_hi
            return ar.ln(ln_hi.copy_negate())[0], ar.ln(ln_lo.copy_negate())[1]  # E = −ln U decreases in U
        x = c[(r, a0)]
        if op == cd.ADD:
            return ar.add(x, c[(r, a1)])
        if op == cd.SUB:
            return ar.sub(x, c[(r, a1)])
        if op == cd.PHI_OF_LOG:  # φ(e^x) decreases in x
            s_lo, s_hi = ar.exp(x[0])[0], ar.exp(x[1])[1]
            return ar.phi(s_hi)[0], ar.phi(s_lo)[1]
        if op == cd.LOG_PHI:  # decreasing
            return ar.log_phi(x[1])[0], ar.log_phi(x[0])[1]
        if op == cd.LOG_EXPM1:  # increasing
            return ar.log_expm1(x[0])[0], ar.log_expm1(x[1])[1]
        if op == cd.LOG_ADD_EXP:
            y = c[(r, a1)]
            return ar.log_add_exp(x[0], y[0])[0], ar.log_add_exp(x[1], y[1])[1]
        raise ValueError(f"unknown tape op {op}")

    def _util(self, ar: _Arith, h: int, t: int) -> Enclosure:
        """−(1 − γ)·x_h + γ·x_{t−1}, x_i = (xs_i − xs_0)·ε/(2Δmax), on the reals the floats denote."""
        p = self.inputs
        xs0 = Decimal(float(p.xs[0]))
        twice = _EXACT.multiply(_TWO, Decimal(float(p.d.max())))  # a double's decimal expansion has ≤ 767 digits
        c = (ar.down.divide(Decimal(p.epsilon), twice), ar.up.divide(Decimal(p.epsilon), twice))

        def x(i: int) -> Enclosure:
            diff = (ar.down.subtract(Decimal(float(p.xs[i])), xs0), ar.up.subtract(Decimal(float(p.xs[i])), xs0))
            return ar.mul(diff, c)

        gamma = Decimal(p.gamma)
        one_minus = (ar.down.subtract(_ONE, gamma), ar.up.subtract(_ONE, gamma))
        xh = x(h)
        a = ar.mul(one_minus, (xh[1].copy_negate(), xh[0].copy_negate()))
        b = ar.mul((gamma, gamma), x(t - 1))
        return ar.add(a, b)

    def _uniform(self, ar: _Arith, raw: np.ndarray, j: int, r: int) -> Enclosure:
        """U_j ∈ [K·2^{−64r}, (K + 1)·2^{−64r}]: its raw word, then r − 1 further words."""
        words = self.extra.setdefault(j, [])
        while len(words) < r - 1:
            words.extend(int(w) for w in self.fresh(r - 1 - len(words)))
        big = int(raw[j])
        for w in words[: r - 1]:
            big = (big << 64) | w
        scale = Decimal(2 ** (64 * r))
        exact = decimal_context(64 * r + 40)  # K/2^{64r} has at most 64r significant digits
        return exact.divide(Decimal(big), scale), exact.divide(Decimal(big + 1), scale)


_UNARY = frozenset({cd.PHI_OF_LOG, cd.LOG_PHI, cd.LOG_EXPM1})
_BINARY = frozenset({cd.ADD, cd.SUB, cd.LOG_ADD_EXP})
