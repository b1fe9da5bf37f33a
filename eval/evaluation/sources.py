"""The run's data: an artifact's test users or a synthetic scenario's rows, cut into lazy chunks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.evaluation.config import DEFAULT_LEVEL, SCENARIO_GAMMA, EvalConfig, level_dirname
from recsvc.artifact import load_artifact
from recsvc.mechanisms.random_stopping import GAMMA


@dataclass(frozen=True)
class Chunk:
    """Users [start, start + len) of the run: clipped scores, Δ, real candidate counts."""

    start: int
    user_ids: np.ndarray  # (B,) str
    scores: np.ndarray  # (B, n) clipped; padding −inf
    sensitivities: np.ndarray  # (B, n); padding 1
    count: np.ndarray  # (B,)
    catalog: np.ndarray | None = None  # (B, items) RAW full-catalog scores, only for --pipelines


class ArtifactSource:
    """The first ``users`` candidate users of an artifact."""

    def __init__(self, path: Path, users: int | None, catalog: bool = False) -> None:
        self.artifact = load_artifact(path)  # verifies every sha256 before anything is trusted
        total = len(self.artifact.user_ids)
        if total == 0:
            raise ValueError(f"{path}: the artifact has no candidate users; expected ≥ 1")
        self.total = total if users is None else min(users, total)
        self.name = self.artifact.manifest.dataset
        # rs γ: the manifest's; an artifact that does not record one gets the mechanism's default
        recorded = self.artifact.manifest.default_gamma
        self.default_gamma = GAMMA.default if recorded is None else float(recorded)
        self.catalog = catalog
        if catalog:  # --pipelines: fail now, before anything is written, if the scores cannot be made
            self.artifact.catalog_scores(self.artifact.user_ids[:1])

    def catalog_items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The catalog's (lo, hi, Δ) in items.parquet order."""
        items = self.artifact.items
        lo, hi, sens = (items[c].to_numpy().astype(np.float64) for c in ("lo", "hi", "sensitivity"))
        return lo, hi, sens

    def chunk(self, r: range) -> Chunk:
        m = self.artifact.candidate_matrix(users=len(r), start=r.start)
        full = self.artifact.catalog_scores(m.user_ids) if self.catalog else None
        return Chunk(r.start, m.user_ids, m.clipped(), m.sensitivity, m.count, full)


class ScenarioSource:
    """A synthetic scenario's rows, one synthetic user each; ``proportion``: another share of high
    scores in scenarios 1–3 (Figure 18)."""

    default_gamma = SCENARIO_GAMMA

    def __init__(
        self, name: str, n: int, users: int | None, seed: int, level: float | None, proportion: float | None = None
    ) -> None:
        from eval.scenarios import scenario  # scipy.stats: only when a scenario is evaluated

        level = DEFAULT_LEVEL if level is None else level
        share = 0.5 if proportion is None else proportion  # scenario()'s default, Figure 2's half
        self.sc = scenario(name, n=n, seed=seed, repeats=users, level=level, proportion=share)
        self.total = self.sc.repeats
        self.name = f"scenario-{name}" + (f"-{level_dirname(level)}" if name == "sweep" else "")
        self.name += "" if proportion is None else f"-p{proportion:g}"

    def chunk(self, r: range) -> Chunk:
        q = self.sc.draws[r.start : r.stop]
        ids = np.array([f"{self.sc.name}/{i}" for i in r])
        return Chunk(r.start, ids, q, self.sc.rows_sensitivities(r.start, r.stop), np.full(len(r), q.shape[1]))


Source = ArtifactSource | ScenarioSource


def open_source(cfg: EvalConfig) -> Source:
    """The config's data source; a missing / corrupt artifact or a bad scenario size fails here."""
    if cfg.artifacts is not None:
        return ArtifactSource(Path(cfg.artifacts), cfg.users, catalog=bool(cfg.pipelines))
    return ScenarioSource(str(cfg.scenario), cfg.n, cfg.users, cfg.seed, cfg.level)


class LazyChunks(Sequence):
    """Builds each chunk only when the engine asks for it (engines keep a bounded window)."""

    def __init__(self, source: Source, ranges: list[range]) -> None:
        self.source, self.ranges = source, ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.source.chunk(r) for r in self.ranges[i]]
        return self.source.chunk(self.ranges[i])
