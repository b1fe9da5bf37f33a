"""Candidate pipelines and slate metrics: what honest accounting costs.

Every pipeline selects a k-item slate for a test user from that user's FULL-CATALOG clipped SANSA
scores q (every items.parquet row, the user's own input items included: exactly what the
service's Recommend selects over, scored from the artifact's ``test_inputs.parquet``):

- ``top500``: the paper's pre-filter: the top-m (m = ``two_stage_m``, 500) items of the raw
  scores, chosen NON-privately, then the slate among them with the whole ε. NOT end-to-end DP
  (every item outside the top-m has probability 0, depending on the history). It ranks the same
  full-catalog scores (seen items kept), so all pipelines share one reference; the default
  ``recsvc eval`` keeps the paper's top-500 of the unseen items.
- ``full``: the slate over the whole catalog with ε (ε-DP end to end).
- ``two-stage:F``: a private top-m (rnm peeling with F·ε, as ``select_two_stage``), then the
  slate among those m with (1 − F)·ε (ε-DP end to end). ``two-stage:F:MECH`` draws the top-m with
  mechanism MECH instead (a one-shot ``oneshot``, ``gumbel`` or ``clm``: one run at F·ε, as the
  service's Recommend does); its label keeps the suffix.

Metrics for each slate size k (k peeled selections with ε/k each, or one run at ε of a one-shot
mechanism):
- ``first_mse``: E[(max_a q_a − q_first)²], the paper's MSE for the slate's first item;
- ``recall``: E[|{a in slate : q_a ≥ q_(k)}|] / k, with q_(k) the k-th largest full-catalog
  clipped score: the share of the slate that is in the user's true top-k (ties at q_(k) count
  as in it, so clipping ties never make the true top-k ambiguous).

Exact expectations where cheap (``--exact`` and exact mechanisms: k = 1 on top500/full from
``probabilities``; any k or two-stage when the enumeration of ``slate_probabilities`` /
``two_stage_probabilities`` is small), Monte Carlo otherwise. Draws for user b come from
SeedSequence(seed, spawn_key=(b, TAG, pipeline, ε[, mechanism, k])), so results do not depend on
chunking or engine, nor on which other mechanisms are evaluated. Two-stage Monte Carlo draws stage
1 once per (user, ε, trial) and shares it across mechanisms and k (common random numbers; each
(mechanism, k) still sees exactly select_two_stage's distribution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recsvc.checks import ParamError
from recsvc.mechanisms import MECHANISMS, probabilities, select_slate, slate_probabilities, two_stage_probabilities
from recsvc.mechanisms.registry import check_params, get_mechanism
from recsvc.model import top_k
from recsvc.rng import stream

TAG = 2**31 + 11  # second spawn-key word: pipeline streams never meet eval's other streams
DEFAULT_M = 500
DEFAULT_SLATE_K = (1, 5, 10)
CANDIDATE_MECHANISM = "rnm"  # two-stage's private top-m (select_two_stage's default)
EXACT_LIMIT = 200_000  # enumerated outcomes (= recsvc.mechanisms.slate.MAX_EXACT_OUTCOMES)


@dataclass(frozen=True)
class Pipeline:
    kind: str  # "top500", "full", "two-stage"
    fraction: float | None = None  # two-stage's share of ε for the candidate stage; None for the others
    candidate: str = CANDIDATE_MECHANISM  # two-stage's private top-m mechanism

    @property
    def label(self) -> str:
        if self.fraction is None:
            return self.kind
        suffix = "" if self.candidate == CANDIDATE_MECHANISM else f":{self.candidate}"
        return f"two-stage:{self.fraction:g}{suffix}"

    @property
    def end_to_end_dp(self) -> bool:
        return self.kind != "top500"


def parse_pipeline(text: str) -> Pipeline:
    """``top500``, ``full`` or ``two-stage:F[:MECH]`` with F in (0, 1) and MECH a private mechanism;
    ParamError otherwise."""
    t = str(text).strip().lower()
    if t in ("top500", "full"):
        return Pipeline(t)
    if t.startswith("two-stage:"):
        raw, _, cand = t.split(":", 1)[1].partition(":")
        cand = cand or CANDIDATE_MECHANISM
        if cand not in MECHANISMS or not MECHANISMS[cand].private:
            private = ", ".join(n for n, m in MECHANISMS.items() if m.private)
            raise ParamError(
                "{pipelines}: unknown candidate mechanism {value} in two-stage:F:MECH; expected one of {names}",
                value=repr(cand),
                names=private,
            )
        try:
            f = float(raw)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and 0.0 < f < 1.0):
            raise ParamError(
                "{pipelines}: two-stage fraction must be a number in the open interval (0, 1) "
                "(the share of ε spent on the private candidate stage), got {value}",
                value=repr(raw),
            )
        return Pipeline("two-stage", f, cand)
    raise ParamError(
        "{pipelines}: unknown pipeline {value}; expected top500, full or two-stage:F[:MECH] with F in (0, 1)",
        value=repr(text),
    )


def parse_pipelines(
    texts: tuple[str, ...], slate_k: tuple[int, ...], m: int, two_stage_trials: int | None, source_is_artifact: bool
) -> tuple[Pipeline, ...]:
    """Every check of the pipeline options that needs no data."""
    if not texts:
        return ()
    if not source_is_artifact:
        raise ParamError("{pipelines} needs {artifacts}: a synthetic scenario has no catalog to select from")
    out = tuple(parse_pipeline(t) for t in texts)
    if len({p.label for p in out}) != len(out):
        raise ParamError("{pipelines} must be distinct, got {value}", value=" ".join(texts))
    if not slate_k:
        raise ParamError("{slate_k}: give at least one slate size k ≥ 1")
    for k in slate_k:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ParamError("{slate_k}: every slate size must be an integer k ≥ 1, got {value}", value=repr(k))
    if len(set(slate_k)) != len(slate_k):
        raise ParamError("{slate_k} must be distinct, got {value}", value=list(slate_k))
    if isinstance(m, bool) or not isinstance(m, int) or m < max(slate_k):
        raise ParamError(
            "{two_stage_m} must be an integer ≥ the largest slate size {k}, got {value}", k=max(slate_k), value=repr(m)
        )
    if two_stage_trials is not None and (
        isinstance(two_stage_trials, bool) or not isinstance(two_stage_trials, int) or two_stage_trials < 1
    ):
        raise ParamError("{two_stage_trials} must be an integer ≥ 1, got {value}", value=repr(two_stage_trials))
    return out


@dataclass(frozen=True)
class PipelineContext:
    pipelines: tuple[Pipeline, ...]
    slate_k: tuple[int, ...]
    m: int
    trials: int
    two_stage_trials: int
    exact: bool
    lo: np.ndarray  # (n,) the catalog's clip ranges and Δ, items.parquet order
    hi: np.ndarray
    sens: np.ndarray


def _exact_stats(
    name: str,
    pipe: Pipeline,
    q: np.ndarray,
    d: np.ndarray,
    eps: float,
    k: int,
    m: int,
    params: dict,
    gap: np.ndarray,
    thr: float,
    cand: np.ndarray,
) -> tuple[float, float] | None:
    """(first_mse, recall) from exact probabilities, or None when not cheap here."""
    if pipe.fraction is not None:  # two-stage
        n = len(q)
        if math.perm(n, m) + math.comb(n, m) * math.perm(m, k) > EXACT_LIMIT:
            return None
        probs = two_stage_probabilities(name, q, d, eps, m, pipe.fraction, k, pipe.candidate, **params)
        idx = None
    elif k == 1:
        p = probabilities(name, q[cand], d[cand], eps, **params)
        return float(p @ gap[cand]), float(p @ (q[cand] >= thr))
    else:
        if math.perm(len(cand), k) > EXACT_LIMIT:
            return None
        probs = slate_probabilities(name, q[cand], d[cand], eps, k, **params)
        idx = cand
    mse = rec = 0.0
    for slate, pr in probs.items():
        s = np.asarray(slate) if idx is None else idx[np.asarray(slate)]
        mse += pr * gap[s[0]]
        rec += pr * float((q[s] >= thr).sum()) / k
    return mse, rec


def _mc_slates(
    name: str, q: np.ndarray, d: np.ndarray, eps: float, k: int, trials: int, rng: np.random.Generator, params: dict
) -> np.ndarray:
    """(trials, k) slates of select_slate's distribution (k = 1: one vectorised draw)."""
    if k == 1:
        mech = get_mechanism(name)
        return np.asarray(mech.sample(q, d, eps, check_params(params, mech), rng, trials)).reshape(trials, 1)
    return np.stack([select_slate(name, q, d, eps, k, rng, **params) for _ in range(trials)])


