"""The device's randomness and its local choice, bit for bit as docs/reference/client-bundle.md
fixes them, so that a device in any language draws the same noise distribution and keeps the same
item.

Noise: each Laplace(0, 1) variate is X − Y with X = −ln U₁, Y = −ln U₂ independent standard
exponentials, U = (m + 1)/2⁵³ for 53 uniform random bits m. U lies in (0, 1] and never 0, so
−ln U is finite (at most 53·ln 2 ≈ 36.7): no draw can be ±∞ or NaN, and the spec is the same in
every language that has a CSPRNG and a double-precision ln.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError

Floats = npt.NDArray[np.float64]
UInts = npt.NDArray[np.uint64]

BITS = 53  # a double's significand: (m + 1)/2⁵³ is exact for every m < 2⁵³
_SCALE = 2.0**-BITS


def uniform_from_bits(m: npt.ArrayLike) -> Floats:
    """U = (m + 1)/2⁵³ ∈ (0, 1] for integers 0 ≤ m < 2⁵³ (exact in float64)."""
    bits = np.asarray(m, dtype=np.uint64)
    if bits.size and int(bits.max()) >> BITS:
        raise ParamError("random bits must be integers below 2**53; got {value}", value=str(int(bits.max())))
    return np.asarray((bits + np.uint64(1)).astype(np.float64) * _SCALE, dtype=np.float64)


def laplace_from_bits(m: npt.ArrayLike) -> Floats:
    """Laplace(0, 1) variates from ``m`` of shape (2, …): −ln U(m[0]) + ln U(m[1])."""
    u = uniform_from_bits(m)
    if u.ndim == 0 or u.shape[0] != 2:
        raise ParamError(
            "random bits must have shape (2, ...) (one word for X, one for Y); got {shape}", shape=str(u.shape)
        )
    return np.asarray(np.log(u[1]) - np.log(u[0]), dtype=np.float64)


def laplace_noise(shape: int | tuple[int, ...], rng: np.random.Generator) -> Floats:
    """Laplace(0, 1) variates of ``shape`` from 2 × 53 uniform bits each of ``rng`` (a CSPRNG,
    :func:`recsvc.rng.csprng`, whenever the result leaves the device)."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return laplace_from_bits(rng.integers(0, 1 << BITS, size=(2, *dims), dtype=np.uint64))


def local_choice(scores: npt.ArrayLike) -> int:
    """The index of the best of the server's k items by the device's true scores (−∞ for an item
    in the history), ties to the earlier item in the server's order. When every item is −∞ (all
    k are in the history) the first is kept: the server's best guess."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.shape[0] == 0:
        raise ParamError(
            "scores must be a non-empty 1-D array (one per returned item); got shape {shape}", shape=str(s.shape)
        )
    if np.isnan(s).any():
        raise ParamError("scores must not be NaN")
    return int(np.argmax(s))  # argmax keeps the first maximum
