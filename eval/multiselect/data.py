"""`recsvc eval-multiselect --artifacts`: the run's configuration, its checks, and each test user's
data (docs/guides/evaluation.md, "Multi-selection on datasets")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from eval.multiselect import theory
from eval.multiselect.theory import check_grids
from eval.study import grid_text
from recsvc.checks import ParamError
from recsvc.settings import Range, setting
from recsvc.staging import check_out

DEFAULT_KS: tuple[int, ...] = (1, 2, 5, 10, 20)
DEFAULT_EPSILONS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULT_TRIALS = 10
DEFAULT_CHUNK = 16  # users per work unit: each holds a few (users × catalog) float arrays


@dataclass(frozen=True)
class DatasetConfig:
    """One `eval-multiselect` run over one or more artifacts' test users. Its settings that
    --theory shares (out, ks, epsilons, seed, force) state both modes' defaults."""

    artifacts: tuple[Path, ...] = setting(
        (),
        flag_default=None,
        nargs="+",
        type=Path,
        unit="dir",
        help="evaluate on these artifacts' test users (built by `recsvc prep`, with a client bundle)",
    )
    out: Path | None = setting(
        None,
        unit="dir",
        help="results directory (default: results/multiselect with --theory, results/multiselect-datasets "
        "with --artifacts)",
    )
    users: int | None = setting(
        None,
        help="--artifacts: only the first N test users of each artifact (default: all)",
        check=Range(1, integer=True, none=True),
    )
    ks: Sequence[int] = setting(
        DEFAULT_KS,
        flag_default=None,
        nargs="+",
        type=int,
        unit="k",
        help=f"numbers of results k (default: {grid_text(theory.DEFAULT_KS)} with --theory, "
        f"{grid_text(DEFAULT_KS)} with --artifacts)",
    )
    epsilons: Sequence[float] = setting(
        DEFAULT_EPSILONS,
        flag_default=None,
        nargs="+",
        type=float,
        unit="eps",
        help=f"ε values (default: {grid_text(theory.DEFAULT_EPSILONS)} with --theory, "
        f"{grid_text(DEFAULT_EPSILONS)} with --artifacts)",
    )
    trials: int = setting(
        DEFAULT_TRIALS,
        help="--artifacts: device signals (and central selections) per user and ε",
        check=Range(1, integer=True),
    )
    seed: int = setting(
        0,
        help="seed; --theory: row i draws from SeedSequence(seed, spawn_key=(i,)); --artifacts: user b from "
        "SeedSequence(seed, spawn_key=(b, …))",
        check=Range(0, integer=True),
    )
    workers: int | None = setting(None, help="--artifacts: worker processes (default: min(2, cores))")
    chunk_size: int = setting(DEFAULT_CHUNK, help="--artifacts: users per work unit", check=Range(1, integer=True))
    progress: bool | None = None
    force: bool = setting(False, help="replace an existing --out directory")


def validate(cfg: DatasetConfig) -> DatasetConfig:
    """The checks that need no data (after the settings'), and ``out`` against each artifact, which
    ``force`` must never replace (eval.study's own check knows no inputs). The grids come back sorted."""
    from recsvc.engines import resolve_workers

    if not cfg.artifacts:
        raise ParamError("{artifacts}: give at least one artifact directory")
    if len({Path(a).resolve() for a in cfg.artifacts}) != len(cfg.artifacts):
        raise ParamError("{artifacts} must be distinct, got {value}", value=" ".join(map(str, cfg.artifacts)))
    ks, epsilons = check_grids(cfg.ks, cfg.epsilons)
    resolve_workers(cfg.workers)
    if cfg.out is not None:
        for a in cfg.artifacts:
            check_out(cfg.out, cfg.force, protect={"artifacts": Path(a)})
    return replace(cfg, artifacts=tuple(Path(a) for a in cfg.artifacts), ks=ks, epsilons=epsilons)


@dataclass(frozen=True)
class UserChunk:
    """Test users [start, start + B) of one artifact, everything the measures need."""

    start: int
    user_ids: np.ndarray  # (B,) str
    raw: np.ndarray  # (B, n) raw full-catalog scores, items.parquet order, seen items included
    seen: np.ndarray  # (B, n) bool: the user's fold-in history
    target: np.ndarray  # (B, n) bool: the user's held-out targets
    embedding: np.ndarray  # (B, d) the history's embedding, clipped to the L1 ball of radius R
    cand_rows: np.ndarray  # (B, m) the top-500 candidates' items.parquet rows, −1 = padding
    cand_scores: np.ndarray  # (B, m) their clipped scores, padding −inf
    cand_sens: np.ndarray  # (B, m) their Δ, padding 1
    cand_count: np.ndarray  # (B,)

    def value(self, b: int) -> np.ndarray:
        """v of user b, the reference of every measure: their raw full-catalog SANSA scores, seen
        items 0 (showing an item the user already has gains nothing)."""
        return np.where(self.seen[b], 0.0, self.raw[b])

    def device_scores(self, b: int) -> np.ndarray:
        """What user b's device re-ranks with: the true scores, seen items −inf."""
        return np.where(self.seen[b], -np.inf, self.raw[b])


class DatasetSource:
    """One artifact's first ``users`` test users, with everything eval-multiselect reads from it
    checked on opening (before anything is written)."""

    def __init__(self, path: Path, users: int | None, ks: Sequence[int]) -> None:
        from recsvc.artifact import load_artifact

        self.artifact = art = load_artifact(path)  # every sha256 verified first
        total = len(art.user_ids)
        if total == 0:
            raise ValueError(f"{path}: the artifact has no test users; expected ≥ 1")
        if not art.has_test_targets:
            raise ValueError(
                f"{path} has no test_targets.parquet (built before it was written); rebuild it with `recsvc prep` "
                "to count hits on the test users' held-out targets"
            )
        self.bundle = art.client_bundle  # ArtifactError when the artifact has no client bundle
        self.population = art.multiselect_population.warm()
        self.total = total if users is None else min(users, total)
        preset = (art.manifest.extra.get("synthetic") or {}).get("preset")
        self.name = f"{art.manifest.dataset}-{preset}" if preset else art.manifest.dataset  # synthetic-ml20m-shape
        if max(ks) > art.items.height:  # k distinct items need a catalog of at least k
            raise ParamError(
                "{ks}: k = {k} is more than the {items} items of {name}; expected k ≤ {items}",
                k=max(ks),
                items=art.items.height,
                name=self.name,
            )
        art.catalog_scores(art.user_ids[:1])  # the model and test_inputs.parquet load, or fail now
        art.test_items(art.user_ids[:1])
        items = art.items
        self.lo, self.hi, self.sens = (items[c].to_numpy().astype(np.float64) for c in ("lo", "hi", "sensitivity"))

    def chunk(self, r: range) -> UserChunk:
        from recsvc.multiselection import clip_l1, embed

        art = self.artifact
        m = art.candidate_matrix(users=len(r), start=r.start)
        raw = art.catalog_scores(m.user_ids)
        inputs, targets = art.test_items(m.user_ids)
        seen = np.zeros(raw.shape, dtype=bool)
        target = np.zeros(raw.shape, dtype=bool)
        for b, (i, t) in enumerate(zip(inputs, targets, strict=True)):
            seen[b, i] = True
            target[b, t] = True
        factors, radius = self.bundle.embedding, self.bundle.radius
        emb = np.stack([clip_l1(embed(i, factors), radius) for i in inputs])
        return UserChunk(r.start, m.user_ids, raw, seen, target, emb, m.item_index, m.clipped(), m.sensitivity, m.count)
