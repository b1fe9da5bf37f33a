"""The one reader and writer of artifact directories (SPEC §4).

Layout of ``artifacts/<dataset>/``::

    manifest.json        dataset, seeds, split sizes, SANSA config, versions, accuracy,
                         population Spearman statistics, sha256 of every other file
    items.parquet        item_id (str), lo, hi, sensitivity           -- public per-item data
    candidates.parquet   user_id (str), rank, item_id (str), score    -- raw, unclipped
    model/W1.npz, model/W2.npz, model/items.parquet (item_id in column order)

Writers go through :class:`ArtifactWriter`, a :class:`StagedDir` (the one way any part writes an
output directory): it fills a temporary sibling directory and renames it into place only after
every file and the manifest are written, so a crash never leaves a half-written artifact. Readers go through :func:`load_artifact`, which verifies the
checksums before anything is trusted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Self

import numpy as np
import polars as pl
import scipy.sparse as sp

MANIFEST = "manifest.json"
ITEMS = "items.parquet"
CANDIDATES = "candidates.parquet"
MODEL_DIR = "model"
FORMAT_VERSION = 1
MIN_SENSITIVITY = 1e-6

ITEMS_SCHEMA = {"item_id": pl.String, "lo": pl.Float64, "hi": pl.Float64, "sensitivity": pl.Float64}
CANDIDATES_SCHEMA = {"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String, "score": pl.Float64}


class ArtifactError(ValueError):
    """An artifact directory is missing, incomplete or corrupt, or its content is invalid."""


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


# ---------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class Model:
    """SANSA's two sparse factors; scores for a user row x are x @ W1 @ W2."""

    w1: sp.csr_matrix
    w2: sp.csr_matrix
    item_ids: np.ndarray  # str, column order of W1/W2

    @cached_property
    def index(self) -> dict[str, int]:
        return {item: i for i, item in enumerate(self.item_ids.tolist())}

    def score(self, x: sp.csr_matrix) -> np.ndarray:
        """Dense scores (users × items); the caller masks seen items."""
        return np.asarray((x @ self.w1 @ self.w2).todense(), dtype=np.float64)


def _save_model(model: Model, directory: Path) -> None:
    directory.mkdir()
    sp.save_npz(directory / "W1.npz", sp.csr_matrix(model.w1), compressed=False)
    sp.save_npz(directory / "W2.npz", sp.csr_matrix(model.w2), compressed=False)
    pl.DataFrame({"item_id": model.item_ids.astype(str)}).write_parquet(directory / "items.parquet")


def _load_model(directory: Path) -> Model:
    item_ids = pl.read_parquet(directory / "items.parquet")["item_id"].to_numpy().astype(str)
    w1 = sp.load_npz(directory / "W1.npz").tocsr()
    w2 = sp.load_npz(directory / "W2.npz").tocsr()
    if w1.shape[0] != len(item_ids) or w2.shape[1] != len(item_ids) or w1.shape[1] != w2.shape[0]:
        raise ArtifactError(
            f"{directory}: model shapes W1 {w1.shape}, W2 {w2.shape} do not match {len(item_ids)} items"
        )
    return Model(w1=w1, w2=w2, item_ids=item_ids)


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class CandidateMatrix:
    """Candidates as rectangular arrays (users × n), padded where a user has fewer than n.

    ``count[b]`` is user b's real candidate count; padded slots have score −inf, Δ 1 and
    item index −1. Scores here are RAW; :meth:`clipped` applies each item's clip range.
    """

    user_ids: np.ndarray  # (B,) str
    item_index: np.ndarray  # (B, n) int64 row in items, −1 for padding
    scores: np.ndarray  # (B, n) float64 raw
    lo: np.ndarray  # (B, n)
    hi: np.ndarray  # (B, n)
    sensitivity: np.ndarray  # (B, n)
    count: np.ndarray  # (B,) int

    def clipped(self) -> np.ndarray:
        return np.clip(self.scores, self.lo, self.hi)


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]
    items: pl.DataFrame

    @cached_property
    def item_index(self) -> dict[str, int]:
        return {item: i for i, item in enumerate(self.items["item_id"].to_list())}

    @cached_property
    def candidates(self) -> pl.DataFrame:
        return validate_candidates(pl.read_parquet(self.path / CANDIDATES))

    @cached_property
    def model(self) -> Model:
        return _load_model(self.path / MODEL_DIR)

    @cached_property
    def _sorted_candidates(self) -> pl.DataFrame:
        return self.candidates.sort(["user_id", "rank"], maintain_order=True)

    @cached_property
    def user_ids(self) -> np.ndarray:
        """Every test user, in artifact order (the order of :meth:`candidate_matrix` rows)."""
        return self._sorted_candidates["user_id"].unique(maintain_order=True).to_numpy().astype(str)

    @cached_property
    def _user_offsets(self) -> np.ndarray:
        # Row offset of each user's first candidate in the sorted frame (+ the total at the end).
        counts = self._sorted_candidates.group_by("user_id", maintain_order=True).len()["len"].to_numpy()
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def candidate_matrix(self, users: int | None = None, start: int = 0) -> CandidateMatrix:
        """``users`` test users from position ``start`` (all remaining if None), in artifact order.

        Only that slice is materialised, so callers can walk the users in bounded-memory chunks.
        """
        total = len(self.user_ids)
        if start < 0 or (users is not None and users < 0):
            raise ValueError(f"candidate_matrix: start and users must be ≥ 0, got start={start}, users={users}")
        stop = total if users is None else min(total, start + users)
        start = min(start, total)
        offs = self._user_offsets
        cands = self._sorted_candidates.slice(int(offs[start]), int(offs[stop] - offs[start]))
        order = pl.Series(self.user_ids[start:stop])
        user_ids = order.to_numpy().astype(str)
        row_of_user = {u: i for i, u in enumerate(user_ids.tolist())}
        rows = np.fromiter((row_of_user[u] for u in cands["user_id"].to_list()), np.int64, cands.height)
        counts = np.bincount(rows, minlength=len(user_ids))
        n = int(counts.max()) if len(counts) else 0
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        cols = np.arange(cands.height) - starts[rows]
        idx = np.full((len(user_ids), n), -1, dtype=np.int64)
        try:
            idx[rows, cols] = np.fromiter(
                (self.item_index[i] for i in cands["item_id"].to_list()), np.int64, cands.height
            )
        except KeyError as exc:
            raise ArtifactError(f"{CANDIDATES}: item_id {exc.args[0]!r} is not in {ITEMS}") from None
        scores = np.full((len(user_ids), n), -np.inf)
        scores[rows, cols] = cands["score"].to_numpy()
        pad = idx < 0
        take = np.where(pad, 0, idx)
        lo = np.where(pad, -np.inf, self.items["lo"].to_numpy()[take])
        hi = np.where(pad, -np.inf, self.items["hi"].to_numpy()[take])
        sens = np.where(pad, 1.0, self.items["sensitivity"].to_numpy()[take])
        return CandidateMatrix(user_ids, idx, scores, lo, hi, sens, counts)


