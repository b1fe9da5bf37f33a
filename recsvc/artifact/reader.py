"""Reading an artifact directory: :func:`load_artifact` verifies every file's sha256 before
anything is trusted, then serves the items, the candidates (as rectangular arrays) and the model."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from recsvc.artifact.bundle import (
    BUNDLE_MANIFEST,
    ClientBundle,
    read_client_bundle,
    read_population_sample,
)
from recsvc.artifact.candidates import CandidateMatrix, CandidateRows, MappedRows, UserRows
from recsvc.artifact.format import (
    CANDIDATE_ARRAY_FILES,
    CANDIDATE_ARRAYS_DIR,
    CANDIDATES,
    CLIENT_DIR,
    ITEMS,
    MANIFEST,
    MODEL_DIR,
    MODEL_ITEMS,
    MODEL_W1,
    MODEL_W2,
    MULTISELECT_DIR,
    POLICY,
    POPULATION,
    SERVING_KIND,
    TEST_INPUTS,
    TEST_TARGETS,
    ArtifactError,
    sha256_file,
    validate_candidates,
    validate_items,
    validate_policy,
    validate_test_inputs,
)
from recsvc.artifact.manifest import Manifest
from recsvc.model import Model
from recsvc.multiselection import Population


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Manifest
    items: pl.DataFrame

    @cached_property
    def item_index(self) -> dict[str, int]:
        return {item: i for i, item in enumerate(self.items["item_id"].to_list())}

    @property
    def is_serving_bundle(self) -> bool:
        return self.manifest.kind == SERVING_KIND

    def _require_full(self, what: str) -> None:
        if self.is_serving_bundle:
            raise ArtifactError(
                f"{self.path} is a serving bundle: it holds no {what} (per-user evaluation data); "
                "expected the full artifact that `recsvc prep` wrote"
            )

    @cached_property
    def candidates(self) -> pl.DataFrame:
        self._require_full(f"{CANDIDATES} (the test users' candidates)")
        return validate_candidates(pl.read_parquet(self.path / CANDIDATES))

    @property
    def has_model(self) -> bool:
        return f"{MODEL_DIR}/{MODEL_W1}" in self.manifest.files

    @cached_property
    def model(self) -> Model:
        """The SANSA model saved by :meth:`recsvc.artifact.ArtifactWriter.write_model`."""
        directory = self.path / MODEL_DIR
        item_ids = pl.read_parquet(directory / MODEL_ITEMS)["item_id"].to_numpy().astype(str)
        w1 = sp.load_npz(directory / MODEL_W1).tocsr()
        w2 = sp.load_npz(directory / MODEL_W2).tocsr()
        if w1.shape[0] != len(item_ids) or w2.shape[1] != len(item_ids) or w1.shape[1] != w2.shape[0]:
            raise ArtifactError(
                f"{directory}: model shapes W1 {w1.shape}, W2 {w2.shape} do not match {len(item_ids)} items"
            )
        return Model(w1=w1, w2=w2, item_ids=item_ids)

    def _require(self, name: str) -> None:
        self._require_full(f"{name} (the test users' items)")
        if name not in self.manifest.files:
            raise ArtifactError(
                f"{self.path} has no {name} (built before it was written); "
                "rebuild it with `recsvc prep` to evaluate its test users over the full catalog"
            )

    def _user_items(self, name: str, index: dict[str, int], into: str) -> dict[str, np.ndarray]:
        """user_id → the distinct ``index`` positions of that user's items in the file ``name``."""
        self._require(name)
        df = validate_test_inputs(pl.read_parquet(self.path / name), name)
        try:
            cols = np.fromiter((index[i] for i in df["item_id"].to_list()), np.int64, df.height)
        except KeyError as exc:
            raise ArtifactError(f"{name}: item_id {exc.args[0]!r} is not in {into}") from None
        users = df["user_id"].to_numpy().astype(str)
        order = np.argsort(users, kind="stable")
        users, cols = users[order], cols[order]
        cuts = np.flatnonzero(users[1:] != users[:-1]) + 1
        return {
            str(u[0]): np.unique(c) for u, c in zip(np.split(users, cuts), np.split(cols, cuts), strict=True) if len(u)
        }

    @cached_property
    def _test_inputs(self) -> dict[str, np.ndarray]:
        """user_id → the model columns of that test user's fold-in input items."""
        self._require(TEST_INPUTS)  # before the model is loaded
        return self._user_items(TEST_INPUTS, self.model.index, "the model")

    @property
    def has_test_targets(self) -> bool:
        return TEST_TARGETS in self.manifest.files

    @cached_property
    def _test_item_rows(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return (
            self._user_items(TEST_INPUTS, self.item_index, ITEMS),
            self._user_items(TEST_TARGETS, self.item_index, ITEMS),
        )

    def test_items(self, user_ids: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each test user's fold-in inputs and held-out targets, as sorted items.parquet rows
        (an empty array for a user without any)."""
        inputs, targets = self._test_item_rows
        none = np.zeros(0, np.int64)
        ids = np.asarray(user_ids).astype(str).tolist()
        return [inputs.get(u, none) for u in ids], [targets.get(u, none) for u in ids]

    def catalog_scores(self, user_ids: np.ndarray) -> np.ndarray:
        """RAW SANSA scores (users × every items.parquet row) of these test users from their stored
        fold-in inputs, seen items included, as the service's Recommend scores a history (an item
        the model has no column for scores 0). Clip with the items' lo/hi before selecting."""
        inputs, model = self._test_inputs, self.model
        col = np.array([model.index.get(i, -1) for i in self.items["item_id"].to_list()], np.int64)
        out = np.empty((len(user_ids), self.items.height))
        for b, u in enumerate(np.asarray(user_ids).astype(str).tolist()):
            dense = model.score_one(inputs.get(u, np.zeros(0, np.int64)))
            out[b] = np.where(col >= 0, dense[np.maximum(col, 0)], 0.0)
        return out

    @property
    def has_candidate_arrays(self) -> bool:
        """Whether ``candidates/`` holds the memory-mappable arrays (artifacts written before them
        have only candidates.parquet, and are read from it)."""
        return all(f in self.manifest.files for f in CANDIDATE_ARRAY_FILES)

    @cached_property
    def _candidate_rows(self) -> CandidateRows:
        if self.has_candidate_arrays:
            self._require_full(f"{CANDIDATE_ARRAYS_DIR}/ (the test users' candidates)")
            return MappedRows(self.path / CANDIDATE_ARRAYS_DIR, self.items)
        return UserRows(self.candidates, self.items, self.item_index, CANDIDATES)

    @property
    def user_ids(self) -> np.ndarray:
        """Every test user, in artifact order (the order of :meth:`candidate_matrix` rows)."""
        return self._candidate_rows.user_ids

    def candidate_matrix(self, users: int | None = None, start: int = 0) -> CandidateMatrix:
        """``users`` test users from position ``start`` (all remaining if None), in artifact order.

        Only that slice is materialised, so callers can walk the users in bounded-memory chunks.
        """
        return self._candidate_rows.matrix(users, start)

    @property
    def has_population(self) -> bool:
        return POPULATION in self.manifest.files

    def population_matrix(self) -> CandidateMatrix:
        """The (sampled) sensitivity population's top candidates, raw (public data: the policy
        table's input). ArtifactError for an artifact written without them."""
        self._require_full(f"{POPULATION} (the population's scores)")
        if not self.has_population:
            raise ArtifactError(
                f"{self.path} has no {POPULATION} (written before the `auto` policy table "
                "existed); rebuild the artifact with `recsvc prep`"
            )
        frame = validate_candidates(pl.read_parquet(self.path / POPULATION))
        return UserRows(frame, self.items, self.item_index, POPULATION).matrix()

    @cached_property
    def policy(self) -> pl.DataFrame | None:
        """``policy.parquet`` checked by :func:`validate_policy`; None when the artifact has none."""
        if POLICY not in self.manifest.files:
            return None
        try:
            return validate_policy(pl.read_parquet(self.path / POLICY))
        except ArtifactError as exc:
            raise ArtifactError(f"{self.path}: {exc}") from None

    @property
    def has_client_bundle(self) -> bool:
        return f"{CLIENT_DIR}/{BUNDLE_MANIFEST}" in self.manifest.files and self.manifest.multiselect is not None

    def _multiselect_missing(self) -> ArtifactError:
        return ArtifactError(
            f"{self.path} has no client bundle ({CLIENT_DIR}/) or multi-selection population ({MULTISELECT_DIR}/); "
            "rebuild it with `recsvc prep`"
        )

    @cached_property
    def client_bundle(self) -> ClientBundle:
        """:meth:`read_client_bundle`, read once."""
        return self.read_client_bundle()

    def read_client_bundle(self) -> ClientBundle:
        """``client/`` checked (docs/reference/client-bundle.md), with the manifest's multiselect
        section and items.parquet's item order; ArtifactError if absent or inconsistent. Not
        cached: a server keeps only what it serves from, not W1/W2, the model's second copy."""
        info = self.manifest.multiselect
        if not self.has_client_bundle or info is None:
            raise self._multiselect_missing()
        bundle = read_client_bundle(self.path / CLIENT_DIR)
        if (bundle.version, bundle.dim, bundle.radius) != (info.embedding_version, info.dim, float(info.radius)):
            raise ArtifactError(
                f"{self.path / CLIENT_DIR / BUNDLE_MANIFEST}: version, dim or radius differ from "
                f"{self.path / MANIFEST}'s multiselect section; expected the same embedding"
            )
        if bundle.item_ids.tolist() != self.items["item_id"].to_list():
            raise ArtifactError(
                f"{self.path / CLIENT_DIR}: item_ids.json differs from {ITEMS}'s item order; expected the same items"
            )
        return bundle

    @cached_property
    def multiselect_population(self) -> Population:
        """The server's population sample (``multiselect/``) over items.parquet's items, of the
        manifest's dimension, every embedding within its L1 radius."""
        info = self.manifest.multiselect
        if not self.has_client_bundle or info is None:
            raise self._multiselect_missing()
        pop = read_population_sample(self.path / MULTISELECT_DIR, self.items.height)
        if pop.dim != info.dim:
            raise ArtifactError(
                f"{self.path / MULTISELECT_DIR}: embeddings of dimension {pop.dim}; expected {info.dim}"
            )
        if np.abs(pop.embeddings).sum(axis=1).max() > float(info.radius) * (1 + 1e-9):
            raise ArtifactError(
                f"{self.path / MULTISELECT_DIR}: an embedding lies outside the L1 radius {info.radius}; "
                "expected clipped embeddings"
            )
        return pop


def read_manifest(path: Path) -> Manifest:
    """The typed manifest of the artifact directory ``path`` (no checksums verified)."""
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{mpath} is missing; {path} is not a complete artifact directory")
    try:
        data = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{mpath} is not valid JSON: {exc}") from exc
    return Manifest.from_dict(data, source=str(mpath))


def load_artifact(path: str | os.PathLike[str], verify: bool = True) -> Artifact:
    """Opens an artifact directory; with ``verify`` every file's sha256 is checked first."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"artifact directory {path} does not exist; build it with `recsvc prep`")
    manifest = read_manifest(path)
    for rel in (ITEMS,) if manifest.kind == SERVING_KIND else (ITEMS, CANDIDATES):
        if rel not in manifest.files:
            raise ArtifactError(f"{path / MANIFEST} does not list {rel}")
    if verify:
        for rel, digest in manifest.files.items():
            f = path / rel
            if not f.is_file():
                raise ArtifactError(f"{f} is missing (listed in the manifest)")
            actual = sha256_file(f)
            if actual != digest:
                raise ArtifactError(
                    f"{f} is corrupt: sha256 {actual[:12]}… does not match the manifest's {digest[:12]}…"
                )
    items = validate_items(pl.read_parquet(path / ITEMS))
    return Artifact(path=path, manifest=manifest, items=items)
