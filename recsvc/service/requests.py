"""A request as the selection layer sees it: its decoded input (:class:`SelectInput`, the
candidates' :class:`Columns`), its validated form ready to draw (:class:`Prepared`, and
:func:`draw`, the only random step), and what its answer carries (:class:`Selected`).
The user's scores never appear in a repr, so no log line or traceback can print them."""

from __future__ import annotations

import functools
import math
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from recsvc.ledger import StoredAnswer
from recsvc.mechanisms import (
    MECHANISMS,
    ValidSlate,
    ValidTwoStage,
    charged_epsilon,
    draw_slate,
    draw_two_stage,
    valid_slate,
    valid_slates,
    valid_two_stage,
)
from recsvc.mechanisms.slate import is_one_shot, slate_work
from recsvc.service.errors import InvalidRequest

MAX_ID_LEN = 256


@dataclass(frozen=True)
class CandidateStage:
    """Recommend's private top-m: ``candidate_fraction`` of ε picks m items of the catalog with
    one run of the one-shot top-k ``mechanism`` (public: the request's or the server's default)."""

    m: int
    candidate_fraction: float
    mechanism: str


@dataclass(frozen=True)
class Prepared:
    """A fully validated request, ready to sample: nothing here has touched the ledger."""

    user_id: str
    request_id: str
    fingerprint: bytes  # SHA-256 of the canonical request; the ledger stores only HMAC(key, it)
    mechanism: str  # resolved (never "auto" or empty)
    epsilon: float
    params: Mapping[str, float | None]
    # The user's data stays out of repr(), so no log line or traceback can print it.
    scores: np.ndarray = field(repr=False)  # clipped to each item's [lo, hi]
    sensitivities: np.ndarray = field(repr=False)
    item_ids: Sequence[str] = field(repr=False)  # the candidates' ids (a list, a protobuf field, RowIds)
    k: int = 1  # slate size, 1 <= k <= the candidates (n, or the stage's m)
    stage: CandidateStage | None = None  # Recommend's two-stage path; None: select among all
    rows: np.ndarray | None = field(default=None, repr=False)  # the candidates' catalog rows; None: all rows
    # The mechanisms' checks of the fields above, passed once (:func:`validated`): what draw() draws from.
    valid: ValidSlate | ValidTwoStage = field(kw_only=True, repr=False)

    @functools.cached_property  # read by the heavy-work decision and by the draw; computed once
    def work(self) -> float:
        """Random draws :func:`draw` is expected to make, every stage counted: a one-shot
        mechanism runs once, a peeled slate k times (a native peel: its own estimate, O(n), from
        the scores); a two-stage Recommend first draws its private top-m (one run of its one-shot
        mechanism over the whole catalog)."""
        v = self.valid
        if isinstance(v, ValidSlate):
            native = slate_work(v)
            return _slate_work(self.mechanism, self.scores.size, self.k, self.params) if native is None else native
        return _slate_work(v.candidates.mechanism, self.scores.size, v.candidates.k, {}) + _slate_work(
            self.mechanism, v.candidates.k, self.k, self.params
        )

    @functools.cached_property  # read by the ledger item and by the answer; computed once
    def charge(self) -> float:
        """The ε the ledger charges: the selection's composed privacy map
        (:func:`recsvc.mechanisms.charged_epsilon`). Only a non-private mechanism, served under
        --allow-non-private for reference runs, has no finite one: it is charged its nominal ε."""
        s = self.stage  # without a stage, charged_epsilon ignores the candidate mechanism
        m, f, cand = (None, None, "") if s is None else (s.m, s.candidate_fraction, s.mechanism)
        c = charged_epsilon(
            self.mechanism, self.epsilon, self.k, m=m, candidate_fraction=f, candidate_mechanism=cand, **self.params
        )
        return c if math.isfinite(c) else self.epsilon

    def answer(self, picked: np.ndarray) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The slate's (item ids, catalog rows) from the drawn candidate indices."""
        at = picked.tolist()
        rows = at if self.rows is None else self.rows[picked].tolist()
        return tuple(self.item_ids[i] for i in at), tuple(rows)


@dataclass(frozen=True)
class Selected:
    """What a response carries once the ledger has charged the request: its stored answer, and
    whether this call replays it (an earlier identical request's answer: nothing spent now)."""

    answer: StoredAnswer
    request_id: str
    replayed: bool


@dataclass(frozen=True)
class SelectInput:
    """One Select request without the wire format; its candidates are in the :class:`Columns`."""

    user_id: str
    request_id: str
    mechanism: str
    epsilon: float
    params: Mapping[str, float | None]
    fingerprint: Callable[[], bytes]  # runs only for a valid request
    k: int = 0
    item_ids: Sequence[str] | None = None  # the id encoding; None: the compact one (rows in Columns.rows)
    catalog_version: str = ""


@dataclass(frozen=True)
class Columns:
    """The candidates of several Select requests, decoded at once: concatenated in input order."""

    raw: np.ndarray = field(repr=False)  # float64, every input's raw scores
    lengths: np.ndarray  # int64, candidates per input
    rows: np.ndarray = field(repr=False)  # int64, the rows of the row-encoded inputs only

    @staticmethod
    def of(raw: Sequence[np.ndarray], rows: Sequence[np.ndarray]) -> Columns:
        lengths = np.fromiter(map(len, raw), np.int64, len(raw))

        def cat(a, t):
            return np.concatenate(a).astype(t, copy=False) if a else np.empty(0, t)

        return Columns(cat(raw, np.float64), lengths, cat(rows, np.int64))


