"""Multi-selection's public files in an artifact: the client bundle a device downloads
(docs/reference/client-bundle.md) and the population sample the server answers from
(docs/reference/artifact-format.md).

``client/``: ``manifest.json`` (format, version, d, R, n, each file's sha256), ``item_ids.json``,
``embedding.npy`` and SANSA's W1/W2 as CSR ``.npy`` triples. ``multiselect/``: the sampled
training users' clipped embeddings (P × d) and their top-L unseen items with SANSA scores.
Everything here is read with ``allow_pickle=False`` and checked (dtype, shape, digest); a bad file
is an :class:`ArtifactError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from recsvc.artifact.format import ArtifactError, sha256_file
from recsvc.checks import ParamError
from recsvc.model import Model
from recsvc.multiselection import Lattice, Population, check_radius, codebook_bytes, codebook_version, embedding_version

BUNDLE_MANIFEST = "manifest.json"
BUNDLE_FORMAT = "recsvc-client-bundle"
BUNDLE_FORMAT_VERSION = 3  # 3: the code signal's codebook (codebook.json, code_size, codebook_version)
SIGNAL_CODE = "code"  # the signal a bundle's devices send by default
ITEM_IDS = "item_ids.json"
CODEBOOK = "codebook.json"
EMBEDDING = "embedding.npy"
CSR_PARTS: dict[str, np.dtype[Any]] = {"indptr": np.dtype("<i8"), "indices": np.dtype("<i4"), "data": np.dtype("<f8")}

POP_EMBEDDINGS = "embeddings.npy"
POP_TOP_INDEX = "top_index.npy"
POP_TOP_SCORE = "top_score.npy"


@dataclass(frozen=True)
class ClientBundle:
    """What a device needs (docs/reference/client-bundle.md): item ids in row order, the embedding
    E (n × d), SANSA's W1 and W2, the embedding's version, d, R and lattice grid, and the code
    signal's codebook (item rows) and its version."""

    item_ids: np.ndarray  # (n,) str
    embedding: np.ndarray  # (n, d) float64
    w1: sp.csr_matrix
    w2: sp.csr_matrix
    version: str
    dim: int
    radius: float
    codebook: np.ndarray  # (C,) int64 item rows, in the codebook's order
    codebook_version: str

    @property
    def code_size(self) -> int:
        return int(self.codebook.shape[0])

    @property
    def lattice(self) -> Lattice:
        """The grid the device's signal lives on (step g = R/4096, integer L1 radius K)."""
        return Lattice.of(self.radius, self.dim)

    @cached_property
    def model(self) -> Model:
        """The scoring model the device re-ranks with (:meth:`recsvc.model.Model.score_one`)."""
        return Model(w1=self.w1, w2=self.w2, item_ids=self.item_ids)


def _save(path: Path, array: np.ndarray, dtype: np.dtype) -> None:
    np.save(path, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)


