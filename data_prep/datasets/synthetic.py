"""Synthetic implicit-feedback data with power-law item popularity and user activity.

For scale and speed work, not accuracy claims. Items fall into latent clusters and each user
draws most of their items from one cluster (popularity-weighted), so SANSA has structure to
learn; the rest come from global popularity. Everything is vectorised and seeded.

Users are generated in fixed blocks of ``BLOCK_USERS``, each from its own seeded stream and a
few shared tables (:class:`Sampler`), so a block is a pure function of (config, seed, block):
memory is one block at a time and blocks could be generated anywhere. The data depend only on
the config and the seed, never on how many blocks are held at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import scipy.sparse as sp

from data_prep.datasets.base import Interactions
from recsvc.checks import ParamError


@dataclass(frozen=True)
class SyntheticConfig:
    users: int
    items: int
    interactions: int  # drawn with replacement; duplicates that top-up rounds cannot replace are dropped
    test_users: int
    val_users: int
    item_exponent: float = 1.0  # popularity ∝ rank^-exponent
    user_exponent: float = 1.5  # Pareto shape of user activity
    clusters: int = 50
    in_cluster: float = 0.7  # share of a user's items drawn from their own cluster
    min_per_user: int = 5
    # The real dataset whose SANSA settings and γ a run on this preset uses (None: synthetic's own).
    paper: str | None = None


PRESETS: dict[str, SyntheticConfig] = {
    # The paper's largest experiment: Netflix Prize's sizes, hold-outs, SANSA settings and γ.
    "netflix-shape": SyntheticConfig(480_189, 17_770, 100_000_000, 40_000, 40_000, paper="netflix"),
    "ml20m-shape": SyntheticConfig(136_677, 20_720, 11_500_000, 10_000, 10_000),
    "small": SyntheticConfig(5_000, 2_000, 250_000, 500, 500, clusters=20),
    "tiny": SyntheticConfig(400, 150, 12_000, 60, 60, clusters=5),
}


def config_for(preset: str, users: int | None, items: int | None, interactions: int | None) -> SyntheticConfig:
    """The preset's sizes, overridden by the sizes that are given (None: the preset's; 0 is an error)."""
    if preset not in PRESETS:
        raise ParamError(
            "unknown synthetic preset {name}; expected {preset} one of {names}",
            name=repr(preset),
            names=", ".join(PRESETS),
        )
    for param, value in (("users", users), ("items", items), ("interactions", interactions)):
        if value is not None and value < 1:  # `value or default` would turn 0 into the default silently
            raise ParamError(f"{{{param}}} must be ≥ 1, got {{value}}", value=value)
    base = PRESETS[preset]
    cfg = replace(
        base,
        users=base.users if users is None else users,
        items=base.items if items is None else items,
        interactions=base.interactions if interactions is None else interactions,
    )
    if cfg.items < 4 * cfg.min_per_user:
        raise ParamError(
            "synthetic data needs {items} ≥ {least}, got {value}", least=4 * cfg.min_per_user, value=cfg.items
        )
    if cfg.interactions < cfg.users * cfg.min_per_user:
        raise ParamError(
            "synthetic sizes {users} {n_users} {interactions} {n_interactions} are unusable; "
            "expected {interactions} ≥ {per_user} × {users} = {least}",
            n_users=cfg.users,
            n_interactions=cfg.interactions,
            per_user=cfg.min_per_user,
            least=cfg.min_per_user * cfg.users,
        )
    return cfg


BLOCK_USERS = 8192  # part of the data's definition: changing it changes the data
_TOP_UP_ROUNDS = 3


def _activity(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """Per-user interaction counts: Pareto-tailed, ≥ min_per_user, capped at half the catalogue."""
    raw = rng.pareto(cfg.user_exponent, cfg.users) + 1.0
    extra = cfg.interactions - cfg.min_per_user * cfg.users
    counts = cfg.min_per_user + np.floor(raw / raw.sum() * extra).astype(np.int64)
    return np.minimum(counts, cfg.items // 2)


@dataclass(frozen=True)
class Sampler:
    """The tables every block shares: item popularity CDFs by cluster and overall, each user's
    home cluster and interaction count (O(users + items) memory)."""

    cfg: SyntheticConfig
    seed: int
    order: np.ndarray  # items grouped by cluster
    cdf_grouped: np.ndarray
    bounds: np.ndarray  # cluster c is the CDF segment [bounds[c], bounds[c+1])
    cdf_global: np.ndarray
    counts: np.ndarray  # per user
    user_home: np.ndarray  # per user

    @classmethod
    def create(cls, cfg: SyntheticConfig, seed: int) -> Sampler:
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5E17,)))
        pop = 1.0 / np.arange(1, cfg.items + 1) ** cfg.item_exponent
        pop = pop[rng.permutation(cfg.items)]
        cluster = rng.integers(0, cfg.clusters, cfg.items)
        order = np.argsort(cluster, kind="stable")
        cdf_grouped = np.cumsum(pop[order]) / pop.sum()
        starts = np.searchsorted(cluster[order], np.arange(cfg.clusters + 1), side="left")
        bounds = np.concatenate([[0.0], cdf_grouped])[starts]
        counts = _activity(cfg, rng)
        user_home = rng.integers(0, cfg.clusters, cfg.users)
        return cls(cfg, seed, order, cdf_grouped, bounds, np.cumsum(pop) / pop.sum(), counts, user_home)

    @property
    def blocks(self) -> int:
        return -(-self.cfg.users // BLOCK_USERS)

    def _draw(self, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One item per entry of ``users`` by inverse-CDF sampling: inside the user's cluster
        segment (share ``in_cluster``) or over all items."""
        n_items = self.cfg.items
        home = self.user_home[users]
        u = rng.random(users.size)
        own = rng.random(users.size) < self.cfg.in_cluster
        lo, hi = self.bounds[home], self.bounds[home + 1]
        own &= hi > lo
        pos_own = np.searchsorted(self.cdf_grouped, lo + u * (hi - lo), side="right")
        pos_glob = np.searchsorted(self.cdf_global, u, side="right")
        return np.where(own, self.order[np.minimum(pos_own, n_items - 1)], np.minimum(pos_glob, n_items - 1))

    def block(self, b: int) -> sp.csr_matrix:
        """Block ``b``'s users (rows ``b·BLOCK_USERS …``) × items, binary float32, sorted int32 indices.

        Sampling with replacement, then top-up rounds for the users that lost duplicates; each
        user keeps their first ``count`` distinct items in draw order."""
        first = b * BLOCK_USERS
        counts = self.counts[first : first + BLOCK_USERS]
        n, n_items = counts.size, self.cfg.items
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(0x5E17, 1, b)))
        keys = np.zeros(0, dtype=np.int64)  # local_user · items + item, grouped by user in draw order
        deficit = counts
        for _ in range(_TOP_UP_ROUNDS):
            need = np.flatnonzero(deficit > 0)
            if need.size == 0:
                break
            local = np.repeat(need, deficit[need] + deficit[need] // 2 + 1)
            fresh = local * n_items + self._draw(local + first, rng)
            keys = _first_per_user(np.concatenate([keys, fresh]), counts, n_items)
            deficit = counts - np.bincount(keys // n_items, minlength=n)
        keys.sort()
        rows = keys // n_items
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        cols = (keys - rows * n_items).astype(np.int32)
        return sp.csr_matrix((np.ones(cols.size, np.float32), cols, indptr.astype(np.int32)), shape=(n, n_items))

    def iter_blocks(self) -> Iterator[sp.csr_matrix]:
        for b in range(self.blocks):
            yield self.block(b)


def _first_per_user(keys: np.ndarray, limit: np.ndarray, n_items: int) -> np.ndarray:
    """The distinct keys in first-occurrence order, at most ``limit[user]`` per user."""
    _, first = np.unique(keys, return_index=True)
    first.sort()
    keys = keys[first]
    users = keys // n_items
    by_user = np.argsort(users, kind="stable")  # keeps draw order within a user
    starts = np.concatenate([[0], np.cumsum(np.bincount(users, minlength=limit.size))])
    rank = np.empty(keys.size, dtype=np.int64)
    rank[by_user] = np.arange(keys.size) - starts[users[by_user]]
    return keys[by_user][rank[by_user] < limit[users[by_user]]]


def generate_matrix(cfg: SyntheticConfig, seed: int) -> sp.csr_matrix:
    """All users × items (ids are the row and column numbers), streamed block by block."""
    sampler = Sampler.create(cfg, seed)
    per_user: list[np.ndarray] = []
    indices: list[np.ndarray] = []
    for block in sampler.iter_blocks():  # keeps only each block's int32 indices
        per_user.append(np.diff(block.indptr))
        indices.append(block.indices)
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(per_user))])
    cols = np.concatenate(indices)
    del indices
    return sp.csr_matrix(
        (np.ones(cols.size, np.float32), cols, indptr.astype(np.int32 if cols.size < 2**31 else np.int64)),
        shape=(cfg.users, cfg.items),
    )


def generate(cfg: SyntheticConfig, seed: int) -> Interactions:
    """The same data as :func:`generate_matrix` as a table of string ids (small data, tests)."""
    x = generate_matrix(cfg, seed).tocoo()
    df = pl.DataFrame(
        {
            "user": x.row.astype(np.int64),
            "item": x.col.astype(np.int64),
        }
    ).select(
        pl.col("user").cast(pl.String),
        pl.col("item").cast(pl.String),
        pl.lit(5.0).alias("rating"),  # explicit "liked" ratings, so the ≥ 4 filter keeps them
    )
    return Interactions(df, source=source(cfg, seed))


def source(cfg: SyntheticConfig, seed: int) -> str:
    return f"synthetic(users={cfg.users}, items={cfg.items}, interactions={cfg.interactions}, seed={seed})"
