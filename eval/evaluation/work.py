"""The work unit: every metric for one chunk of users, a pure function of (chunk, context).

User b's randomness is ``SeedSequence(seed, spawn_key=(b,))`` with b the GLOBAL user index, so
results do not depend on the chunk size or on the engine (local processes or Dask).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from eval import metrics
from eval.evaluation.config import EvalConfig, mechanism_params
from eval.evaluation.pipelines import PipelineContext, evaluate_user, parse_pipeline
from eval.evaluation.sources import Chunk
from recsvc.mechanisms import MECHANISMS, probabilities, select_batch
from recsvc.policy import AUTO
from recsvc.stats import spearman_rows


@dataclass(frozen=True)
class ChunkContext:
    mechanisms: tuple[str, ...]
    epsilons: tuple[float, ...]
    trials: int
    seed: int
    exact: frozenset[str]  # mechanisms evaluated from exact probabilities (--exact and available)
    params: dict[str, dict[str, float]]  # per mechanism
    pipelines: PipelineContext | None = None  # --pipelines (eval.evaluation.pipelines)
    auto: Mapping[float, str] = field(default_factory=dict)  # ε → what `auto` runs there (eval.evaluation.auto)


@dataclass
class ChunkResult:
    start: int
    user_ids: np.ndarray
    count: np.ndarray
    spearman: np.ndarray  # (B,)
    weighted: np.ndarray  # (B,)
    mse: np.ndarray  # (B, M, E)
    mean_selected: np.ndarray  # (B, M, E)
    exact: np.ndarray  # (M,) bool: exact probabilities were used
    pipelines: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (first_mse, recall, exact), (B, P, M, E, K)


def make_context(
    cfg: EvalConfig,
    mechanisms: tuple[str, ...],
    catalog: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    auto: Mapping[float, str] | None = None,
) -> ChunkContext:
    """What every chunk of the run shares; exact probabilities only where the mechanism has them.
    ``catalog``: the items' (lo, hi, Δ), needed by --pipelines. ``auto`` (ε → mechanism) is what
    the ``auto`` row runs at each ε."""
    real = [m for m in mechanisms if m != AUTO] + sorted(set((auto or {}).values()))
    params = {m: mechanism_params(cfg, m) for m in real}
    exact = frozenset(m for m in real if MECHANISMS[m].exact) if cfg.exact else frozenset()
    pipes = None
    if cfg.pipelines and catalog is not None:
        pipes = PipelineContext(
            tuple(parse_pipeline(p) for p in cfg.pipelines),
            tuple(int(k) for k in cfg.slate_k),
            int(cfg.two_stage_m),
            int(cfg.trials),
            int(cfg.trials if cfg.two_stage_trials is None else cfg.two_stage_trials),
            bool(cfg.exact),
            *catalog,
        )
    return ChunkContext(
        mechanisms,
        tuple(float(e) for e in cfg.epsilons),
        int(cfg.trials),
        int(cfg.seed),
        exact,
        params,
        pipes,
        dict(auto or {}),
    )


def evaluate_chunk(chunk: Chunk, ctx: ChunkContext) -> ChunkResult:
    """Every metric for one chunk of users. Pure: depends only on (chunk, ctx)."""
    q, sens, count = chunk.scores, chunk.sensitivities, chunk.count
    B, M, E = q.shape[0], len(ctx.mechanisms), len(ctx.epsilons)
    mse = np.empty((B, M, E))
    mean_sel = np.empty((B, M, E))
    exact_used = np.zeros(M, dtype=bool)
    # Users with equal candidate counts form runs; each run is one batched call on unpadded arrays.
    bounds = np.flatnonzero(np.diff(count)) + 1
    runs = np.split(np.arange(B), bounds)
    for mi, mech in enumerate(ctx.mechanisms):
        ran = [ctx.auto[e] for e in ctx.epsilons] if mech == AUTO else [mech]
        exact_used[mi] = all(m in ctx.exact for m in ran)
        for ei, eps in enumerate(ctx.epsilons):
            name = ctx.auto[eps] if mech == AUTO else mech
            if mech == AUTO and name in ctx.mechanisms[:mi]:  # the same stream: copy, not recompute
                done = ctx.mechanisms.index(name)
                mse[:, mi, ei], mean_sel[:, mi, ei] = mse[:, done, ei], mean_sel[:, done, ei]
                continue
            params = ctx.params.get(name, {})
            use_exact = name in ctx.exact
            for run in runs:
                if len(run) == 0:
                    continue
                c = int(count[run[0]])
                qr, sr = q[run, :c], np.ascontiguousarray(sens[run, :c])
                if use_exact:
                    for row, b in enumerate(run):
                        p = probabilities(name, qr[row], sr[row], eps, **params)
                        mse[b, mi, ei], mean_sel[b, mi, ei] = metrics.expected_stats(qr[row], p)
                else:  # each user's GLOBAL stream; a non-private mechanism only when named (reference-only)
                    at, ref = chunk.start + int(run[0]), not MECHANISMS[name].private
                    sel = select_batch(
                        name, qr, sr, eps, ctx.trials, ctx.seed, user_offset=at, allow_non_private=ref, **params
                    )
                    mse[run, mi, ei], mean_sel[run, mi, ei] = metrics.selected_stats(qr, np.asarray(sel))
    pipes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    if ctx.pipelines is not None and chunk.catalog is not None:
        per_user = [
            evaluate_user(
                chunk.catalog[b], chunk.start + b, ctx.seed, ctx.mechanisms, ctx.epsilons, ctx.params, ctx.pipelines
            )
            for b in range(B)
        ]
        first_mse, recall, exact = (np.stack([u[i] for u in per_user]) for i in range(3))
        pipes = (first_mse, recall, exact)
    return ChunkResult(
        chunk.start,
        chunk.user_ids,
        count,
        spearman_rows(q, sens, count),
        metrics.weighted_correlation(q, sens, count),
        mse,
        mean_sel,
        exact_used,
        pipes,
    )