def validated(
    mechanism: str,
    epsilon: float,
    params: Mapping[str, float | None],
    scores: np.ndarray,
    sensitivities: np.ndarray,
    k: int,
    stage: CandidateStage | None,
    allow_non_private: bool,
) -> ValidSlate | ValidTwoStage:
    """The mechanisms' own checks of a request (:func:`recsvc.mechanisms.valid_slate`, or
    :func:`~recsvc.mechanisms.valid_two_stage` with a candidate stage), run once, by ``prepare_*``:
    a refusal here (e.g. an ε too large for these scores) comes before the ledger is touched."""
    if stage is None:
        return valid_slate(mechanism, scores, sensitivities, epsilon, k, allow_non_private=allow_non_private, **params)
    return valid_two_stage(
        mechanism,
        scores,
        sensitivities,
        epsilon,
        stage.m,
        stage.candidate_fraction,
        k,
        stage.mechanism,
        allow_non_private=allow_non_private,
        **params,
    )


def validated_rows(
    mechanism: str,
    k: int,
    params: Mapping[str, float | None],
    scores: Sequence[np.ndarray],
    sensitivities: Sequence[np.ndarray],
    epsilons: Sequence[float],
    allow_non_private: bool,
) -> list[ValidSlate | Exception]:
    """:func:`validated` for requests that run one mechanism with one k and parameters, each its
    checks' outcome: :func:`recsvc.mechanisms.valid_slates` on all their rows at once. A bad
    mechanism or parameter refuses every request."""
    lengths = np.fromiter(map(len, scores), np.int64, len(scores))
    try:
        return list(
            valid_slates(
                mechanism,
                _joined(scores),
                _joined(sensitivities),
                lengths,
                epsilons,
                k,
                allow_non_private=allow_non_private,
                **params,
            )
        )
    except Exception as exc:
        return [exc] * len(scores)


def _joined(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The parts end to end; a lone request's one part as it is (np.concatenate would copy it)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def draw(p: Prepared, rng: np.random.Generator) -> np.ndarray:
    """The slate's candidate indices (k of them, in selection order); the only random step. It
    draws from ``p.valid`` and checks nothing again (``prepare_*`` made it)."""
    return draw_valid(p.valid, rng)


def draw_valid(v: ValidSlate | ValidTwoStage, rng: np.random.Generator) -> np.ndarray:
    return draw_two_stage(v, rng) if isinstance(v, ValidTwoStage) else draw_slate(v, rng)


def parameter_driven(mechanism: str) -> bool:
    """Whether a request parameter sets how many draws a selection makes (random stopping's γ)."""
    return "gamma" in MECHANISMS[mechanism].params


def expected_draws(mechanism: str, n: int, params: Mapping[str, float | None]) -> float:
    """Random draws one selection among ``n`` is expected to need: one per candidate, or ≈ 1/γ for
    random stopping (the mean of rs's geometric K; rs_improved's logarithmic K has a smaller mean)."""
    if not parameter_driven(mechanism):
        return float(n)
    spec = MECHANISMS[mechanism].params["gamma"]
    gamma = params.get("gamma")
    return max(float(n), 1.0 / (spec.default if gamma is None else gamma))


def _slate_work(mechanism: str, n: int, k: int, params: Mapping[str, float | None]) -> float:
    return (1 if is_one_shot(mechanism) else k) * expected_draws(mechanism, n, params)


def check_user_id(value: str) -> None:
    """A user_id names one budget, matched exactly: refused unless it is in Unicode NFC, so the NFC
    and NFD spellings of one name can never be two users with two budgets. Refused, not normalised:
    a ledger may already hold a non-NFC id, whose spend a normalised request would not see."""
    check_id("user_id", value, required=True)
    if not unicodedata.is_normalized("NFC", value):
        raise InvalidRequest(
            "user_id is not in Unicode normalization form NFC; expected its NFC form "
            "(Python: unicodedata.normalize('NFC', user_id))"
        )


def check_min_epsilon(epsilon: float, least: float) -> None:
    """The server's floor on a request's ε (``--min-epsilon``; 0: none): every answer the ledger
    stores then costs at least ``least``, so a user stores at most budget / least answers per budget
    window however small an ε it asks for (SECURITY.md, F4)."""
    if epsilon < least:
        raise InvalidRequest(
            f"epsilon={epsilon!r} is below this server's least epsilon per request, {least:g} (--min-epsilon, "
            f"which bounds the answers one user can store); expected epsilon >= {least:g}"
        )


def check_id(name: str, value: str, required: bool) -> None:
    if required and not value:
        raise InvalidRequest(f"{name} is empty; expected a non-empty string")
    if len(value) > MAX_ID_LEN:
        raise InvalidRequest(f"{name} is {len(value)} characters long; expected at most {MAX_ID_LEN}")
    if "\x00" in value:  # PostgreSQL's text cannot hold it: the ledger statement of a whole round would fail
        raise InvalidRequest(
            f"{name} contains a NUL character (U+0000) at position {value.index(chr(0))}; expected text without NUL"
        )
