"""The PrivateSelection servicer: validate and clip → ledger transaction (replay | conflict |
budget check → sample → store answer and spend) → durable COMMIT → answer.

Order matters for privacy: every check of the input runs before the ledger is touched; the
sample is drawn inside the ledger transaction, only after the replay, conflict and budget
checks passed (so a retry or a refused request never draws one), with the CSPRNG of the thread
that commits it, and it is revealed only after the spend and the stored answer are durably
committed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
import scipy.sparse as sp

from recsvc.artifact import Artifact, Manifest
from recsvc.mechanisms import MECHANISMS, PARAM_NAMES, check_params, select
from recsvc.model import top_k
from recsvc.rng import thread_csprng
from recsvc.service import metrics
from recsvc.service.ledger import BudgetExceeded, Ledger, RequestConflict
from recsvc.v1 import selection_pb2 as pb
from recsvc.v1 import selection_pb2_grpc as pb_grpc

log = logging.getLogger("recsvc.service")

AUTO = "auto"
DEFAULT_RECOMMEND_K = 500
MAX_ID_LEN = 256


class InvalidRequest(ValueError):
    """Bad input: INVALID_ARGUMENT, nothing spent. Messages never contain score values."""


class Unavailable(Exception):
    """The request is well-formed but this server cannot serve it (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class Policy:
    """The servicer's knobs (a subset of ServerConfig, so the servicer has no CLI concerns)."""

    default_mechanism: str = AUTO
    auto_threshold: float = 0.1
    max_candidates: int = 10_000
    max_batch: int = 1000
    allow_non_private: bool = False


@dataclass(frozen=True)
class Prepared:
    """A fully validated request, ready to sample: nothing here has touched the ledger."""

    user_id: str
    request_id: str
    fingerprint: bytes
    mechanism: str  # resolved (never "auto" or empty)
    epsilon: float
    params: dict[str, float | None]
    # The user's data stays out of repr(), so no log line or traceback can print it.
    scores: np.ndarray = field(repr=False)  # clipped to each item's [lo, hi]
    sensitivities: np.ndarray = field(repr=False)
    item_ids: Sequence[str] = field(repr=False)  # a list, or the request's repeated field itself (no copy)


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
                f"unknown item_id {_short(exc.args[0])} (candidate #{pos}); expected an item_id from the "
                f"artifact's items.parquet ({len(self.item_ids)} items)"
            ) from None


class Recommender:
    """Server-side SANSA: history → dense scores → top-k unseen items that have clip ranges,
    ranked by :func:`recsvc.model.top_k` (ties → lower model column), as the pipeline ranks."""

    def __init__(self, artifact: Artifact, catalog: Catalog) -> None:
        self.model = artifact.model
        self.index = self.model.index
        # Model column → items.parquet row (−1: the item has no public clip range; never a candidate).
        self.row_of_col = np.array([catalog.index.get(i, -1) for i in self.model.item_ids.tolist()], np.int64)

    def candidates(self, history: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(items.parquet rows, raw scores) of the top-k unseen items, best first."""
        cols = []
        for pos, item in enumerate(history):
            col = self.index.get(item)
            if col is None:
                raise InvalidRequest(
                    f"unknown item_id {_short(item)} in history (position {pos}); expected item ids "
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


def _short(s: str, limit: int = 64) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "…")


def _check_id(name: str, value: str, required: bool) -> None:
    if required and not value:
        raise InvalidRequest(f"{name} is empty; expected a non-empty string")
    if len(value) > MAX_ID_LEN:
        raise InvalidRequest(f"{name} is {len(value)} characters long; expected at most {MAX_ID_LEN}")


def _candidate_columns(req: pb.SelectRequest) -> tuple[Sequence[str], np.ndarray]:
    """(item_ids, raw scores) from either encoding of the candidates."""
    if len(req.item_ids) or len(req.scores):
        if len(req.candidates):
            raise InvalidRequest("both candidates and item_ids/scores are set; expected exactly one encoding")
        ids, raw = req.item_ids, np.array(req.scores, dtype=np.float64)
        if len(ids) != raw.size:
            raise InvalidRequest(
                f"item_ids has {len(ids)} entries but scores has {raw.size}; expected one score per item_id"
            )
        return ids, raw
    cands = list(req.candidates)  # one wrapper per candidate: the slower encoding
    return [c.item_id for c in cands], np.array([c.score for c in cands], dtype=np.float64)


_HASH_PIECE = 2000  # bytes; hashlib releases the GIL for updates of 2048 bytes or more


def _fingerprint(kind: bytes, req: Any) -> bytes:
    """SHA-256 of the canonical request. Fed in pieces below hashlib's 2 KiB GIL-release
    threshold: releasing the GIL for a few µs of hashing only wakes a waiting thread for nothing."""
    h = hashlib.sha256(kind)
    data = memoryview(req.SerializeToString(deterministic=True))
    for i in range(0, len(data), _HASH_PIECE):
        h.update(data[i:i + _HASH_PIECE])
    return h.digest()


def _params(req: Any) -> dict[str, float | None]:
    """The request's mechanism parameters (None: the mechanism's default), checked by the
    mechanisms' own validation before the ledger is touched."""
    out: dict[str, float | None] = {name: getattr(req, name) if req.HasField(name) else None
                                    for name in PARAM_NAMES}
    check_params(out)
    return out


