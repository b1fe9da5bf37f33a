"""The artifact directory's format (docs/reference/specification.md §4): file names, column schemas and their
invariants.

Layout of ``artifacts/<dataset>/``::

    manifest.json        dataset, seeds, split sizes, SANSA config, versions, accuracy,
                         population Spearman statistics, sha256 of every other file
    items.parquet        item_id (str), lo, hi, sensitivity           -- public per-item data
    candidates.parquet   user_id (str), rank, item_id (str), score    -- raw, unclipped
    candidates/          user_ids.npy, item_index.npy, scores.npy: candidates.parquet as
                         memory-mappable users × rank arrays (recsvc.artifact.candidates)  -- optional
    model/W1.npz, model/W2.npz, model/items.parquet (item_id in column order)
    population.parquet   as candidates.parquet, for the (sampled) sensitivity population: the
                         public data the `auto` policy table is computed from  -- optional
    policy.parquet       epsilon, k, mechanism, expected_mse, rank, method  -- optional (`auto`)
    test_inputs.parquet  user_id (str), item_id (str)                 -- optional: the test users'
                         fold-in input items, so eval can score them over the full catalog
    test_targets.parquet user_id (str), item_id (str)                 -- optional: the test users'
                         held-out target items (eval's hit rate)
    client/              multi-selection's client bundle (docs/reference/client-bundle.md)  -- optional
    multiselect/         embeddings.npy, top_index.npy, top_score.npy: the server's population
                         sample for MultiSelect (recsvc.artifact.bundle)  -- optional, with client/

A **serving bundle** (manifest ``kind`` = ``"serving"``, written by :mod:`recsvc.artifact.serving`)
holds only what ``recsvc serve`` reads, none of it per user: ``items.parquet``, ``model/``,
``policy.parquet``, and multi-selection's ``client/`` and ``multiselect/`` when they exist.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

MANIFEST = "manifest.json"
ITEMS = "items.parquet"
CANDIDATES = "candidates.parquet"
CANDIDATE_ARRAYS_DIR = "candidates"  # candidates.parquet as memory-mappable arrays (recsvc.artifact.candidates)
CANDIDATE_USER_IDS = "user_ids.npy"
CANDIDATE_ITEM_INDEX = "item_index.npy"
CANDIDATE_SCORES = "scores.npy"
CANDIDATE_ARRAY_FILES = tuple(
    f"{CANDIDATE_ARRAYS_DIR}/{f}" for f in (CANDIDATE_USER_IDS, CANDIDATE_ITEM_INDEX, CANDIDATE_SCORES)
)
POPULATION = "population.parquet"
POLICY = "policy.parquet"
MODEL_DIR = "model"
MODEL_W1 = "W1.npz"
MODEL_W2 = "W2.npz"
MODEL_ITEMS = "items.parquet"
TEST_INPUTS = "test_inputs.parquet"
CLIENT_DIR = "client"  # multi-selection's client bundle (recsvc.artifact.bundle)
MULTISELECT_DIR = "multiselect"  # multi-selection's population for the server (recsvc.artifact.bundle)
TEST_TARGETS = "test_targets.parquet"
FORMAT_VERSION = 1
SERVING_KIND = "serving"  # manifest kind of a serving bundle; a full artifact has no kind
MIN_SENSITIVITY = 1e-6

ITEMS_SCHEMA = {"item_id": pl.String, "lo": pl.Float64, "hi": pl.Float64, "sensitivity": pl.Float64}
CANDIDATES_SCHEMA = {"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String, "score": pl.Float64}
POLICY_SCHEMA = {
    "epsilon": pl.Float64,
    "k": pl.Int32,
    "mechanism": pl.String,
    "expected_mse": pl.Float64,
    "rank": pl.Int32,
    "method": pl.String,
}
TEST_INPUTS_SCHEMA = {"user_id": pl.String, "item_id": pl.String}


class ArtifactError(ValueError):
    """An artifact directory is missing, incomplete or corrupt, or its content is invalid."""


def is_serving_file(rel: str) -> bool:
    """Whether the artifact file ``rel`` (relative, POSIX) belongs in the serving bundle: the
    public files ``recsvc serve`` reads. Everything else is per-user evaluation data."""
    top = rel.split("/", 1)[0]
    return rel in (ITEMS, POLICY) or top in (MODEL_DIR, CLIENT_DIR, MULTISELECT_DIR)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_schema(df: pl.DataFrame, schema: dict[str, Any], what: str) -> pl.DataFrame:
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise ArtifactError(f"{what}: missing columns {missing}; expected columns {list(schema)}")
    try:
        return df.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
    except Exception as exc:  # polars raises several exception types for bad casts
        raise ArtifactError(f"{what}: columns do not match the expected types {schema}: {exc}") from exc


def validate_items(items: pl.DataFrame) -> pl.DataFrame:
    """Checks the invariants every consumer relies on: unique ids, finite lo ≤ hi, Δ = max(hi−lo, 1e-6)."""
    items = _check_schema(items, ITEMS_SCHEMA, ITEMS)
    if items.height == 0:
        raise ArtifactError(f"{ITEMS}: no items")
    if items["item_id"].null_count() or items["item_id"].n_unique() != items.height:
        raise ArtifactError(f"{ITEMS}: item_id must be unique and non-null")
    lo, hi, sens = (items[c].to_numpy() for c in ("lo", "hi", "sensitivity"))
    if not (np.isfinite(lo).all() and np.isfinite(hi).all() and np.isfinite(sens).all()):
        raise ArtifactError(f"{ITEMS}: lo, hi and sensitivity must be finite")
    if (hi < lo).any():
        raise ArtifactError(f"{ITEMS}: hi < lo for {int((hi < lo).sum())} items; expected lo ≤ hi")
    if not np.allclose(sens, np.maximum(hi - lo, MIN_SENSITIVITY), rtol=0, atol=1e-12):
        raise ArtifactError(f"{ITEMS}: sensitivity must equal max(hi - lo, {MIN_SENSITIVITY})")
    return items


def validate_candidates(cands: pl.DataFrame) -> pl.DataFrame:
    cands = _check_schema(cands, CANDIDATES_SCHEMA, CANDIDATES)
    if not np.isfinite(cands["score"].to_numpy()).all():
        raise ArtifactError(f"{CANDIDATES}: scores must be finite")
    return cands


def validate_policy(policy: pl.DataFrame) -> pl.DataFrame:
    """The policy table's invariants: a non-empty grid of finite ε > 0 and k ≥ 1, one row per
    (ε, k, mechanism), finite expected MSE ≥ 0, ranks 1..m within each (ε, k). The mechanism
    names are checked by :class:`recsvc.policy.PolicyTable` (it knows the registry)."""
    policy = _check_schema(policy, POLICY_SCHEMA, POLICY)
    if policy.height == 0:
        raise ArtifactError(f"{POLICY}: the grid is empty; expected at least one (epsilon, k, mechanism) row")
    if policy.null_count().sum_horizontal().item():
        raise ArtifactError(f"{POLICY}: null values; expected every cell set")
    eps, k, mse = (policy[c].to_numpy() for c in ("epsilon", "k", "expected_mse"))
    if not (np.isfinite(eps).all() and (eps > 0).all() and (k >= 1).all()):
        raise ArtifactError(f"{POLICY}: epsilon must be finite and > 0 and k ≥ 1")
    if not (np.isfinite(mse).all() and (mse >= 0).all()):
        raise ArtifactError(f"{POLICY}: expected_mse must be finite and ≥ 0")
    if policy.select("epsilon", "k", "mechanism").is_duplicated().any():
        raise ArtifactError(f"{POLICY}: (epsilon, k, mechanism) must be unique")
    groups = policy.group_by("epsilon", "k").agg(pl.col("rank").sort(), pl.len())
    if not all(list(r) == list(range(1, n + 1)) for r, n in groups.select("rank", "len").iter_rows()):
        raise ArtifactError(f"{POLICY}: ranks must be 1..m within each (epsilon, k)")
    return policy


def validate_test_inputs(inputs: pl.DataFrame, what: str = TEST_INPUTS) -> pl.DataFrame:
    """``test_inputs.parquet`` or ``test_targets.parquet`` (``what``): (user_id, item_id), non-null."""
    inputs = _check_schema(inputs, TEST_INPUTS_SCHEMA, what)
    if inputs["user_id"].null_count() or inputs["item_id"].null_count():
        raise ArtifactError(f"{what}: user_id and item_id must be non-null")
    return inputs


def json_default(o: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays as Python values, paths as strings."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
