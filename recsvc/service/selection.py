"""Private selection for the service, without the wire format: prepare → execute.

:meth:`Selector.prepare_select` / :meth:`Selector.prepare_recommend` check everything and clip
the scores, touching no ledger. :meth:`Selector.execute` then follows the ledger's protocol
(:meth:`recsvc.service.ledger.Ledger.draw_and_charge`): ε → exact units | replay, conflict and
budget pre-check → sample, drawn OUTSIDE the write transaction → inside it: replay | conflict |
budget check → store the answer and spend → durable COMMIT.

Order matters for privacy: a retry or a refused request never draws (the pre-check), the sample
is drawn with the CSPRNG of the request's own thread, and it is revealed only after the spend
and the stored answer are durably committed. A sample drawn for a request that the transaction
then finds to be a replay, a conflict or over budget is discarded unreleased: it costs no privacy.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from recsvc.artifact import Artifact, Manifest
from recsvc.checks import ParamError
from recsvc.mechanisms import MECHANISMS, check_params, select
from recsvc.model import top_k
from recsvc.rng import thread_csprng
from recsvc.service.config import AUTO, Policy
from recsvc.service.draws import HeavyDraws, expected_draws
from recsvc.service.ledger import Charge, Ledger
from recsvc.service.ledger_units import charge_units, to_epsilon

DEFAULT_RECOMMEND_K = 500
MAX_ID_LEN = 256


class InvalidRequest(ValueError):
    """Bad input: INVALID_ARGUMENT, nothing spent. Messages never contain score values."""


class Unavailable(Exception):
    """The request is well-formed but this server cannot serve it (FAILED_PRECONDITION)."""


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
    item_ids: Sequence[str] = field(repr=False)  # a list, or the request's repeated field itself (no copy)


@dataclass(frozen=True)
class Selected:
    """What a response carries once the ledger has charged the request."""

    item_id: str
    mechanism: str
    epsilon: float
    budget_remaining: float
    request_id: str


def resolve_auto(rho_median: float | None, threshold: float) -> str | None:
    """SPEC §2 `auto`: mgem if ρ̄ > t, gem if ρ̄ < −t, else rnm (public data only: costs nothing)."""
    if rho_median is None or not math.isfinite(rho_median):
        return None
    if rho_median > threshold:
        return "mgem"
    if rho_median < -threshold:
        return "gem"
    return "rnm"


def population_median(manifest: Manifest) -> float | None:
    stats = manifest.population_spearman
    return None if stats is None else float(stats.median)


def short(s: str, limit: int = 64) -> str:
    """An id for an error message, cut to ``limit`` characters."""
    return repr(s if len(s) <= limit else s[:limit] + "…")


class Catalog:
    """Public per-item data from the artifact, as arrays indexed by items.parquet row."""

    def __init__(self, artifact: Artifact) -> None:
        self.index: dict[str, int] = artifact.item_index
        self.item_ids: list[str] = artifact.items["item_id"].to_list()
        self.lo = artifact.items["lo"].to_numpy().astype(np.float64)
        self.hi = artifact.items["hi"].to_numpy().astype(np.float64)
        self.sensitivity = artifact.items["sensitivity"].to_numpy().astype(np.float64)

    def rows(self, item_ids: Sequence[str]) -> np.ndarray:
        # One pass over the ids, straight from the protobuf field: no intermediate list.
        try:
            return np.fromiter(map(self.index.__getitem__, item_ids), np.int64, len(item_ids))
        except KeyError as exc:
            pos = list(item_ids).index(exc.args[0])
            raise InvalidRequest(
                f"unknown item_id {short(exc.args[0])} (candidate #{pos}); expected an item_id from the "
                f"artifact's items.parquet ({len(self.item_ids)} items)"
            ) from None

    def clip(self, rows: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Clipping to the public [lo, hi] is what makes Δ a true bound (SPEC §1): never skip it.
        return np.clip(raw, self.lo[rows], self.hi[rows]), self.sensitivity[rows]


class Recommender:
    """Server-side SANSA: history → dense scores → top-k unseen items that have clip ranges,
    ranked by :func:`recsvc.model.top_k` (ties → lower model column), as the pipeline ranks."""

    def __init__(self, artifact: Artifact, catalog: Catalog) -> None:
        self.model = artifact.model
        self.index = self.model.index
        # Model column → items.parquet row (−1: the item has no public clip range; never a candidate).
        self.row_of_col = np.array([catalog.index.get(i, -1) for i in self.model.item_ids.tolist()], np.int64)

    def candidates(self, history: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(items.parquet rows, raw scores) of the top-k unseen items, best first."""
        cols = []
        for pos, item in enumerate(history):
            col = self.index.get(item)
            if col is None:
                raise InvalidRequest(
                    f"unknown item_id {short(item)} in history (position {pos}); expected item ids "
                    f"known to the model ({len(self.index)} items)"
                )
            cols.append(col)
        m = len(self.row_of_col)
        seen = np.unique(np.asarray(cols, np.int64))
        x = sp.csr_matrix((np.ones(seen.size), (np.zeros(seen.size, np.int64), seen)), shape=(1, m))
        scores = self.model.score_unseen(x)  # recommend unseen items only
        scores[:, self.row_of_col < 0] = -np.inf
        top = top_k(scores, k)
        count = int(top.count[0])
        if count == 0:
            raise InvalidRequest("no unseen items are left to recommend for this history")
        cols_ranked = top.index[0, :count]  # padding (fewer than k eligible items) sits at the end
        return self.row_of_col[cols_ranked], top.score[0, :count]