def _slate_metrics(slates: np.ndarray, q: np.ndarray, gap: np.ndarray, thr: float) -> tuple[float, float]:
    return float(gap[slates[:, 0]].mean()), float((q[slates] >= thr).mean())


def evaluate_user(
    raw: np.ndarray,
    b: int,
    seed: int,
    mechanisms: tuple[str, ...],
    epsilons: tuple[float, ...],
    params: dict[str, dict],
    ctx: PipelineContext,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first_mse, recall, exact) arrays (P, M, E, K) for global user b with raw catalog scores."""
    q = np.clip(raw, ctx.lo, ctx.hi)
    d = ctx.sens
    n = len(q)
    m = min(ctx.m, n)
    desc = np.sort(q)[::-1]
    gap, thr = (desc[0] - q) ** 2, {k: float(desc[min(k, n) - 1]) for k in ctx.slate_k}
    shape = (len(ctx.pipelines), len(mechanisms), len(epsilons), len(ctx.slate_k))
    mse, rec, exact = np.empty(shape), np.empty(shape), np.zeros(shape, dtype=bool)
    full = np.arange(n)
    top = np.sort(top_k(raw[None, :], m).index[0].astype(np.int64))  # paper's pre-filter, catalog order
    for pi, pipe in enumerate(ctx.pipelines):
        cand = top if pipe.kind == "top500" else full
        for ei, eps in enumerate(epsilons):
            stage1 = None
            for mi, name in enumerate(mechanisms):
                for ki, k in enumerate(ctx.slate_k):
                    if ctx.exact and MECHANISMS[name].exact and MECHANISMS[pipe.candidate].exact:
                        got = _exact_stats(name, pipe, q, d, eps, k, m, params.get(name, {}), gap, thr[k], cand)
                        if got is not None:
                            (mse[pi, mi, ei, ki], rec[pi, mi, ei, ki]), exact[pi, mi, ei, ki] = got, True
                            continue
                    rng = stream(seed, b, TAG, pi, ei, mi, ki)
                    if pipe.fraction is None:  # top500 or full: a single stage
                        sl = _mc_slates(name, q[cand], d[cand], eps, k, ctx.trials, rng, params.get(name, {}))
                        mse[pi, mi, ei, ki], rec[pi, mi, ei, ki] = _slate_metrics(cand[sl], q, gap, thr[k])
                        continue
                    eps1 = pipe.fraction * eps
                    if stage1 is None:  # one private top-m per trial, shared by every mechanism and k
                        r1 = stream(seed, b, TAG, pi, ei)
                        stage1 = [
                            np.sort(select_slate(pipe.candidate, q, d, eps1, m, r1, **params.get(pipe.candidate, {})))
                            for _ in range(ctx.two_stage_trials)
                        ]
                    sl = np.concatenate(
                        [c[_mc_slates(name, q[c], d[c], eps - eps1, k, 1, rng, params.get(name, {}))] for c in stage1]
                    )
                    mse[pi, mi, ei, ki], rec[pi, mi, ei, ki] = _slate_metrics(sl, q, gap, thr[k])
    return mse, rec, exact