def load_artifact(path: str | os.PathLike[str], verify: bool = True) -> Artifact:
    """Opens an artifact directory; with ``verify`` every file's sha256 is checked first."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"artifact directory {path} does not exist; build it with `recsvc prep`")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{mpath} is missing; {path} is not a complete artifact directory")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{mpath} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{mpath} holds a JSON {type(manifest).__name__}; expected an object")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{mpath} has no 'files' checksum table")
    for rel in (ITEMS, CANDIDATES):
        if rel not in files:
            raise ArtifactError(f"{mpath} does not list {rel}")
    if verify:
        for rel, digest in files.items():
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


# ---------------------------------------------------------------------------------------------
# Writing


class OutputError(ValueError):
    """An output directory (``--out``) cannot be created, or would replace one without ``--force``."""


def check_out(out: str | os.PathLike[str], force: bool, flag: str = "--out",
              protect: Mapping[str, str | os.PathLike[str]] | None = None) -> None:
    """Pure checks of an output directory path (only stats, nothing is created), so callers can
    validate every flag before any work: not a file, under no file, absent unless ``force``, and
    never the current directory, one containing it, or overlapping a ``protect``ed input
    (flag → path: the run's own inputs), since ``force`` replaces ``out`` whole."""
    out = Path(out)
    real = out.resolve()
    for name, path in (protect or {}).items():
        other = Path(path).resolve()
        if real == other or other in real.parents or real in other.parents:
            rel = "is" if real == other else ("is inside" if other in real.parents else "contains")
            raise OutputError(f"{flag} {out} {rel} the {name} directory {path}; expected a separate output "
                              f"directory ({name} is never replaced, not even with --force)")
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise OutputError(f"{flag} {out} {'is' if real == cwd else 'contains'} the current directory; "
                          "expected a separate output directory such as results/NAME or artifacts/NAME")
    if out.exists() and not out.is_dir():
        raise OutputError(f"cannot create {flag} {out}: it exists and is not a directory; expected a directory path")
    missing = _missing_parents(Path(os.path.abspath(out)))
    ancestor = missing[-1].parent if missing else Path(os.path.abspath(out)).parent
    if not ancestor.is_dir():
        raise OutputError(f"cannot create {flag} {out}: {ancestor} is not a directory")
    if out.exists() and not force:
        raise OutputError(f"{flag} {out} already exists; pass --force to replace it")


class StagedDir:
    """The one way to write an output directory: ``with StagedDir(out, force) as s: <fill s.tmp>;
    s.publish()``.

    Construction runs :func:`check_out` (creates nothing). Entering creates ``out``'s missing
    parents and a hidden temp sibling ``.<name>.tmp-*``; :meth:`publish` renames it into place
    atomically. Leaving without a publish removes the temp dir and the parents it created (if
    still empty), so a failed run leaves the disk as it found it."""

    def __init__(self, out: str | os.PathLike[str], force: bool = False, flag: str = "--out",
                 protect: Mapping[str, str | os.PathLike[str]] | None = None) -> None:
        check_out(out, force, flag, protect)
        self.out = Path(out)  # as given, for messages and the return value
        self.force = force
        self.flag = flag
        self._path = Path(os.path.abspath(out))  # normalised: immune to chdir and to "x/.."
        self._tmp: Path | None = None
        self._created: list[Path] = []  # parents made on enter, outermost first

    def __enter__(self) -> Self:
        try:
            for d in reversed(_missing_parents(self._path)):
                try:
                    d.mkdir()
                except FileExistsError:
                    if d.is_dir():  # another run made it meanwhile: use it, never remove it
                        continue
                    raise
                self._created.append(d)
            self._tmp = Path(tempfile.mkdtemp(prefix=f".{self._path.name}.tmp-", dir=self._path.parent))
        except OSError as exc:
            self._remove_created()
            raise OutputError(f"cannot create {self.flag} {self.out}: {exc.strerror or exc} ({_failed_at(exc)})") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self._remove_created()

    @property
    def tmp(self) -> Path:
        if self._tmp is None:
            raise RuntimeError(f"{type(self).__name__} used outside its `with` block (or after publish)")
        return self._tmp

    def publish(self) -> Path:
        """Renames the finished temp dir to ``out``. An ``out`` that another process created
        meanwhile (the checks saw it absent) is replaced only with ``force``."""
        try:
            replace_dir(self.tmp, self._path, replace=self.force)
        except FileExistsError:  # created after the checks (atomic: RENAME_NOREPLACE)
            raise OutputError(f"{self.flag} {self.out} appeared while writing; not replacing it "
                              "(pass --force to replace it)") from None
        self._tmp = None
        self._created = []  # they hold ``out`` now
        return self.out

    def _remove_created(self) -> None:
        for d in reversed(self._created):
            try:
                d.rmdir()  # only if still empty: never removes anything this run did not make
            except OSError:
                break
        self._created = []


def _missing_parents(path: Path) -> list[Path]:
    """``path``'s ancestors that do not exist yet, innermost first."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing


def _failed_at(exc: OSError) -> str:
    """The directory an OSError is about: a hidden temp dir's parent, else the path itself."""
    name = exc.filename
    if name and Path(name).name.startswith("."):
        return str(Path(name).parent)
    return str(name)


class ArtifactWriter(StagedDir):
    """Atomic writer: ``with ArtifactWriter(out, force) as w: w.write_items(...); ...; w.commit(manifest)``.

    Nothing appears at ``out`` unless :meth:`commit` succeeds (see :class:`StagedDir`). An
    existing ``out`` is an error unless ``force``; with ``force`` it is replaced only at commit.
    """

    def write_items(self, items: pl.DataFrame) -> None:
        validate_items(items).write_parquet(self.tmp / ITEMS, statistics=False)

    def write_candidates(self, cands: pl.DataFrame) -> None:
        validate_candidates(cands).write_parquet(self.tmp / CANDIDATES, statistics=False)

    def write_model(self, model: Model) -> None:
        _save_model(model, self.tmp / MODEL_DIR)

    def commit(self, manifest: dict[str, Any]) -> Path:
        tmp = self.tmp
        for required in (ITEMS, CANDIDATES):
            if not (tmp / required).is_file():
                raise ArtifactError(f"cannot commit artifact: {required} was not written")
        files = {
            p.relative_to(tmp).as_posix(): sha256_file(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        full = {"format_version": FORMAT_VERSION, **manifest, "files": files}
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True, default=_json_default) + "\n")
        return self.publish()


def replace_dir(tmp: Path, out: Path, replace: bool = True) -> Path:
    """Moves the finished directory ``tmp`` to ``out`` (a sibling). An existing ``out`` is
    exchanged with ``tmp`` in one atomic ``renameat2(RENAME_EXCHANGE)``, so readers, and a crash
    at any moment, see the old or the new directory, never none and never a mix. With
    ``replace=False`` an existing ``out``, even one made a moment ago, raises FileExistsError."""
    try:
        _renameat2(tmp, out, _RENAME_NOREPLACE)  # atomic: never over a directory made meanwhile
        return out
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
    if out.exists() and not replace:
        raise FileExistsError(errno.EEXIST, "exists; not replacing it", str(out))
    if not out.exists():  # no RENAME_NOREPLACE here (old kernel or file system)
        os.replace(tmp, out)
        return out
    try:
        _exchange(tmp, out)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
        _swap_by_two_renames(tmp, out)  # no RENAME_EXCHANGE here (old kernel or file system)
    else:
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old directory
    return out


_RENAME_NOREPLACE = 1  # linux/fs.h
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(a: Path, b: Path, flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot rename {a} to {b}: {os.strerror(err)}", str(b))


def _exchange(a: Path, b: Path) -> None:
    _renameat2(a, b, _RENAME_EXCHANGE)


def _swap_by_two_renames(tmp: Path, out: Path) -> None:
    """The fallback swap: a crash between the renames leaves the old directory at
    ``.<out>.old-<pid>``; an error puts it back."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
