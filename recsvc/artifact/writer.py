"""Writing an artifact directory atomically, on top of :class:`recsvc.staging.StagedDir`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import scipy.sparse as sp

from recsvc.artifact.bundle import write_client_bundle, write_population_sample
from recsvc.artifact.candidates import UserRows, write_candidate_arrays
from recsvc.artifact.format import (
    CANDIDATE_ARRAYS_DIR,
    CANDIDATES,
    CLIENT_DIR,
    FORMAT_VERSION,
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
    json_default,
    sha256_file,
    validate_candidates,
    validate_items,
    validate_policy,
    validate_test_inputs,
)
from recsvc.artifact.manifest import Manifest
from recsvc.model import Model
from recsvc.staging import StagedDir


class ArtifactWriter(StagedDir):
    """Atomic writer: ``with ArtifactWriter(out, force) as w: w.write_items(...); ...; w.commit(manifest)``.

    Nothing appears at ``out`` unless :meth:`commit` succeeds (see :class:`StagedDir`). An
    existing ``out`` is an error unless ``force``; with ``force`` it is replaced only at commit.
    """

    def write_items(self, items: pl.DataFrame) -> None:
        validate_items(items).write_parquet(self.tmp / ITEMS, statistics=False)

    def write_candidates(self, cands: pl.DataFrame) -> None:
        """``candidates.parquet`` and the same candidates as the memory-mappable arrays of
        ``candidates/``, built by the reader's own cut of the table, so both read identically.
        Needs :meth:`write_items` first: the arrays index items.parquet's rows."""
        if not (self.tmp / ITEMS).is_file():
            raise ArtifactError(f"cannot write {CANDIDATES} before {ITEMS}: the candidate arrays index its rows")
        cands = validate_candidates(cands)
        items = pl.read_parquet(self.tmp / ITEMS)
        index = {item: i for i, item in enumerate(items["item_id"].to_list())}
        write_candidate_arrays(self.tmp / CANDIDATE_ARRAYS_DIR, UserRows(cands, items, index, CANDIDATES))
        cands.write_parquet(self.tmp / CANDIDATES, statistics=False)

    def write_test_inputs(self, inputs: pl.DataFrame) -> None:
        """The test users' fold-in input items (user_id, item_id): eval's full-catalog pipelines
        score them with the model (optional; artifacts without it still load)."""
        validate_test_inputs(inputs).write_parquet(self.tmp / TEST_INPUTS, statistics=False)

    def write_test_targets(self, targets: pl.DataFrame) -> None:
        """The test users' held-out target items (user_id, item_id): eval's hit rate (optional)."""
        validate_test_inputs(targets, TEST_TARGETS).write_parquet(self.tmp / TEST_TARGETS, statistics=False)

    def write_model(self, model: Model) -> None:
        """The SANSA model in ``model/`` (read by :attr:`recsvc.artifact.Artifact.model`)."""
        directory = self.tmp / MODEL_DIR
        directory.mkdir()
        sp.save_npz(directory / MODEL_W1, sp.csr_matrix(model.w1), compressed=False)
        sp.save_npz(directory / MODEL_W2, sp.csr_matrix(model.w2), compressed=False)
        pl.DataFrame({"item_id": model.item_ids.astype(str)}).write_parquet(directory / MODEL_ITEMS)

    def write_population(self, population: pl.DataFrame) -> None:
        """The (sampled) sensitivity population's top candidates, in the candidates schema."""
        validate_candidates(population).write_parquet(self.tmp / POPULATION, statistics=False)

    def write_policy(self, policy: pl.DataFrame) -> None:
        validate_policy(policy).write_parquet(self.tmp / POLICY, statistics=False)

    def write_client_bundle(self, item_ids: Any, embedding: Any, radius: float, model: Model, codebook: Any) -> str:
        """``client/`` (docs/reference/client-bundle.md) with the code signal's ``codebook`` (item
        ids); returns the embedding version."""
        return write_client_bundle(self.tmp / CLIENT_DIR, item_ids, embedding, radius, model, codebook)

    def write_multiselect_population(self, embeddings: Any, top_index: Any, top_score: Any, num_items: int) -> None:
        """``multiselect/``: the server's public population sample (clipped embeddings, top-L)."""
        write_population_sample(self.tmp / MULTISELECT_DIR, embeddings, top_index, top_score, num_items)

    def keep(self, source: Path, files: Iterable[str]) -> None:
        """Carries ``files`` (paths relative to the artifact ``source``) over unchanged: hard links
        where the file system allows (no copy of a large model), else copies. Files are never
        modified in place, so sharing inodes with the old directory is safe."""
        for rel in files:
            dst = self.tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source / rel, dst)
            except OSError:
                shutil.copy2(source / rel, dst)

    def commit(self, content: Mapping[str, Any]) -> Path:
        """Writes ``manifest.json`` (``content`` + format version + every file's sha256), checked
        as a :class:`Manifest`, then publishes the directory."""
        tmp = self.tmp
        for required in (ITEMS,) if content.get("kind") == SERVING_KIND else (ITEMS, CANDIDATES):
            if not (tmp / required).is_file():
                raise ArtifactError(f"cannot commit artifact: {required} was not written")
        files = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        # Through JSON once: numpy values become the plain values the file holds.
        data = json.loads(
            json.dumps({"format_version": FORMAT_VERSION, **content, "files": files}, default=json_default)
        )
        manifest = Manifest.from_dict(data, source=f"manifest of {self.out}")
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
        return self.publish()
