"""Private selection for the service, without the wire format: prepare → execute.

:meth:`Selector.prepare_select` / :meth:`Selector.prepare_recommend` check everything and clip
the scores, touching no ledger. :meth:`Selector.execute` then follows the ledger's protocol
(:meth:`recsvc.service.ledger.Ledger.draw_and_charge`): ε → exact units | replay, conflict and
budget pre-check → sample, drawn OUTSIDE the write transaction → inside it: replay | conflict |
budget check → store the answer and spend → durable COMMIT.

What is protected (README § "What the guarantee covers"): the neighbouring relation is one
user's history. Select is ε-DP in the scores the client sends, given the client's candidate
set. Recommend scores the history itself and selects over the FULL catalog (no top-k, no
exclusion of seen items), so its answer is ε-DP in the history end to end; its optional private
candidate stage is charged inside the same ε (:func:`recsvc.mechanisms.select_two_stage`).

Order matters for privacy: a retry or a refused request never draws (the pre-check), the sample
is drawn with the CSPRNG of the request's own thread, and it is revealed only after the spend
and the stored answer are durably committed. A sample drawn for a request that the transaction
then finds to be a replay, a conflict or over budget is discarded unreleased: it costs no privacy.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from recsvc.artifact import POLICY, Artifact, Manifest
from recsvc.checks import ParamError
from recsvc.mechanisms import MECHANISMS, check_params, select_slate, select_two_stage
from recsvc.mechanisms.slate import step_epsilon
from recsvc.mechanisms.two_stage import split_budget
from recsvc.policy import PolicyTable
from recsvc.rng import thread_csprng
from recsvc.service.config import AUTO, Policy
from recsvc.service.draws import HeavyDraws, expected_draws
from recsvc.service.ledger_base import Charge, LedgerStore
from recsvc.service.ledger_units import charge_units, to_epsilon

log = logging.getLogger("recsvc.service")

MAX_ID_LEN = 256
CANDIDATE_MECHANISM = "rnm"  # Recommend's private top-m (peeling); public, the same for every request


class InvalidRequest(ValueError):
    """Bad input: INVALID_ARGUMENT, nothing spent. Messages never contain score values."""


class Unavailable(Exception):
    """The request is well-formed but this server cannot serve it (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class CandidateStage:
    """Recommend's private top-m: ``candidate_fraction`` of ε picks m items of the catalog."""

    m: int
    candidate_fraction: float


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
    k: int = 1  # slate size, 1 <= k <= the candidates (n, or the stage's m)
    stage: CandidateStage | None = None  # Recommend's two-stage path; None: select among all


@dataclass(frozen=True)
class Selected:
    """What a response carries once the ledger has charged the request."""

    item_ids: tuple[str, ...]  # the slate, in selection order
    mechanism: str
    epsilon: float
    budget_remaining: float
    request_id: str

    @property
    def item_id(self) -> str:
        return self.item_ids[0]


def draw(p: Prepared, rng: np.random.Generator, allow_non_private: bool) -> np.ndarray:
    """The slate's candidate indices (k of them, in selection order); the only random step.
    ``prepare_*`` already checked everything these calls check, so they fail only on what
    depends on the scores' values (e.g. GEM's overflow bound), and then before any draw."""
    if p.stage is None:
        return select_slate(p.mechanism, p.scores, p.sensitivities, p.epsilon, p.k, rng,
                            allow_non_private=allow_non_private, **p.params)
    return select_two_stage(p.mechanism, p.scores, p.sensitivities, p.epsilon, p.stage.m,
                            p.stage.candidate_fraction, p.k, rng, CANDIDATE_MECHANISM,
                            allow_non_private=allow_non_private, **p.params)


def resolve_auto(rho_median: float | None, threshold: float, table: PolicyTable | None = None,
                 epsilon: float | None = None, k: int = 1) -> str | None:
    """SPEC §2 `auto`, from public data only (it costs nothing and never sees a request's scores):
    with a policy table, the mechanism with the lowest expected MSE on the public population at
    the table's grid point of (ε, k) (:meth:`recsvc.policy.PolicyTable.resolve`); without one,
    the sign rule: mgem if ρ̄ > t, gem if ρ̄ < −t, else rnm."""
    if table is not None and epsilon is not None:
        return table.resolve(epsilon, k)
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
    """Server-side SANSA over the full catalog: history → raw scores of EVERY items.parquet row.

    Nothing is excluded: a seen item keeps its score (excluding it would make its probability 0
    depending on the history, outside the ε accounting); a client drops seen items from the
    answer itself, which is free post-processing. A catalog item the model has no column for
    scores 0, a constant that depends on no one's data.
    """

    def __init__(self, artifact: Artifact, catalog: Catalog) -> None:
        self.model = artifact.model
        self.index = self.model.index
        self.columns = len(self.model.item_ids)
        col = np.array([self.index.get(i, -1) for i in catalog.item_ids], np.int64)
        # items.parquet row → model column; None when they coincide (the pipeline's artifacts).
        self.col_of_row: np.ndarray | None = None if np.array_equal(col, np.arange(self.columns)) else col

    def scores(self, history: Sequence[str]) -> np.ndarray:
        """Raw SANSA scores of every catalog row (items.parquet order), seen items included."""
        cols = []
        for pos, item in enumerate(history):
            col = self.index.get(item)
            if col is None:
                raise InvalidRequest(
                    f"unknown item_id {short(item)} in history (position {pos}); expected item ids "
                    f"known to the model ({len(self.index)} items)"
                )
            cols.append(col)
        dense = self.model.score_one(np.unique(np.asarray(cols, np.int64)))  # a repeated item counts once
        if self.col_of_row is None:
            return dense
        return np.where(self.col_of_row >= 0, dense[self.col_of_row], 0.0)


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
        # The policy table, checked now: unknown mechanisms or an empty grid refuse the start.
        self.auto_table = (None if artifact.policy is None
                           else PolicyTable.from_frame(artifact.policy, f"{artifact.path}/{POLICY}"))
        info = artifact.manifest.policy
        # The table holds for candidate sets as large as its population's (top-500 lists), with the
        # mechanism parameters it was computed with; larger sets (Recommend over the full catalog)
        # use the sign rule.
        self.auto_max_candidates = None if info is None else info.candidates
        self.auto_params = {} if info is None else dict(info.params)
        self.sign_rule = resolve_auto(self.rho_median, policy.auto_threshold)
        self.auto_choice = None if self.auto_table else self.sign_rule
        if self.auto_table is None:
            log.warning("%s has no %s: `auto` falls back to the sign of the population's median Spearman "
                        "(→ %s for every ε); build the table with `recsvc policy --artifacts %s`",
                        artifact.path, POLICY, self.auto_choice or "unavailable", artifact.path)
        default = policy.default_mechanism or AUTO
        if default == AUTO and self.sign_rule is None and self.auto_table is None:
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

    @property
    def auto_description(self) -> str:
        """What `auto` resolves to, for logs: per request from the table, or the sign rule's choice."""
        if self.auto_table is not None:
            t = self.auto_table
            return f"per request from {POLICY} ({len(t.epsilons)} ε × k ∈ {{{', '.join(map(str, t.ks))}}})"
        return f"{self.auto_choice} (sign rule; no {POLICY})"

    def table_applies(self, candidates: int) -> bool:
        """Whether the policy table covers a selection among ``candidates`` items (a public count)."""
        return self.auto_table is not None and (self.auto_max_candidates is None
                                                or candidates <= self.auto_max_candidates)

    def mechanism_name(self, requested: str, epsilon: float | None = None, k: int = 1,
                       candidates: int | None = None) -> str:
        """The mechanism a request runs: ``auto`` and empty resolved, non-private ones gated.
        ``auto`` reads only public data and the request's checked ε, k and candidate count, never
        its scores; without ε (the first checks) it stays ``auto`` until those are known."""
        name = requested or self.default_mechanism
        if name == AUTO:
            table = self.auto_table if candidates is not None and self.table_applies(candidates) else None
            if epsilon is None and (self.auto_table is not None or self.sign_rule is not None):
                return AUTO
            choice = resolve_auto(self.rho_median, self.policy.auto_threshold, table, epsilon, k)
            if choice is None:
                raise InvalidRequest("mechanism 'auto' is unavailable: the artifact has no population Spearman")
            return choice
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

    def resolve(self, name: str, epsilon: float, k: int, candidates: int,
                params: Mapping[str, float | None]) -> tuple[str, Mapping[str, float | None]]:
        """``auto`` → the mechanism for this selection's ε, k and candidate count (never the
        scores), run with the parameters its table assumed where the request sets none."""
        if name != AUTO:
            return name, params
        chosen = self.mechanism_name(AUTO, epsilon, k, candidates)
        if self.table_applies(candidates):
            params = {**params, **{p: v for p, v in self.auto_params.items() if params.get(p) is None}}
        return chosen, params

    def _has_duplicates(self, rows: np.ndarray) -> bool:
        """O(n) check without sorting (np.sort releases the GIL, another needless hand-off):
        write each candidate's position at its row; a row given twice keeps only the later one."""
        slot = getattr(self._local, "slot", None)
        if slot is None:  # per thread; never needs clearing, every read slot was just written
            slot = self._local.slot = np.empty(len(self.catalog.item_ids), np.int64)
        pos = np.arange(rows.size)
        slot[rows] = pos
        return bool((slot[rows] != pos).any())

    def slate_size(self, k: int, candidates: int, epsilon: float, what: str) -> int:
        """The slate size a request asks for (0 → 1), within the candidates and the server's maximum."""
        kk = k or 1
        if kk > self.policy.max_slate:
            raise InvalidRequest(f"k={kk} is too large; this server returns at most {self.policy.max_slate} "
                                 "items per answer (--max-slate)")
        if kk > candidates:
            raise InvalidRequest(f"k={kk} is more than the {candidates} {what}; expected 1 <= k <= {candidates} "
                                 "(k distinct items)")
        step_epsilon(epsilon, kk, "epsilon/k")
        return kk

    def candidate_stage(self, num_candidates: int, candidate_fraction: float | None,
                        epsilon: float) -> CandidateStage | None:
        """Recommend's private top-m, or None (the full catalog). m defaults to the public floor."""
        if candidate_fraction is None:
            return None  # a count alone never shrinks the candidate set
        eps1, _ = split_budget(epsilon, candidate_fraction)
        n = len(self.catalog.item_ids)
        floor = min(self.policy.min_candidates, n)
        m = num_candidates or floor
        if m < floor:
            raise InvalidRequest(
                f"num_candidates={m} is below this server's floor of {floor} private candidates (--min-candidates); "
                f"expected {floor} <= num_candidates <= {n} (the catalog size), or 0 for {floor}"
            )
        if m > n:
            raise InvalidRequest(f"num_candidates={m} is more than the catalog's {n} items; "
                                 f"expected {floor} <= num_candidates <= {n}")
        step_epsilon(eps1, m, "candidate_fraction·epsilon/num_candidates")
        return CandidateStage(m, float(candidate_fraction))

    def prepare_select(self, user_id: str, request_id: str, mechanism: str, epsilon: float,
                       params: Mapping[str, float | None], item_ids: Sequence[str], raw: np.ndarray,
                       fingerprint: Callable[[], bytes], *, k: int = 0) -> Prepared:
        """Checks a Select request and clips its scores; ``fingerprint`` runs only if it is valid."""
        name, eps = self._common(user_id, request_id, mechanism, epsilon, params)
        n = len(item_ids)
        if n == 0:
            raise InvalidRequest("no candidates (n = 0); expected at least one (item_id, score)")
        if n > self.policy.max_candidates:
            raise InvalidRequest(f"{n} candidates is too many; this server accepts at most {self.policy.max_candidates}")
        kk = self.slate_size(k, n, eps, "candidates")
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
        name, params = self.resolve(name, eps, kk, n, params)
        return Prepared(user_id, request_id or uuid.uuid4().hex, fingerprint(), name, eps, params, q, sens, item_ids,
                        kk)

    def prepare_recommend(self, user_id: str, request_id: str, mechanism: str, epsilon: float,
                          params: Mapping[str, float | None], history: Sequence[str], num_candidates: int,
                          fingerprint: Callable[[], bytes], *, k: int = 0,
                          candidate_fraction: float | None = None) -> Prepared:
        """Scores the history server-side over the full catalog (see :class:`Recommender`); with
        ``candidate_fraction``, a private top-``num_candidates`` stage comes first (same ε)."""
        name, eps = self._common(user_id, request_id, mechanism, epsilon, params)
        if self.recommender is None:
            raise Unavailable("this server's artifact has no SANSA model, so Recommend is unavailable; use Select")
        stage = self.candidate_stage(num_candidates, candidate_fraction, eps)
        if stage is None:
            kk = self.slate_size(k, len(self.catalog.item_ids), eps, "items of the catalog")
            name, params = self.resolve(name, eps, kk, len(self.catalog.item_ids), params)
        else:
            eps2 = split_budget(eps, stage.candidate_fraction)[1]  # what the selection among the m spends
            kk = self.slate_size(k, stage.m, eps2, "private candidates (num_candidates)")
            name, params = self.resolve(name, eps2, kk, stage.m, params)
        q = np.clip(self.recommender.scores(history), self.catalog.lo, self.catalog.hi)  # Δ is a bound only clipped
        return Prepared(user_id, request_id or uuid.uuid4().hex, fingerprint(), name, eps, params, q,
                        self.catalog.sensitivity, self.catalog.item_ids, kk, stage)

    def execute(self, ledger: LedgerStore, p: Prepared, encode: Callable[[Selected], bytes]) -> Charge:
        """Draws ``p``'s sample outside the ledger's lock, then charges it and stores
        ``encode(selected)`` in one transaction (see the module docstring). A replayed request
        gets its stored answer and draws nothing; an ε the ledger cannot count exactly
        (below 1e-12) is refused before the ledger is touched."""
        charged = to_epsilon(charge_units(p.epsilon))  # what the ledger spends (rounded up to its unit)

        def sample() -> np.ndarray:  # no lock held; the drawing thread's own CSPRNG
            return draw(p, thread_csprng(), self.policy.allow_non_private)


        def heavy_or_inline() -> np.ndarray:  # a heavy draw (random stopping at a tiny γ) yields the CPU
            return self.heavy.run(sample, p.k * expected_draws(p.mechanism, p.scores.size, p.params))

        def build(picked: np.ndarray, remaining: float) -> bytes:  # inside the transaction: encoding only
            ids = tuple(p.item_ids[i] for i in picked.tolist())
            return encode(Selected(ids, p.mechanism, charged, remaining, p.request_id))

        return ledger.draw_and_charge(p.user_id, p.request_id, p.fingerprint, p.epsilon, heavy_or_inline, build,
                                      mechanism=p.mechanism)
