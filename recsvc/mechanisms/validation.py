"""Checks of mechanism inputs (sklearn-style ``check_*`` helpers); parameters are checked by
their specs (``params.py``).

Everything here runs BEFORE any randomness is drawn, so bad input never selects anything and
never moves a caller's generator. Every error is a ``ValueError`` (``MechanismInputError``)
whose message says what is wrong and what was expected.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import ClassVar

import numba
import numpy as np

from recsvc import checks
from recsvc.checks import ParamError
from recsvc.rng import thread_csprng


class MechanismInputError(ValueError):
    """Bad input to a selection mechanism (a ``ValueError``: the CLI prints it as one line)."""

    status: ClassVar[str] = "INVALID_ARGUMENT"  # the grpc.StatusCode member's name, for the service


class MechanismParamError(MechanismInputError, ParamError):
    """A mechanism parameter's value is out of its spec's range; the message names the
    parameter (``beta``), which the command line shows as its flag (``--beta``)."""


def check_epsilon(epsilon: object) -> float:
    """The one ε check (:func:`recsvc.checks.check_epsilon`), refusing as a mechanism does."""
    return checks.check_epsilon(epsilon, error=MechanismInputError)


def check_at_least(name: str, value: object, least: int, expected: str) -> int:
    """``value`` as an int ≥ ``least`` (``trials``, ``seed``, ``user_offset``); ``expected`` words the bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < least:
        raise MechanismInputError(f"{name} must be {expected}, got {value!r}")
    return int(value)


# The score range in noise scales, (max q − min q)·ε/(2Δmax), beyond which ε is refused: the
# samplers and exact laws add and subtract a few such gaps, which stay finite below ~1.8e308.
MAX_SCALED_RANGE = 1e306


def _as_float_array(name: str, values: object) -> np.ndarray:
    """``values`` as float64, refusing what is not real numbers, as the service does: strings
    (numeric or not), complex numbers (numpy would drop the imaginary part) and other objects."""
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise MechanismInputError(f"{name} must be an array of real numbers: {exc}") from None
    if raw.dtype.kind not in "biuf":
        raise MechanismInputError(
            f"{name} must be an array of real numbers (int or float); got {raw.dtype} values, "
            f"e.g. {raw.ravel()[:1].tolist()!r}"
        )
    return raw.astype(np.float64, copy=False)


def check_scale(epsilon: float, q: np.ndarray, d: np.ndarray) -> None:
    """Refuses scores whose range max q − min q is not a finite float (every mechanism subtracts
    the top score), then an ε whose noise scale is not a finite float for these scores: ε/(2Δmax)
    must be finite, and the score range measured in it at most :data:`MAX_SCALED_RANGE` (without
    this, ε/(2Δ) overflowed to inf, 0·inf made the probabilities NaN and the worst item was selected)."""
    if q.size == 0:
        return
    _check_scale(epsilon, float(q.max()), float(q.min()), float(d.max()))


def _check_scale(epsilon: float, top: float, bottom: float, dmax: float) -> None:
    """:func:`check_scale` on the scores' max and min and Δ's max."""
    inv_scale = epsilon / (2.0 * dmax)
    spread = top - bottom  # Python floats: an overflow is inf, without numpy's warning
    if not math.isfinite(spread):
        raise MechanismInputError(
            f"the score range max q − min q = {top!r} − ({bottom!r}) overflows a float64; expected scores "
            f"whose range is at most {np.finfo(np.float64).max:.6g} (clip them to their items' [lo, hi])"
        )
    if math.isfinite(inv_scale) and spread * inv_scale <= MAX_SCALED_RANGE:
        return
    most = MAX_SCALED_RANGE * 2.0 * dmax / spread if spread > 0 else 2.0 * dmax * np.finfo(np.float64).max
    raise MechanismParamError(
        "{epsilon}={got} is too large for these inputs: the score range in units of the noise scale, "
        "(max q − min q)·ε/(2·max Δ), must be a finite float64 up to {cap:g}; expected {epsilon} ≤ {most:.6g}",
        got=repr(epsilon),
        cap=MAX_SCALED_RANGE,
        most=most,
    )


