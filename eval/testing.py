"""Tiny artifacts for testing the evaluation harness, written through the real ArtifactWriter.

Test helpers that are not fixtures live here, beside the code they exercise (as ``numpy.testing``
does); the test suite's fixtures live in its conftest.py files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from recsvc.artifact import CANDIDATE_ARRAYS_DIR, ArtifactWriter, load_artifact


def make_artifact(
    out: Path,
    users: int = 12,
    items: int = 30,
    n: int = 20,
    seed: int = 0,
    short_users: int = 2,
    manifest: dict | None = None,
) -> Path:
    """Scores roughly increase with Δ (positive correlation, like SANSA in the paper).

    The last ``short_users`` users get fewer than ``n`` candidates, exercising the padding.
    ``manifest``: more manifest fields (e.g. ``default_gamma``).
    """
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0.0, 0.1, items)
    sens = rng.uniform(0.1, 1.0, items)
    hi = lo + sens
    item_ids = [f"i{k}" for k in range(items)]
    rows: dict[str, list[str | int | float]] = {"user_id": [], "rank": [], "item_id": [], "score": []}
    for u in range(users):
        count = n - 3 * (u >= users - short_users)
        picked = rng.choice(items, count, replace=False)
        score = lo[picked] + sens[picked] * rng.uniform(0.2, 1.3, count)  # some above hi → clipped
        order = np.argsort(-score)
        rows["user_id"] += [f"u{u:03d}"] * count
        rows["rank"] += list(range(count))
        rows["item_id"] += [item_ids[k] for k in picked[order]]
        rows["score"] += score[order].tolist()
    with ArtifactWriter(out) as w:
        w.write_items(pl.DataFrame({"item_id": item_ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(pl.DataFrame(rows).cast({"rank": pl.Int32}))
        return w.commit({"dataset": "toy", "seed": seed, **(manifest or {})})


def make_catalog_artifact(out: Path, users: int = 3, items: int = 6, seed: int = 0, targets: bool = False) -> Path:
    """A tiny artifact with a model and the test users' fold-in inputs (``test_inputs.parquet``),
    so eval can score the users over the whole (tiny) catalog: the --pipelines tests. With
    ``targets``, each user's first unseen item is its held-out target (``test_targets.parquet``)."""
    import scipy.sparse as sp

    from recsvc.model import Model, top_k

    rng = np.random.default_rng(seed)
    item_ids = np.array([f"i{k}" for k in range(items)])
    w1 = sp.csr_matrix(rng.uniform(0.0, 1.0, (items, 3)))
    w2 = sp.csr_matrix(rng.uniform(0.0, 1.0, (3, items)))
    model = Model(w1=w1, w2=w2, item_ids=item_ids)
    inputs = {f"u{u}": rng.choice(items, 2, replace=False) for u in range(users)}
    lo = np.zeros(items)
    hi = rng.uniform(1.5, 4.0, items)  # some scores above hi → clipped
    rows: dict[str, list[str | int | float]] = {"user_id": [], "rank": [], "item_id": [], "score": []}
    for u, cols in inputs.items():
        s = model.score_one(cols)
        s[cols] = -np.inf
        top = top_k(s[None, :], items - 2)
        rows["user_id"] += [u] * (items - 2)
        rows["rank"] += list(range(items - 2))
        rows["item_id"] += item_ids[top.index[0]].tolist()
        rows["score"] += top.score[0].tolist()
    with ArtifactWriter(out) as w:
        w.write_items(pl.DataFrame({"item_id": item_ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(pl.DataFrame(rows).cast({"rank": pl.Int32}))
        w.write_model(model)
        w.write_test_inputs(
            pl.DataFrame(
                {"user_id": np.repeat(list(inputs), 2), "item_id": item_ids[np.concatenate(list(inputs.values()))]}
            )
        )
        if targets:
            first = [int(np.setdiff1d(np.arange(items), cols)[0]) for cols in inputs.values()]
            w.write_test_targets(pl.DataFrame({"user_id": list(inputs), "item_id": item_ids[first]}))
        return w.commit({"dataset": "catalog-toy", "seed": seed})


def without_candidate_arrays(src: Path, out: Path) -> Path:
    """A copy of the artifact ``src`` at ``out`` without ``candidates/``, as artifacts written before
    the memory-mapped arrays are: readers then cut candidates.parquet (files hard-linked)."""
    art = load_artifact(src)
    content = {k: v for k, v in art.manifest.to_dict().items() if k not in ("files", "format_version")}
    with ArtifactWriter(out, protect={"artifacts": src}) as w:
        w.keep(art.path, [f for f in art.manifest.files if f.split("/", 1)[0] != CANDIDATE_ARRAYS_DIR])
        return w.commit(content)


class _Patcher(Protocol):
    def setattr(self, target: object, name: str, value: object) -> None: ...


def unrendered_figures(mp: _Patcher) -> None:
    """From here on (until ``mp`` is undone, e.g. a pytest MonkeyPatch) every study's figures are
    drawn from their data but written as empty files: laying them out and rendering them is most of
    a small run's CPU. For tests that check which files a run writes, or that run a command again
    after a first run rendered and checked its figures."""
    from eval import figures

    real = figures.save_figure

    def save(fig: Any, path: Path, dpi: int | None = None) -> None:
        path.write_bytes(b"")
        figures.pyplot().close(fig)

    for module in [m for name, m in sys.modules.items() if name == "eval" or name.startswith("eval.")]:
        if getattr(module, "save_figure", None) is real:  # figures itself, and each study that imports it by name
            mp.setattr(module, "save_figure", save)
