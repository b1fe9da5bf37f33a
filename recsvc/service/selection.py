"""Private selection for the service, without the wire format: prepare → reserve → draw → commit.

:meth:`Selector.prepare_select` / :meth:`Selector.prepare_recommend` check everything and clip
the scores, touching no ledger. :meth:`Selector.execute` then reads linearly
(:mod:`recsvc.ledger.base`): reserve (ε → exact units; a replay, a conflict or an exhausted
budget ends here, nothing drawn) → draw, holding no ledger lock → commit (one transaction decides
again, stores the typed answer and spends; durable COMMIT). The caller encodes the answer once.

What is protected (docs/concepts/privacy-model.md, "What each RPC protects"): the neighbouring relation is one
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

import functools
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from recsvc.artifact import POLICY, Artifact
from recsvc.checks import ParamError, check_epsilon
from recsvc.ledger import Drawn, Ledger, Replay
from recsvc.mechanisms import MECHANISMS, check_params, select_slate
from recsvc.mechanisms.slate import native_peel_work, slate_split
from recsvc.mechanisms.two_stage import two_stage_split
from recsvc.policy import PolicyTable, population_median, resolve_auto
from recsvc.rng import thread_csprng
from recsvc.service.catalog import BAD_ROW, DUPLICATE, NONFINITE, Catalog, Recommender, RowIds, short
from recsvc.service.config import AUTO, CANDIDATE_MECHANISMS, SelectorConfig
from recsvc.service.draws import HeavyDraws
from recsvc.service.errors import InvalidRequest, Unavailable
from recsvc.service.requests import (
    CandidateStage,
    Columns,
    Prepared,
    Selected,
    SelectInput,
    check_id,
    check_min_epsilon,
    check_user_id,
    draw,
    validated,
    validated_rows,
)

log = logging.getLogger("recsvc.service")


def check_loss_weight(
    params: Mapping[str, float | None], mechanism: str, candidate_mechanism: str | None = None
) -> None:
    """``loss_weight`` is clm's alone: refused unless the selection or its candidate stage runs clm
    (its range, [0, 1], is the mechanisms' own check)."""
    if params.get("loss_weight") is None or "clm" in (mechanism, candidate_mechanism):
        return
    runs = repr(mechanism) + (
        "" if candidate_mechanism is None else f" with candidate_mechanism {candidate_mechanism!r}"
    )
    raise InvalidRequest(
        f"loss_weight is a parameter of clm only, and this request runs {runs}; "
        "expected mechanism or candidate_mechanism 'clm', or no loss_weight"
    )


@functools.cache
def warm_kernels() -> None:
    """Compiles (or loads from numba's cache) the compiled kernels a request may run, so the first
    request after a cold start does not wait seconds for them: clm's draw (Recommend's default
    candidate stage), gem's and mgem's native peels (`auto` slates) with their work estimate, and
    one-user SANSA scoring. Once per process: every Selector shares them. The server runs it in the
    background once it listens (0.6 s with a warm cache, mostly numba's own set-up): a request that
    needs a kernel first waits on numba's compiler lock, so it is slower, never wrong."""
    from recsvc.model import Model

    rng = np.random.default_rng(0)
    q, d = np.array([0.0, 0.5, 1.0]), np.ones(3)
    for name in ("clm", "gem", "mgem"):
        select_slate(name, q, d, 1.0, 2, rng=rng)
    native_peel_work("mgem", q, d, 1.0, 2, {})  # the same kernel prices gem's
    eye = sp.identity(2, format="csr")
    Model(w1=eye, w2=eye, item_ids=np.array(["a", "b"])).score_one(np.array([0]))


class Selector:
    """The service's selection logic over one artifact, under one :class:`SelectorConfig`."""

    def __init__(self, artifact: Artifact, config: SelectorConfig) -> None:
        self.config = config
        self.catalog = Catalog(artifact)
        self.rho_median = population_median(artifact.manifest)
        # The policy table, checked now: unknown mechanisms or an empty grid refuse the start.
        self.auto_table = (
            None if artifact.policy is None else PolicyTable.from_frame(artifact.policy, f"{artifact.path}/{POLICY}")
        )
        info = artifact.manifest.policy
        # The table holds for candidate sets as large as its population's (top-500 lists), with the
        # mechanism parameters it was computed with; larger sets (Recommend over the full catalog)
        # use the sign rule.
        self.auto_max_candidates = None if info is None else info.candidates
        self.auto_params = {} if info is None else dict(info.params)
        self.sign_rule = resolve_auto(self.rho_median, config.selection.auto_threshold)
        self.auto_choice = None if self.auto_table else self.sign_rule
        if self.auto_table is None:
            log.warning(
                "%s has no %s: `auto` falls back to the sign of the population's median Spearman "
                "(→ %s for every ε); build the table with `recsvc policy --artifacts %s`",
                artifact.path,
                POLICY,
                self.auto_choice or "unavailable",
                artifact.path,
            )
        default = config.selection.default_mechanism or AUTO
        if default == AUTO and self.sign_rule is None and self.auto_table is None:
            raise ParamError(
                "{manifest} has no population_spearman.median, which `auto` needs; "
                "rebuild the artifact or set {default_mechanism} to a mechanism name",
                manifest=f"{artifact.path}/manifest.json",
            )
        if default != AUTO:
            self.mechanism_name(default)  # fail at startup, not per request
        self.default_mechanism = default
        self.recommender: Recommender | None = None
        if artifact.has_model:
            self.recommender = Recommender(artifact, self.catalog)
        self._valid: dict[tuple, str] = {}
        self.heavy = HeavyDraws(config.selection.heavy_draws, config.selection.heavy_draw_threads)

    @property
    def auto_description(self) -> str:
        """What `auto` resolves to, for logs: per request from the table, or the sign rule's choice."""
        if self.auto_table is not None:
            t = self.auto_table
            return f"per request from {POLICY} ({len(t.epsilons)} ε × k ∈ {{{', '.join(map(str, t.ks))}}})"
        return f"{self.auto_choice} (sign rule; no {POLICY})"

    def table_applies(self, candidates: int) -> bool:
        """Whether the policy table covers a selection among ``candidates`` items (a public count)."""
        return self.auto_table is not None and (
            self.auto_max_candidates is None or candidates <= self.auto_max_candidates
        )

    def mechanism_name(
        self, requested: str, epsilon: float | None = None, k: int = 1, candidates: int | None = None
    ) -> str:
        """The mechanism a request runs: ``auto`` and empty resolved, non-private ones gated.
        ``auto`` reads only public data and the request's checked ε, k and candidate count, never
        its scores; without ε (the first checks) it stays ``auto`` until those are known."""
        name = requested or self.default_mechanism
        if name == AUTO:
            table = self.auto_table if candidates is not None and self.table_applies(candidates) else None
            if epsilon is None and (self.auto_table is not None or self.sign_rule is not None):
                return AUTO
            choice = resolve_auto(self.rho_median, self.config.selection.auto_threshold, table, epsilon, k)
            if choice is None:
                raise InvalidRequest("mechanism 'auto' is unavailable: the artifact has no population Spearman")
            return choice
        mech = MECHANISMS.get(name)
        if mech is None:
            raise InvalidRequest(
                f"unknown mechanism {short(name)}; expected one of {', '.join(sorted(MECHANISMS))}, or 'auto'"
            )
        if not mech.private and not self.config.selection.allow_non_private:
            raise InvalidRequest(
                f"mechanism {name!r} is not differentially private and this server refuses it; "
                "start the server with --allow-non-private to use it for reference experiments"
            )
        return name

    def _common(
        self, user_id: str, request_id: str, mechanism: str, epsilon: float, params: Mapping[str, float | None]
    ) -> tuple[str, float]:
        check_user_id(user_id)
        check_id("request_id", request_id, required=False)
        key = (mechanism, tuple(params.items()))
        name = self._valid.get(key)  # a (mechanism, params) pair already found valid: same checks, same answer
        if name is None:
            name = self.mechanism_name(mechanism)
        check_epsilon(epsilon, error=InvalidRequest)
        check_min_epsilon(epsilon, self.config.limits.min_epsilon)
        if key not in self._valid:
            check_params(dict(params))  # the mechanisms' own checks, before the ledger is touched
            if len(self._valid) < 4096:
                self._valid[key] = name
        return name, epsilon

    def resolve(
        self, name: str, epsilon: float, k: int, candidates: int, params: Mapping[str, float | None]
    ) -> tuple[str, Mapping[str, float | None]]:
        """``auto`` → the mechanism for this selection's ε, k and candidate count (never the
        scores), run with the parameters its table assumed where the request sets none."""
        if name != AUTO:
            return name, params
        chosen = self.mechanism_name(AUTO, epsilon, k, candidates)
        if self.table_applies(candidates):
            params = {**params, **{p: v for p, v in self.auto_params.items() if params.get(p) is None}}
        return chosen, params

    def slate_size(self, k: int, candidates: int, epsilon: float, what: str) -> int:
        """The slate size a request asks for (0 → 1), within the candidates and the server's maximum."""
        kk = k or 1
        if kk > self.config.limits.max_slate:
            raise InvalidRequest(
                f"k={kk} is too large; this server returns at most {self.config.limits.max_slate} "
                "items per answer (--max-slate)"
            )
        if kk > candidates:
            raise InvalidRequest(
                f"k={kk} is more than the {candidates} {what}; expected 1 <= k <= {candidates} (k distinct items)"
            )
        slate_split(kk).stage_epsilons(epsilon)
        return kk

    def candidate_stage(
        self, num_candidates: int, candidate_fraction: float | None, epsilon: float, mechanism: str = ""
    ) -> CandidateStage | None:
        """Recommend's private top-m, or None (the full catalog). m defaults to the public floor,
        the one-shot mechanism that draws it to the server's default."""
        if candidate_fraction is None:
            if mechanism:
                raise InvalidRequest(
                    f"candidate_mechanism {short(mechanism)} needs candidate_fraction (a two-stage Recommend); "
                    "expected candidate_fraction in (0, 1), or no candidate_mechanism"
                )
            return None  # a count alone never shrinks the candidate set
        name = mechanism or self.config.selection.default_candidate_mechanism
        if name not in CANDIDATE_MECHANISMS:
            raise InvalidRequest(
                f"candidate_mechanism {short(name)} cannot draw the candidate stage; expected one of "
                f"{', '.join(CANDIDATE_MECHANISMS)} (a one-shot top-k mechanism), or empty for the server's "
                f"default ({self.config.selection.default_candidate_mechanism})"
            )
        two_stage_split(candidate_fraction).budgets(epsilon)
        n = len(self.catalog.item_ids)
        floor = min(self.config.limits.min_candidates, n)
        m = num_candidates or floor
        if m < floor:
            raise InvalidRequest(
                f"num_candidates={m} is below this server's floor of {floor} private candidates (--min-candidates); "
                f"expected {floor} <= num_candidates <= {n} (the catalog size), or 0 for {floor}"
            )
        cap = self.config.limits.max_num_candidates
        if m > cap:  # the candidate stage costs ≈ m × n draws: the operator bounds it
            raise InvalidRequest(
                f"num_candidates={m} is more than this server's cap of {cap} (--max-num-candidates); "
                f"expected {floor} <= num_candidates <= {min(cap, n)}"
            )
        if m > n:
            raise InvalidRequest(
                f"num_candidates={m} is more than the catalog's {n} items; expected {floor} <= num_candidates <= {n}"
            )
        two_stage_split(candidate_fraction, m, m_label="num_candidates", candidate_one_shot=True).stage_epsilons(
            epsilon
        )
        return CandidateStage(m, float(candidate_fraction), name)

    def prepare_select(
        self,
        user_id: str,
        request_id: str,
        mechanism: str,
        epsilon: float,
        params: Mapping[str, float | None],
        item_ids: Sequence[str],
        raw: np.ndarray,
        fingerprint: Callable[[], bytes],
        *,
        k: int = 0,
    ) -> Prepared:
        """One id-encoded Select request through :meth:`prepare_many`; raises its refusal."""
        x = SelectInput(user_id, request_id, mechanism, epsilon, params, fingerprint, k, item_ids)
        out = self.prepare_many([x], Columns.of([np.asarray(raw, np.float64)], []))[0]
        if isinstance(out, Exception):
            raise out
        return out

    def _checked(self, x: SelectInput, n: int) -> tuple[str, int]:
        """A request's checks that do not read its candidates, in Select's order: (mechanism, k)."""
        name, eps = self._common(x.user_id, x.request_id, x.mechanism, x.epsilon, x.params)
        if n == 0:
            raise InvalidRequest("no candidates (n = 0); expected at least one (item_id, score)")
        if n > self.config.limits.max_candidates:
            raise InvalidRequest(
                f"{n} candidates is too many; this server accepts at most {self.config.limits.max_candidates}"
            )
        return name, self.slate_size(x.k, n, eps, "candidates")

    def _duplicate(self, x: SelectInput, rows: np.ndarray) -> InvalidRequest:
        """The refusal of a request that names an item twice, with the first repeated one."""
        if x.item_ids is None:
            _, first = np.unique(rows, return_index=True)
            dup = int(rows[np.setdiff1d(np.arange(rows.size), first)[0]])
            return InvalidRequest(f"duplicate item_rows entry {dup} among the candidates; expected each item once")
        seen: set[str] = set()
        dup_id = next(i for i in x.item_ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]  # add's None makes `or` false: records i, moves on
        return InvalidRequest(f"duplicate item_id {short(dup_id)} among the candidates; expected each item once")

    def prepare_many(self, inputs: Sequence[SelectInput], cols: Columns) -> list[Prepared | Exception]:
        """Checks Select requests and clips their scores: THE Select validation (one request is a
        batch of one). Each input gets its Prepared or its refusal, exactly as if it came alone;
        the checks on the candidates run once over the concatenated columns."""
        out: list[Prepared | Exception | None] = [None] * len(inputs)
        checked: dict[int, tuple[str, int]] = {}
        for i, x in enumerate(inputs):
            try:
                checked[i] = self._checked(x, int(cols.lengths[i]))
            except Exception as exc:
                out[i] = exc
        ends = np.cumsum(cols.lengths).tolist()
        span = [(e - n, e) for e, n in zip(ends, cols.lengths.tolist(), strict=False)]
        by_id = [x.item_ids is not None for x in inputs]
        rows = cols.rows if not any(by_id) else self._rows(inputs, cols, by_id)
        screened = self.catalog.screen(rows, cols.raw, cols.lengths)  # clipped, and what is wrong, in one pass
        q, sens, flags = screened.scores, screened.sensitivities, screened.flags.tolist()
        for i in list(checked):
            x, (s, e) = inputs[i], span[i]
            try:
                if flags[i] & NONFINITE:
                    nonfinite = np.flatnonzero(~np.isfinite(cols.raw[s:e]))
                    raise InvalidRequest(
                        f"{nonfinite.size} candidate score(s) are NaN or infinite (first: "
                        f"candidate #{int(nonfinite[0])}); expected finite scores"
                    )
                self.catalog.check_version(x.catalog_version, required=x.item_ids is None)
                if flags[i] & BAD_ROW:
                    raise (
                        self.catalog.bad_row(rows[s:e])
                        if x.item_ids is None
                        else self.catalog.unknown_id(x.item_ids, rows[s:e])
                    )
                if flags[i] & DUPLICATE:  # the same item twice (ids map 1:1 to rows)
                    raise self._duplicate(x, rows[s:e])
            except Exception as exc:
                out[i] = exc
                del checked[i]
        # items that run one mechanism with one k and parameters: their parameters and indices
        groups: dict[tuple, tuple[Mapping[str, float | None], list[int]]] = {}
        for i, (name, kk) in checked.items():
            x, (s, e) = inputs[i], span[i]
            try:
                name, params = self.resolve(name, x.epsilon, kk, e - s, x.params)
                check_loss_weight(params, name)
            except Exception as exc:
                out[i] = exc
                continue
            groups.setdefault((name, kk, tuple(params.items())), (params, []))[1].append(i)
        for (name, kk, _), (params, members) in groups.items():
            valids = validated_rows(
                name,
                kk,
                params,
                [q[span[i][0] : span[i][1]] for i in members],
                [sens[span[i][0] : span[i][1]] for i in members],
                [inputs[i].epsilon for i in members],
                self.allow_non_private,
            )
            for i, valid in zip(members, valids, strict=True):
                if isinstance(valid, Exception):
                    out[i] = valid
                    continue
                x, (s, e) = inputs[i], span[i]
                ids = x.item_ids if x.item_ids is not None else RowIds(self.catalog.item_ids, rows[s:e])
                out[i] = Prepared(
                    x.user_id,
                    x.request_id or uuid.uuid4().hex,
                    x.fingerprint(),
                    name,
                    x.epsilon,
                    params,
                    q[s:e],
                    sens[s:e],
                    ids,
                    kk,
                    rows=rows[s:e],
                    valid=valid,
                )
        return out  # type: ignore[return-value]  # the loops above replaced every None

    def _rows(self, inputs: Sequence[SelectInput], cols: Columns, by_id: list[bool]) -> np.ndarray:
        """Every candidate's catalog row: the id-encoded inputs' ids mapped in ONE pass (−1: unknown)."""
        id_inputs = [x.item_ids for x in inputs if x.item_ids is not None]
        mapped = self.catalog.rows(*id_inputs)
        if all(by_id):
            return mapped
        rows = np.empty(cols.raw.size, np.int64)
        mask = np.repeat(np.array(by_id), cols.lengths)
        rows[mask], rows[~mask] = mapped, cols.rows
        return rows

    def prepare_recommend(
        self,
        user_id: str,
        request_id: str,
        mechanism: str,
        epsilon: float,
        params: Mapping[str, float | None],
        history: Sequence[str],
        num_candidates: int,
        fingerprint: Callable[[], bytes],
        *,
        k: int = 0,
        candidate_fraction: float | None = None,
        candidate_mechanism: str = "",
    ) -> Prepared:
        """Scores the history server-side over the full catalog (see :class:`Recommender`); with
        ``candidate_fraction``, a private top-``num_candidates`` stage by ``candidate_mechanism``
        (empty: the server's default) comes first (same ε)."""
        name, eps = self._common(user_id, request_id, mechanism, epsilon, params)
        if self.recommender is None:
            raise Unavailable("this server's artifact has no SANSA model, so Recommend is unavailable; use Select")
        stage = self.candidate_stage(num_candidates, candidate_fraction, eps, candidate_mechanism)
        if stage is None:
            kk = self.slate_size(k, len(self.catalog.item_ids), eps, "items of the catalog")
            name, params = self.resolve(name, eps, kk, len(self.catalog.item_ids), params)
        else:
            eps2 = two_stage_split(stage.candidate_fraction).budgets(eps)[1]  # what the selection among the m spends
            kk = self.slate_size(k, stage.m, eps2, "private candidates (num_candidates)")
            name, params = self.resolve(name, eps2, kk, stage.m, params)
        check_loss_weight(params, name, None if stage is None else stage.mechanism)
        q = np.clip(self.recommender.scores(history), self.catalog.lo, self.catalog.hi)  # Δ is a bound only clipped
        valid = validated(name, eps, params, q, self.catalog.sensitivity, kk, stage, self.allow_non_private)
        return Prepared(
            user_id,
            request_id or uuid.uuid4().hex,
            fingerprint(),
            name,
            eps,
            params,
            q,
            self.catalog.sensitivity,
            self.catalog.item_ids,
            kk,
            stage,
            valid=valid,
        )

    @property
    def allow_non_private(self) -> bool:
        return self.config.selection.allow_non_private

    def execute(self, ledger: Ledger, p: Prepared) -> Selected:
        """Reserves ``p``, draws its sample holding no ledger lock, and commits it (see the module
        docstring). A replayed request gets its stored answer and draws nothing; an ε the ledger
        cannot count exactly (below 1e-12) is refused before the ledger is touched."""
        got = ledger.reserve(p.user_id, p.request_id, p.fingerprint, p.charge, p.mechanism)
        if isinstance(got, Replay):
            return Selected(got.answer, p.request_id, replayed=True)
        with got:  # this thread's CSPRNG, or a heavy draw's process
            picked = self.heavy.draw(p, lambda: draw(p, thread_csprng()))
            charge = ledger.commit(got, Drawn(*p.answer(picked)))
        return Selected(charge.answer, p.request_id, charge.replayed)