def check_inputs(epsilon: object, scores: object, sensitivities: object) -> tuple[float, np.ndarray, np.ndarray]:
    """ε, one user's scores q (n,) and sensitivities Δ (n,), each checked, and ε against them."""
    eps = check_epsilon(epsilon)
    q, d = _one_user(scores, sensitivities)
    _check_summary(eps, q, d, _summary(q, d))
    return eps, q, d


def check_rows(
    epsilons: Sequence[float], scores: np.ndarray, sensitivities: np.ndarray, lengths: np.ndarray
) -> list[tuple[float, np.ndarray, np.ndarray] | MechanismInputError]:
    """:func:`check_inputs` on each row of a ragged batch (float64 ``scores`` and ``sensitivities``
    (N,), the rows' sizes ``lengths`` (B,) summing to N), with the numbers of all rows' checks in ONE
    compiled pass: row b's entry is what ``check_inputs(epsilons[b], q_b, Δ_b)`` returns, or the
    error it raises (the same message)."""
    q, d = _one_user(scores, sensitivities)
    n = np.ascontiguousarray(lengths, np.int64)
    if n.shape == (1,) and int(n[0]) == q.shape[0]:  # one row (a lone request): check_inputs' own pass
        try:
            eps = check_epsilon(epsilons[0])
            _check_summary(eps, q, d, _summary(q, d))
        except MechanismInputError as exc:
            return [exc]
        return [(eps, q, d)]
    if n.ndim != 1 or (n < 0).any() or int(n.sum()) != q.shape[0]:
        raise MechanismInputError(f"lengths must be 1-D row sizes >= 0 summing to the {q.shape[0]} scores")
    ends = np.cumsum(n)
    summaries = _summary_rows(q, d, ends - n, n).tolist()
    out: list[tuple[float, np.ndarray, np.ndarray] | MechanismInputError] = []
    for e, end, size, summary in zip(epsilons, ends.tolist(), n.tolist(), summaries, strict=True):
        qb, db = q[end - size : end], d[end - size : end]
        try:
            eps = check_epsilon(e)
            if size == 0:
                _one_user(qb, db)  # its message for n = 0
            _check_summary(eps, qb, db, summary)
        except MechanismInputError as exc:
            out.append(exc)
            continue
        out.append((eps, qb, db))
    return out


def _check_summary(eps: float, q: np.ndarray, d: np.ndarray, summary: Sequence[float]) -> None:
    """The checks of ε, q and Δ (n ≥ 1) from their :func:`_summary`."""
    q_sum, d_sum, d_min, d_max, q_max, q_min = summary
    if not (math.isfinite(q_sum) and math.isfinite(d_sum) and d_min > 0.0):
        _check_finite("scores", q)  # raises with the first bad entry, as check_scores_sensitivities
        _check_sensitivities(d)
    _check_scale(eps, q_max, q_min, d_max)