T = TypeVar("T")


class SelectionServicer(pb_grpc.PrivateSelectionServicer):
    def __init__(self, artifact: Artifact, ledger: Ledger | None, policy: Policy) -> None:
        # The server may attach the ledger later: it opens it only after every startup check.
        self.ledger: Ledger = ledger  # type: ignore[assignment]
        self.policy = policy
        self.catalog = Catalog(artifact)
        self.rho_median = population_median(artifact.manifest)
        self.auto_choice = resolve_auto(self.rho_median, policy.auto_threshold)
        default = policy.default_mechanism or AUTO
        if default == AUTO and self.auto_choice is None:
            raise ValueError(
                f"{artifact.path}/manifest.json has no population_spearman.median, which `auto` needs; "
                "rebuild the artifact or pass --default-mechanism NAME"
            )
        if default != AUTO:
            self._mechanism_name(default)  # fail at startup, not per request
        self.default_mechanism = default
        self.recommender: Recommender | None = None
        if artifact.has_model:
            self.recommender = Recommender(artifact, self.catalog)
        self._local = threading.local()

    # -- helpers ---------------------------------------------------------------------------

    def _mechanism_name(self, requested: str) -> str:
        name = requested or self.default_mechanism
        if name == AUTO:
            if self.auto_choice is None:
                raise InvalidRequest("mechanism 'auto' is unavailable: the artifact has no population Spearman")
            return self.auto_choice
        mech = MECHANISMS.get(name)
        if mech is None:
            raise InvalidRequest(
                f"unknown mechanism {_short(name)}; expected one of {', '.join(sorted(MECHANISMS))}, or 'auto'"
            )
        if not mech.private and not self.policy.allow_non_private:
            raise InvalidRequest(
                f"mechanism {name!r} is not differentially private and this server refuses it; "
                "start the server with --allow-non-private to use it for reference experiments"
            )
        return name

    def _common(self, req: Any) -> tuple[str, str, float, dict[str, float | None]]:
        _check_id("user_id", req.user_id, required=True)
        _check_id("request_id", req.request_id, required=False)
        mechanism = self._mechanism_name(req.mechanism)
        eps = req.epsilon
        if not (math.isfinite(eps) and eps > 0):
            raise InvalidRequest(f"epsilon must be a positive finite number, got {eps!r}")
        return req.user_id, mechanism, eps, _params(req)

    def _clip(self, rows: np.ndarray, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = self.catalog
        # Clipping to the public [lo, hi] is what makes Δ a true bound (SPEC §1): never skip it.
        return np.clip(raw, c.lo[rows], c.hi[rows]), c.sensitivity[rows]

    def _has_duplicates(self, rows: np.ndarray) -> bool:
        """O(n) check without sorting (np.sort releases the GIL, another needless hand-off):
        write each candidate's position at its row; a row given twice keeps only the later one."""
        slot = getattr(self._local, "slot", None)
        if slot is None:  # per thread; never needs clearing, every read slot was just written
            slot = self._local.slot = np.empty(len(self.catalog.item_ids), np.int64)
        pos = np.arange(rows.size)
        slot[rows] = pos
        return bool((slot[rows] != pos).any())

    def prepare_select(self, req: pb.SelectRequest) -> Prepared:
        user_id, mechanism, eps, params = self._common(req)
        item_ids, raw = _candidate_columns(req)
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
            raise InvalidRequest(f"duplicate item_id {_short(dup)} among the candidates; expected each item once")
        q, sens = self._clip(rows, raw)
        fp = _fingerprint(b"select\0", req)
        return Prepared(user_id, req.request_id or uuid.uuid4().hex, fp, mechanism, eps, params, q, sens, item_ids)

    def prepare_recommend(self, req: pb.RecommendRequest) -> Prepared:
        user_id, mechanism, eps, params = self._common(req)
        if self.recommender is None:
            raise Unavailable("this server's artifact has no SANSA model, so Recommend is unavailable; use Select")
        k = req.num_candidates or min(DEFAULT_RECOMMEND_K, self.policy.max_candidates)
        if k > self.policy.max_candidates:
            raise InvalidRequest(f"num_candidates={k} is too many; this server accepts at most {self.policy.max_candidates}")
        rows, raw = self.recommender.candidates(list(req.history), k)
        q, sens = self._clip(rows, raw)
        fp = _fingerprint(b"recommend\0", req)
        ids = [self.catalog.item_ids[r] for r in rows.tolist()]
        return Prepared(user_id, req.request_id or uuid.uuid4().hex, fp, mechanism, eps, params, q, sens, ids)

    def execute(self, p: Prepared) -> pb.SelectResponse:
        def sample_and_build(remaining: float) -> bytes:
            # Runs inside the ledger transaction, after the replay, conflict and budget checks
            # (so a retried or refused request never draws a sample), in whichever request
            # thread leads the group commit: that thread's own CSPRNG draws the sample.
            index = select(p.mechanism, p.scores, p.sensitivities, p.epsilon, rng=thread_csprng(),
                           allow_non_private=self.policy.allow_non_private, **p.params)
            return pb.SelectResponse(
                item_id=p.item_ids[int(index)], mechanism=p.mechanism, epsilon_spent=p.epsilon,
                budget_remaining=remaining, request_id=p.request_id,
            ).SerializeToString()

        charge = self.ledger.charge(p.user_id, p.request_id, p.fingerprint, p.epsilon, sample_and_build)
        if charge.replayed:
            return self._replay(charge.response)
        metrics.epsilon_spent(p.mechanism).inc(p.epsilon)
        return pb.SelectResponse.FromString(charge.response)

    @staticmethod
    def _replay(stored: bytes) -> pb.SelectResponse:
        metrics.REPLAYS.inc()
        resp = pb.SelectResponse.FromString(stored)
        resp.replayed = True
        return resp

    # -- RPCs --------------------------------------------------------------------------------

    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable[[], T],
              mechanism: Callable[[T], str] = lambda _: "") -> T:
        """Runs one RPC body: maps refusals to status codes, records metrics, logs no scores."""
        t0 = time.perf_counter()
        code, mech = grpc.StatusCode.OK, ""
        try:
            result = fn()
            mech = mechanism(result)
            return result
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status code
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error(method, exc)
            context.abort(code, message)
            raise AssertionError("unreachable")  # context.abort raises
        finally:
            elapsed = time.perf_counter() - t0
            metrics.requests(method, mech, code.name).inc()
            metrics.latency(method).observe(elapsed)
            if log.isEnabledFor(logging.DEBUG):  # no formatting work unless asked for
                log.debug("%s %s mechanism=%s %.2fms", method, code.name, mech or "-", elapsed * 1e3)

    def Select(self, request: pb.SelectRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        return self._call("Select", context, lambda: self.execute(self.prepare_select(request)),
                          lambda r: r.mechanism)

    def Recommend(self, request: pb.RecommendRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        return self._call("Recommend", context, lambda: self.execute(self.prepare_recommend(request)),
                          lambda r: r.mechanism)

    def SelectBatch(self, request: pb.SelectBatchRequest, context: grpc.ServicerContext) -> pb.SelectBatchResponse:
        def run() -> pb.SelectBatchResponse:
            if len(request.requests) > self.policy.max_batch:
                raise InvalidRequest(
                    f"{len(request.requests)} requests in one batch is too many; expected at most {self.policy.max_batch}"
                )
            return pb.SelectBatchResponse(results=list(self._batch_items(request.requests)))

        return self._call("SelectBatch", context, run)

    def _batch_items(self, requests: Iterable[pb.SelectRequest]) -> Iterable[pb.SelectResult]:
        for req in requests:  # each item is its own transaction: partial failures are per item
            try:
                resp = self.execute(self.prepare_select(req))
            except Exception as exc:  # noqa: BLE001
                code, message = status_of(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log_internal_error("SelectBatch item", exc)
                metrics.requests("SelectBatch.item", "", code.name).inc()
                yield pb.SelectResult(error=pb.Error(code=code.value[0], code_name=code.name, message=message))
            else:
                metrics.requests("SelectBatch.item", resp.mechanism, "OK").inc()
                yield pb.SelectResult(response=resp)

    def GetBudget(self, request: pb.GetBudgetRequest, context: grpc.ServicerContext) -> pb.GetBudgetResponse:
        def run() -> pb.GetBudgetResponse:
            _check_id("user_id", request.user_id, required=True)
            u = self.ledger.user(request.user_id)
            return pb.GetBudgetResponse(user_id=u.user_id, budget=u.budget, spent=u.spent,
                                        remaining=u.remaining, requests=u.requests)

        return self._call("GetBudget", context, run)

    def ListMechanisms(self, request: pb.ListMechanismsRequest, context: grpc.ServicerContext) -> pb.ListMechanismsResponse:
        def run() -> pb.ListMechanismsResponse:
            infos = [
                pb.MechanismInfo(name=name, private=bool(m.private),
                                 allowed=bool(m.private) or self.policy.allow_non_private)
                for name, m in sorted(MECHANISMS.items())
            ]
            return pb.ListMechanismsResponse(
                mechanisms=infos,
                default_mechanism=self.default_mechanism,
                auto_resolves_to=self.auto_choice or "",
                auto_threshold=self.policy.auto_threshold,
                population_spearman_median=self.rho_median if self.rho_median is not None else float("nan"),
                budget=self.ledger.budget,
                max_candidates=self.policy.max_candidates,
            )

        return self._call("ListMechanisms", context, run)


def log_internal_error(what: str, exc: BaseException) -> None:
    """Logs an unexpected failure by type and stack only: an exception's message (e.g. one of
    numpy's) may quote the values it was given, and those may be a user's scores."""
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s failed with an internal error: %s (message withheld)\n%s", what, type(exc).__name__, stack)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for a refusal. Messages are ours (no score values), except ValueErrors
    from the mechanisms, which validate the same inputs we already checked."""
    if isinstance(exc, BudgetExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, RequestConflict):
        return grpc.StatusCode.ALREADY_EXISTS, str(exc)
    if isinstance(exc, Unavailable):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"