def check_id(name: str, value: str, required: bool) -> None:
    if required and not value:
        raise InvalidRequest(f"{name} is empty; expected a non-empty string")
    if len(value) > MAX_ID_LEN:
        raise InvalidRequest(f"{name} is {len(value)} characters long; expected at most {MAX_ID_LEN}")


class Selector:
    """The service's selection logic over one artifact, under one :class:`Policy`."""

    def __init__(self, artifact: Artifact, policy: Policy) -> None:
        self.policy = policy
        self.catalog = Catalog(artifact)
        self.rho_median = population_median(artifact.manifest)
        self.auto_choice = resolve_auto(self.rho_median, policy.auto_threshold)
        default = policy.default_mechanism or AUTO
        if default == AUTO and self.auto_choice is None:
            raise ParamError("{manifest} has no population_spearman.median, which `auto` needs; "
                             "rebuild the artifact or set {default_mechanism} to a mechanism name",
                             manifest=f"{artifact.path}/manifest.json")
        if default != AUTO:
            self.mechanism_name(default)  # fail at startup, not per request
        self.default_mechanism = default
        self.recommender: Recommender | None = None
        if artifact.has_model:
            self.recommender = Recommender(artifact, self.catalog)
        self._local = threading.local()
        self.heavy = HeavyDraws(policy.heavy_draws, policy.heavy_draw_threads)

    def mechanism_name(self, requested: str) -> str:
        """The mechanism a request runs: ``auto`` and empty resolved, non-private ones gated."""
        name = requested or self.default_mechanism
        if name == AUTO:
            if self.auto_choice is None:
                raise InvalidRequest("mechanism 'auto' is unavailable: the artifact has no population Spearman")
            return self.auto_choice
        mech = MECHANISMS.get(name)
        if mech is None:
            raise InvalidRequest(
                f"unknown mechanism {short(name)}; expected one of {', '.join(sorted(MECHANISMS))}, or 'auto'"
            )
        if not mech.private and not self.policy.allow_non_private:
            raise InvalidRequest(
                f"mechanism {name!r} is not differentially private and this server refuses it; "
                "start the server with --allow-non-private to use it for reference experiments"
            )
        return name

    def _common(self, user_id: str, request_id: str, mechanism: str, epsilon: float,
                params: Mapping[str, float | None]) -> tuple[str, float]:
        check_id("user_id", user_id, required=True)
        check_id("request_id", request_id, required=False)
        name = self.mechanism_name(mechanism)
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise InvalidRequest(f"epsilon must be a positive finite number, got {epsilon!r}")
        check_params(dict(params))  # the mechanisms' own checks, before the ledger is touched
        return name, epsilon

    def _has_duplicates(self, rows: np.ndarray) -> bool:
        """O(n) check without sorting (np.sort releases the GIL, another needless hand-off):
        write each candidate's position at its row; a row given twice keeps only the later one."""
        slot = getattr(self._local, "slot", None)
        if slot is None:  # per thread; never needs clearing, every read slot was just written
            slot = self._local.slot = np.empty(len(self.catalog.item_ids), np.int64)
        pos = np.arange(rows.size)
        slot[rows] = pos
        return bool((slot[rows] != pos).any())

    def prepare_select(self, user_id: str, request_id: str, mechanism: str, epsilon: float,
                       params: Mapping[str, float | None], item_ids: Sequence[str], raw: np.ndarray,
                       fingerprint: Callable[[], bytes]) -> Prepared:
        """Checks a Select request and clips its scores; ``fingerprint`` runs only if it is valid."""
        name, eps = self._common(user_id, request_id, mechanism, epsilon, params)
        n = len(item_ids)
        if n == 0:
            raise InvalidRequest("no candidates (n = 0); expected at least one (item_id, score)")
        if n > self.policy.max_candidates:
            raise InvalidRequest(f"{n} candidates is too many; this server accepts at most {self.policy.max_candidates}")
        finite = np.isfinite(raw)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise InvalidRequest(
                f"{int((~finite).sum())} candidate score(s) are NaN or infinite (first: candidate #{bad}); "
                "expected finite scores"
            )
        rows = self.catalog.rows(item_ids)
        if self._has_duplicates(rows):  # the same item twice (ids map 1:1 to rows)
            seen: set[str] = set()
            dup = next(i for i in item_ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise InvalidRequest(f"duplicate item_id {short(dup)} among the candidates; expected each item once")
        q, sens = self.catalog.clip(rows, raw)
        return Prepared(user_id, request_id or uuid.uuid4().hex, fingerprint(), name, eps, params, q, sens, item_ids)

    def prepare_recommend(self, user_id: str, request_id: str, mechanism: str, epsilon: float,
                          params: Mapping[str, float | None], history: Sequence[str], num_candidates: int,
                          fingerprint: Callable[[], bytes]) -> Prepared:
        """Scores the history server-side and takes its top candidates (see :class:`Recommender`)."""
        name, eps = self._common(user_id, request_id, mechanism, epsilon, params)
        if self.recommender is None:
            raise Unavailable("this server's artifact has no SANSA model, so Recommend is unavailable; use Select")
        k = num_candidates or min(DEFAULT_RECOMMEND_K, self.policy.max_candidates)
        if k > self.policy.max_candidates:
            raise InvalidRequest(f"num_candidates={k} is too many; this server accepts at most {self.policy.max_candidates}")
        rows, raw = self.recommender.candidates(history, k)
        q, sens = self.catalog.clip(rows, raw)
        ids = [self.catalog.item_ids[r] for r in rows.tolist()]
        return Prepared(user_id, request_id or uuid.uuid4().hex, fingerprint(), name, eps, params, q, sens, ids)

    def execute(self, ledger: Ledger, p: Prepared, encode: Callable[[Selected], bytes]) -> Charge:
        """Draws ``p``'s sample outside the ledger's lock, then charges it and stores
        ``encode(selected)`` in one transaction (see the module docstring). A replayed request
        gets its stored answer and draws nothing; an ε the ledger cannot count exactly
        (below 1e-12) is refused before the ledger is touched."""
        charged = to_epsilon(charge_units(p.epsilon))  # what the ledger spends (rounded up to its unit)

        def sample() -> int:  # no lock held; the drawing thread's own CSPRNG
            return int(select(p.mechanism, p.scores, p.sensitivities, p.epsilon, rng=thread_csprng(),
                              allow_non_private=self.policy.allow_non_private, **p.params))

        def draw() -> int:  # a heavy draw (random stopping at a tiny γ) yields the CPU to other requests
            return self.heavy.run(sample, expected_draws(p.mechanism, p.scores.size, p.params))

        def build(index: int, remaining: float) -> bytes:  # inside the transaction: encoding only
            return encode(Selected(p.item_ids[index], p.mechanism, charged, remaining, p.request_id))

        return ledger.draw_and_charge(p.user_id, p.request_id, p.fingerprint, p.epsilon, draw, build)
