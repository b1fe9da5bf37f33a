"""The device's signal on a lattice: exactly ε-local-DP integers (docs/concepts/privacy-proofs.md,
"Multi-selection's lattice signal"; the bit recipe is docs/reference/client-bundle.md).

The clipped embedding ê (‖ê‖₁ ≤ R) is divided by the public grid step g = R/GRID_STEPS and
rounded to the nearest integer (ties to even), then pulled into the integer L1 ball of radius
K = GRID_STEPS + ⌊d/2⌋ by integer steps. Rounding moves each coordinate by at most ½, so
‖ê/g‖₁ ≤ GRID_STEPS gives ‖a‖₁ ≤ K in exact arithmetic; the integer pull makes the bound hold
whatever the float rounding did, so any two lattice points are within L1 distance Δ = 2K.
Discrete Laplace noise with P(x) ∝ exp(−|x|·ε/Δ) per coordinate (:mod:`.discrete`) then bounds
the signal's probability ratio between ANY two histories by e^ε exactly, reached by the antipodal
pair ±K·e₁. Everything after the rounding is integer arithmetic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError, check_epsilon
from recsvc.multiselection.discrete import Words, discrete_laplace_vector, rate
from recsvc.multiselection.embedding import Floats, check_radius

Ints = npt.NDArray[np.int64]

#: grid steps per clip radius R: g = R/4096 (a power of two, so ê/g = ê·4096 exactly); the rounding
#: adds d/2 steps to the L1 radius, under 0.4 % of R at d = 32
GRID_STEPS = 4096
#: the largest |signal coordinate| the wire and a JavaScript number hold exactly (2⁵³ − 1); the
#: device clamps to it (post-processing: the guarantee is unchanged), the server refuses beyond it
SIGNAL_LIMIT = (1 << 53) - 1


@dataclass(frozen=True)
class Lattice:
    """The public grid of a client bundle: the step g (in embedding units) and the integer L1
    radius K of the lattice points; Δ = 2K bounds the L1 distance of any two of them."""

    step: float
    radius: int

    @classmethod
    def of(cls, radius: float, dim: int) -> Lattice:
        """The grid of an embedding with clip radius R and dimension d."""
        if dim < 1:
            raise ParamError("the embedding dimension must be at least 1; got {value}", value=dim)
        return cls(check_radius(radius) / GRID_STEPS, GRID_STEPS + dim // 2)

    @property
    def sensitivity(self) -> int:
        """Δ = 2K, the L1 diameter of the integer ball."""
        return 2 * self.radius

    def point(self, clipped: npt.ArrayLike) -> Ints:
        """The lattice point of a clipped embedding (row-wise on a 2-D array): round(ê/g), ties to
        even, then pulled into ‖a‖₁ ≤ K (:func:`pull_in`)."""
        x = np.asarray(clipped, dtype=np.float64)
        if not np.isfinite(x).all():
            raise ParamError("the clipped embedding must be finite")
        a = np.rint(x / self.step).astype(np.int64)  # rint rounds half to even, like the spec
        if a.ndim == 1:
            return pull_in(a, self.radius)
        return np.stack([pull_in(row, self.radius) for row in a]) if a.size else a

    def signal(self, clipped: npt.ArrayLike, epsilon: float, words: Words) -> Ints:
        """The device's lattice signal: point(ê) + discrete Laplace with P(x) ∝ exp(−|x|·ε/Δ) per
        coordinate, coordinate 0 first, clamped to ±SIGNAL_LIMIT."""
        a = self.point(clipped)
        if a.ndim != 1:
            raise ParamError("the clipped embedding must be one vector; got shape {shape}", shape=str(a.shape))
        s, t = rate(check_epsilon(epsilon, error=ParamError), self.sensitivity)
        noise = discrete_laplace_vector(s, t, a.shape[0], words)
        z = [max(-SIGNAL_LIMIT, min(SIGNAL_LIMIT, v + x)) for v, x in zip(a.tolist(), noise, strict=True)]
        return np.asarray(z, dtype=np.int64)


def pull_in(point: Ints, radius: int) -> Ints:
    """``point`` with ‖·‖₁ ≤ radius: while it is over, the coordinate of largest magnitude (the
    first on ties) moves one step toward 0. A rounded clipped embedding is over only by float
    rounding, so this runs a handful of steps at most."""
    a = [int(v) for v in np.asarray(point, dtype=np.int64).tolist()]
    excess = sum(abs(v) for v in a) - radius
    while excess > 0:
        j = max(range(len(a)), key=lambda i: (abs(a[i]), -i))
        a[j] -= 1 if a[j] > 0 else -1
        excess -= 1
    return np.asarray(a, dtype=np.int64)


def lattice_log_likelihood(signal: npt.ArrayLike, points: Ints, epsilon: float, lattice: Lattice) -> Floats:
    """log P(z | a_p) up to a constant for each lattice point a_p (row): −‖z − a_p‖₁·ε/Δ, the
    distance in exact integers (|z_j| ≤ SIGNAL_LIMIT and |a_pj| ≤ K keep it inside int64)."""
    z = np.asarray(signal, dtype=np.int64)
    if z.shape != (points.shape[1],):
        raise ParamError(f"signal has shape {z.shape}; expected ({points.shape[1]},)")
    dist = np.abs(points - z).sum(axis=1)
    return np.asarray(-dist.astype(np.float64) * (check_epsilon(epsilon, error=ParamError) / lattice.sensitivity))


def discrete_laplace_log_pmf(x: npt.ArrayLike, s: int, t: int) -> Floats:
    """log P(x) of the noise with P(x) ∝ exp(−|x|·s/t): P(x) = tanh(s/2t)·exp(−|x|·s/t)."""
    r = s / t
    return np.asarray(np.log(np.tanh(r / 2)) - np.abs(np.asarray(x, dtype=np.float64)) * r, dtype=np.float64)


def embedding_version(factors: npt.ArrayLike, radius: float) -> str:
    """The embedding's public version: sha256 (hex) of E's float64 little-endian bytes in C order,
    then R and the grid step g as float64 little-endian and the lattice radius K as int64
    little-endian. A signal is only meaningful for the (E, R, grid) it was made with, so the
    server refuses any other version; a bundle without the grid hashes to another version."""
    e = np.ascontiguousarray(np.asarray(factors, dtype="<f8"))
    if e.ndim != 2:
        raise ParamError("the embedding factors must be a matrix (n x d); got shape {shape}", shape=str(e.shape))
    grid = Lattice.of(radius, int(e.shape[1]))
    tail = (
        np.asarray([check_radius(radius), grid.step], dtype="<f8").tobytes()
        + np.asarray([grid.radius], "<i8").tobytes()
    )
    return hashlib.sha256(e.tobytes() + tail).hexdigest()