@numba.njit(cache=True, nogil=True)
def _summary_rows(
    q: np.ndarray, d: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """:func:`_summary` of each non-empty row, (B, 6); an empty row's entries are 0."""
    out = np.zeros((starts.shape[0], 6))
    for b in range(starts.shape[0]):
        if lengths[b] > 0:
            s = starts[b]
            out[b, 0], out[b, 1], out[b, 2], out[b, 3], out[b, 4], out[b, 5] = _summary(
                q[s : s + lengths[b]], d[s : s + lengths[b]]
            )
    return out


@numba.njit(cache=True, nogil=True)
def _summary(
    q: np.ndarray, d: np.ndarray
) -> tuple[float, float, float, float, float, float]:  # pragma: no cover - numba
    """(Σq, ΣΔ, min Δ, max Δ, max q, min q) in one pass, for n ≥ 1: the checks' numbers, where six
    numpy reductions cost more than the draw at small n. A finite sum proves every entry finite
    (NaN and inf poison it in any order); the max and min are exact, so they equal numpy's."""
    q_sum, d_sum = 0.0, 0.0
    d_min, d_max, q_max, q_min = d[0], d[0], q[0], q[0]
    for i in range(q.shape[0]):
        qi, di = q[i], d[i]
        q_sum += qi
        d_sum += di
        d_min = min(d_min, di)
        d_max = max(d_max, di)
        q_max = max(q_max, qi)
        q_min = min(q_min, qi)
    return q_sum, d_sum, d_min, d_max, q_max, q_min


def _check_finite(name: str, arr: np.ndarray) -> None:
    # Fast path: a finite sum proves every entry finite (NaN/inf always poison the sum).
    if math.isfinite(float(arr.sum())):
        return
    if not np.isfinite(arr).all():
        bad = np.flatnonzero(~np.isfinite(arr.ravel()))
        raise MechanismInputError(
            f"{name} must be finite; found {bad.size} NaN/inf value(s) (first at flat index {bad[0]})"
        )


def check_scores_sensitivities(scores: object, sensitivities: object) -> tuple[np.ndarray, np.ndarray]:
    """One user's clipped scores q (n,) and sensitivities Δ (n,): finite, Δ > 0, n ≥ 1."""
    q, d = _one_user(scores, sensitivities)
    _check_finite("scores", q)
    _check_sensitivities(d)
    return q, d


def _one_user(scores: object, sensitivities: object) -> tuple[np.ndarray, np.ndarray]:
    """Scores (n,) and Δ (n,) as float64 arrays of one shape, n ≥ 1 (their values unchecked)."""
    q = _as_float_array("scores", scores)
    d = _as_float_array("sensitivities", sensitivities)
    if q.ndim != 1:
        raise MechanismInputError(f"scores must be 1-D with shape (n,), got shape {q.shape}")
    if q.shape[0] == 0:
        raise MechanismInputError("scores is empty (n = 0); expected at least one candidate")
    if d.shape != q.shape:
        raise MechanismInputError(
            f"sensitivities must have the same length as scores: got shape {d.shape}, expected {q.shape}"
        )
    return q, d


def check_batch(scores: object, sensitivities: object) -> tuple[np.ndarray, np.ndarray]:
    """Scores (B, n) and sensitivities (B, n) or shared (n,); returns Δ broadcast to (B, n)."""
    q = _as_float_array("scores", scores)
    d = _as_float_array("sensitivities", sensitivities)
    if q.ndim != 2:
        raise MechanismInputError(f"batch scores must be 2-D with shape (B, n), got shape {q.shape}")
    if q.shape[1] == 0:
        raise MechanismInputError("scores have no candidates (n = 0); expected at least one")
    if d.shape not in (q.shape, q.shape[1:]):
        raise MechanismInputError(f"sensitivities must have shape {q.shape} or {q.shape[1:]} (shared), got {d.shape}")
    _check_finite("scores", q)
    _check_sensitivities(d)
    return q, np.broadcast_to(d, q.shape)


def _check_sensitivities(d: np.ndarray) -> None:
    _check_finite("sensitivities", d)
    if d.size and d.min() <= 0:
        bad = np.flatnonzero(d.ravel() <= 0)
        raise MechanismInputError(
            f"sensitivities must be > 0 (Δ = max(hi − lo, 1e-6), docs/reference/specification.md §1); "
            f"found {bad.size} value(s) <= 0 "
            f"(first {d.ravel()[bad[0]]!r} at flat index {bad[0]})"
        )


def check_rng(rng: object) -> np.random.Generator:
    """The caller's generator, or this thread's CSPRNG for ``None``."""
    if rng is None:
        return thread_csprng()
    if not isinstance(rng, np.random.Generator):
        raise MechanismInputError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    return rng