def write_client_bundle(
    directory: Path, item_ids: np.ndarray, embedding: np.ndarray, radius: float, model: Model, codebook: Any
) -> str:
    """Writes ``directory`` (new) as a client bundle with the codebook ``codebook`` (item ids, in
    order); returns its embedding version."""
    ids = [str(i) for i in np.asarray(item_ids).tolist()]
    book = [str(i) for i in np.asarray(codebook).tolist()]
    if len(book) < 2 or len(set(book)) != len(book) or not set(book) <= set(ids):
        raise ArtifactError(f"client bundle: codebook of {len(book)} ids; expected ≥ 2 distinct ids of the catalog")
    e = np.asarray(embedding, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] != len(ids) or not np.isfinite(e).all():
        raise ArtifactError(f"client bundle: embedding of shape {e.shape}; expected finite ({len(ids)}, d)")
    if [str(i) for i in model.item_ids.tolist()] != ids:
        raise ArtifactError("client bundle: the model's item ids differ from the embedding's; expected the same order")
    try:
        r = check_radius(radius)
    except ParamError as exc:
        raise ArtifactError(f"client bundle: {exc}") from None
    directory.mkdir()
    (directory / ITEM_IDS).write_text(json.dumps(ids, ensure_ascii=False))
    (directory / CODEBOOK).write_bytes(codebook_bytes(book))
    _save(directory / EMBEDDING, e, np.dtype("<f8"))
    for name, m in (("w1", model.w1), ("w2", model.w2)):
        csr = sp.csr_matrix(m)
        for part, dtype in CSR_PARTS.items():
            _save(directory / f"{name}_{part}.npy", getattr(csr, part), dtype)
    version = embedding_version(e, r)
    files = {p.name: sha256_file(p) for p in sorted(directory.iterdir())}
    manifest = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_FORMAT_VERSION,
        "embedding_version": version,
        "dim": int(e.shape[1]),
        "radius": r,
        "grid_step": Lattice.of(r, int(e.shape[1])).step,
        "lattice_radius": Lattice.of(r, int(e.shape[1])).radius,
        "num_items": len(ids),
        "signal": SIGNAL_CODE,
        "code_size": len(book),
        "codebook_version": codebook_version(book),
        "files": files,
    }
    (directory / BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return version


def _load(path: Path, dtype: np.dtype, ndim: int) -> np.ndarray:
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a readable .npy file: {exc}") from None
    if a.dtype != dtype or a.ndim != ndim:
        raise ArtifactError(f"{path} holds {a.dtype} of {a.ndim} dimensions; expected {dtype.str} of {ndim}")
    return np.asarray(a)


def _manifest(directory: Path) -> dict[str, Any]:
    path = directory / BUNDLE_MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; {directory} is not a client bundle") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not valid JSON: {exc}") from None
    expected: dict[str, type | tuple[type, ...]] = {
        "format": str,
        "format_version": int,
        "embedding_version": str,
        "dim": int,
        "radius": (int, float),
        "grid_step": (int, float),
        "lattice_radius": int,
        "num_items": int,
        "signal": str,
        "code_size": int,
        "codebook_version": str,
        "files": dict,
    }
    old = {1: "a float signal", 2: "the lattice signal without the codebook"}
    if isinstance(data, dict) and data.get("format") == BUNDLE_FORMAT and data.get("format_version") in old:
        raise ArtifactError(
            f"{path}: client bundle format_version {data['format_version']} ({old[data['format_version']]}) is not "
            f"served; expected version {BUNDLE_FORMAT_VERSION} (the code signal's codebook): rebuild the artifact "
            "with `recsvc prep`"
        )
    for key, kind in expected.items():
        if not isinstance(data, dict) or not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ArtifactError(f"{path}: field {key!r} is missing or not a {kind}; expected the bundle's manifest")
    if data["format"] != BUNDLE_FORMAT or data["format_version"] != BUNDLE_FORMAT_VERSION:
        raise ArtifactError(
            f"{path}: format {data['format']!r} version {data['format_version']}; "
            f"expected {BUNDLE_FORMAT!r} version {BUNDLE_FORMAT_VERSION}"
        )
    return data


def _csr(directory: Path, name: str, shape0: int | None, shape1: int | None) -> sp.csr_matrix:
    parts = {part: _load(directory / f"{name}_{part}.npy", dtype, 1) for part, dtype in CSR_PARTS.items()}
    indptr, indices, data = parts["indptr"], parts["indices"], parts["data"]
    rows = len(indptr) - 1
    where = directory / f"{name}_indptr.npy"
    if rows < 0 or indptr[0] != 0 or indptr[-1] != len(indices) or len(indices) != len(data):
        raise ArtifactError(f"{where}: indptr does not frame {name}'s {len(indices)} indices; expected CSR arrays")
    if (np.diff(indptr) < 0).any() or not np.isfinite(data).all() or (indices.size and indices.min() < 0):
        raise ArtifactError(f"{where}: {name} is not valid CSR (decreasing indptr, negative index or non-finite data)")
    cols = shape1 if shape1 is not None else (int(indices.max()) + 1 if indices.size else 0)
    if shape0 is not None and rows != shape0:
        raise ArtifactError(f"{where}: {name} has {rows} rows; expected {shape0}")
    if indices.size and indices.max() >= cols:
        raise ArtifactError(f"{directory / f'{name}_indices.npy'}: column index ≥ {cols}; expected < {cols}")
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols))


def read_client_bundle(directory: str | Path) -> ClientBundle:
    """The client bundle in ``directory`` (an artifact's ``client/``), every file's sha256, dtype
    and shape checked and the embedding version recomputed; ArtifactError naming the bad file."""
    directory = Path(directory)
    m = _manifest(directory)
    for name, digest in m["files"].items():
        f = directory / name
        if not f.is_file():
            raise ArtifactError(f"{f} is missing (listed in {directory / BUNDLE_MANIFEST})")
        if sha256_file(f) != digest:
            raise ArtifactError(f"{f} is corrupt: its sha256 does not match {directory / BUNDLE_MANIFEST}")
    needed = [ITEM_IDS, CODEBOOK, EMBEDDING] + [f"{w}_{p}.npy" for w in ("w1", "w2") for p in CSR_PARTS]
    missing = [n for n in needed if n not in m["files"]]
    if missing:
        raise ArtifactError(f"{directory / BUNDLE_MANIFEST} does not list {missing}; expected every bundle file")
    try:
        ids = json.loads((directory / ITEM_IDS).read_text())
    except ValueError as exc:
        raise ArtifactError(f"{directory / ITEM_IDS} is not valid JSON: {exc}") from None
    n, d = m["num_items"], m["dim"]
    if not isinstance(ids, list) or len(ids) != n or not all(isinstance(i, str) for i in ids) or len(set(ids)) != n:
        raise ArtifactError(f"{directory / ITEM_IDS}: expected a JSON array of {n} distinct strings")
    e = _load(directory / EMBEDDING, np.dtype("<f8"), 2)
    if e.shape != (n, d) or not np.isfinite(e).all():
        raise ArtifactError(f"{directory / EMBEDDING}: shape {e.shape}; expected finite ({n}, {d})")
    try:
        r = check_radius(m["radius"])
    except ParamError as exc:
        raise ArtifactError(f"{directory / BUNDLE_MANIFEST}: {exc}") from None
    grid = Lattice.of(r, d)
    if (m["grid_step"], m["lattice_radius"]) != (grid.step, grid.radius):
        raise ArtifactError(
            f"{directory / BUNDLE_MANIFEST}: grid_step {m['grid_step']!r} and lattice_radius {m['lattice_radius']} "
            f"are not the grid of R and d; expected {grid.step!r} and {grid.radius} (R/4096 and 4096 + d//2)"
        )
    if embedding_version(e, r) != m["embedding_version"]:
        raise ArtifactError(
            f"{directory / EMBEDDING}: the embedding, radius and grid do not hash to the manifest's embedding_version; "
            "expected the bundle as `recsvc prep` wrote it"
        )
    w1 = _csr(directory, "w1", n, None)
    w2 = _csr(directory, "w2", w1.shape[1], n)
    book = _codebook(directory, m, {i: row for row, i in enumerate(ids)})
    return ClientBundle(np.array(ids, dtype=str), e, w1, w2, m["embedding_version"], d, r, book, m["codebook_version"])


def _codebook(directory: Path, m: dict[str, Any], index: dict[str, int]) -> np.ndarray:
    """codebook.json's item rows, checked against the manifest (signal, code_size, version)."""
    where = directory / CODEBOOK
    if m["signal"] != SIGNAL_CODE:
        raise ArtifactError(
            f"{directory / BUNDLE_MANIFEST}: signal {m['signal']!r}; expected {SIGNAL_CODE!r} (format_version "
            f"{BUNDLE_FORMAT_VERSION} devices send the code signal by default)"
        )
    raw = where.read_bytes()
    try:
        book = json.loads(raw)
    except ValueError as exc:
        raise ArtifactError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(book, list) or len(book) != m["code_size"] or m["code_size"] < 2:
        raise ArtifactError(f"{where}: expected a JSON array of code_size = {m['code_size']} (≥ 2) item ids")
    if not all(isinstance(i, str) and i in index for i in book) or len(set(book)) != len(book):
        raise ArtifactError(f"{where}: expected distinct item ids of item_ids.json")
    if raw != codebook_bytes(book) or codebook_version(book) != m["codebook_version"]:
        raise ArtifactError(
            f"{where}: does not hash to the manifest's codebook_version; expected the bundle as `recsvc prep` wrote it"
        )
    return np.array([index[i] for i in book], dtype=np.int64)


def write_population_sample(
    directory: Path, embeddings: np.ndarray, top_index: np.ndarray, top_score: np.ndarray, num_items: int
) -> None:
    """Writes ``directory`` (new) with the server's population sample over ``num_items`` items,
    checked as :func:`read_population_sample` will check it (ArtifactError otherwise)."""
    try:
        Population(
            np.asarray(embeddings, np.float64), np.asarray(top_index, np.int64), np.asarray(top_score), num_items
        )
    except ParamError as exc:
        raise ArtifactError(f"{directory}: {exc}") from None
    directory.mkdir()
    _save(directory / POP_EMBEDDINGS, embeddings, np.dtype("<f8"))
    _save(directory / POP_TOP_INDEX, top_index, np.dtype("<i4"))
    _save(directory / POP_TOP_SCORE, top_score, np.dtype("<f8"))


def read_population_sample(directory: Path, num_items: int) -> Population:
    """The population sample over a catalog of ``num_items`` items; ArtifactError naming the
    directory if its arrays are inconsistent."""
    emb = _load(directory / POP_EMBEDDINGS, np.dtype("<f8"), 2)
    idx = _load(directory / POP_TOP_INDEX, np.dtype("<i4"), 2).astype(np.int64)
    score = _load(directory / POP_TOP_SCORE, np.dtype("<f8"), 2)
    try:
        return Population(emb, idx, score, num_items)
    except ParamError as exc:
        raise ArtifactError(f"{directory}: {exc}") from None
