"""The offline pipeline (docs/reference/specification.md §4): load → split → fit SANSA → accuracy + test
candidates → sensitivities from a population → population Spearman → one atomic artifact directory.

Python API: ``run(PrepConfig(dataset="ml-100k")) -> Path``.
"""

from __future__ import annotations

import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from data_prep import datasets, memory
from data_prep.candidates import N_CANDIDATES, ScoringContext, score_population, score_top_k
from data_prep.config import (
    DEFAULT_POPULATION_USERS,
    SELECTION_METRIC,
    PrepConfig,
)
from data_prep.datasets.synthetic import SyntheticConfig, config_for, generate_matrix
from data_prep.datasets.synthetic import source as synthetic_source
from data_prep.embedding import (
    RADIUS_RULE,
    Prototypes,
    choose_radius,
    fit_embedding,
    population_prototypes,
    user_embeddings,
)
from data_prep.matrix import RatingMatrix, compact, from_frame
from data_prep.metrics import accuracy
from data_prep.sensitivities import BlockStore, ItemRanges, item_ranges, population_spearman
from data_prep.split import (
    MIN_USER_INTERACTIONS,
    Split,
    UserGroup,
    filter_implicit,
    implicit_matrix,
    sample_population,
    strong_split,
    weak_split,
)
from data_prep.train import SansaParams, fit
from recsvc.artifact import POPULATION, ArtifactWriter
from recsvc.artifact.candidates import UserRows
from recsvc.checks import ParamError
from recsvc.engines import chunk_ranges, make_engine
from recsvc.model import Model, TopK
from recsvc.multiselection import Population, SizeChoice, blind_codebook, choose_size, codebook_version
from recsvc.policy import PolicySpec, build_table, sample_users


def _noop(chunk: Any, context: Any) -> None:
    return None


def _connect(cfg: PrepConfig) -> Any:
    """Makes the engine and, for Dask, connects now: an unreachable scheduler fails in seconds,
    before loading or fitting anything."""
    engine = make_engine(cfg.engine_name(), cfg.workers, cfg.scheduler, progress=cfg.progress)
    if cfg.engine_name() == "dask":
        try:
            list(engine.map(_noop, [], None, desc="connecting to Dask"))  # no chunks: just connects
        except OSError as exc:
            engine.close()
            where = "{scheduler} {address}" if cfg.scheduler else "a local Dask cluster"
            raise ParamError(
                f"cannot connect to {where}: {{reason}}; expected a running Dask scheduler",
                address=cfg.scheduler,
                reason=str(exc),
            ) from None
    return engine


@dataclass
class _Timer:
    steps: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str, say: str | None = None) -> Iterator[None]:
        if say:
            print(f"[prep] {say}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        yield
        self.steps[name] = round(self.steps.get(name, 0.0) + time.perf_counter() - t0, 3)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("recsvc", "numpy", "scipy", "polars", "sansa", "scikit-sparse", "dask", "distributed"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


def _dataset_info(cfg: PrepConfig) -> datasets.DatasetInfo:
    """The dataset's split and SANSA settings; a synthetic preset shaped like a paper dataset
    takes that dataset's SANSA settings and γ."""
    info = datasets.INFO[cfg.dataset]
    paper = config_for(cfg.preset_name(), None, None, None).paper if cfg.dataset == "synthetic" else None
    if paper is None:
        return info
    like = datasets.INFO[paper]
    return replace(like, name=info.name, explicit=info.explicit, test_users=0, val_users=0)


def _memory_estimate(cfg: PrepConfig, info: datasets.DatasetInfo) -> memory.Estimate:
    factorizer = cfg.factorizer or info.factorizer
    workers = cfg.workers or 2
    if cfg.dataset == "synthetic":
        syn = config_for(cfg.preset_name(), cfg.users, cfg.items, cfg.interactions)
        return memory.estimate(syn.interactions, syn.items, factorizer, False, cfg.chunk_users, workers)
    n = memory.file_interactions(cfg.dataset, None if cfg.data_dir is None else Path(cfg.data_dir))
    items = min(memory.ITEMS[cfg.dataset], max(n, 1))  # a small file cannot rate the whole catalogue
    return memory.estimate(n, items, factorizer, True, cfg.chunk_users, workers)


def _rating_matrix(cfg: PrepConfig, info: datasets.DatasetInfo) -> tuple[RatingMatrix, str, dict[str, Any], int, int]:
    """All kept interactions as one int32 CSR matrix (filter_implicit's rules), and the hold-out sizes."""
    extra: dict[str, Any] = {}
    if cfg.dataset == "synthetic":
        syn: SyntheticConfig = config_for(cfg.preset_name(), cfg.users, cfg.items, cfg.interactions)
        extra["synthetic"] = {"preset": cfg.preset_name(), **asdict(syn)}
        x = generate_matrix(syn, cfg.seed)
        src = synthetic_source(syn, cfg.seed)
        ids = np.arange(max(x.shape))
        m = compact(x, ids[: x.shape[0]], ids[: x.shape[1]], MIN_USER_INTERACTIONS)  # all ratings are 5
        return m, src, extra, syn.test_users, syn.val_users
    raw = datasets.load(cfg.dataset, None if cfg.data_dir is None else Path(cfg.data_dir))
    if isinstance(raw, datasets.Ratings):
        m = implicit_matrix(raw, info.explicit)
    else:
        m = from_frame(filter_implicit(raw.df, info.explicit, raw.source), 0)
    return m, raw.source, extra, info.test_users, info.val_users


def _load_and_split(cfg: PrepConfig, info: datasets.DatasetInfo) -> tuple[Split, str, dict[str, Any]]:
    if info.weak_generalisation:
        raw = datasets.load(cfg.dataset, None if cfg.data_dir is None else Path(cfg.data_dir))
        split = weak_split(filter_implicit(raw.df, info.explicit, raw.source), raw.source)
        kind = "weak generalisation (train.txt = training data and test input, test.txt = targets)"
        return split, raw.source, {"split_kind": kind}
    m, source, extra, n_test, n_val = _rating_matrix(cfg, info)
    n_test = cfg.test_users if cfg.test_users is not None else n_test
    n_val = cfg.val_users if cfg.val_users is not None else n_val
    split = strong_split(m, n_test, n_val, cfg.seed, source)
    extra["split_kind"] = "strong generalisation (disjoint users; held-out users 80% input / 20% targets)"
    return split, source, extra


def _population(cfg: PrepConfig, split: Split) -> tuple[UserGroup, str]:
    if split.validation is None:  # weak generalisation: no held-out users exist
        n = DEFAULT_POPULATION_USERS if cfg.population_users is None else cfg.population_users
        return sample_population(split, n, cfg.seed), "sample"
    kind = cfg.sensitivity_population or "validation"
    group = split.validation if kind == "validation" else split.test
    if len(group.user_ids) == 0:
        raise ParamError(
            "the sensitivity population {kind} has no users; expected {val_users} ≥ 1 or {sensitivity_population} test",
            kind=repr(kind),
        )
    return group, kind


def _top(engine: Any, model: Model, group: UserGroup, k: int, chunk: int, desc: str) -> TopK:
    ctx = ScoringContext(model, group.inputs, k)
    chunks = chunk_ranges(group.inputs.shape[0], chunk)
    return TopK.concat(
        list(engine.map(score_top_k, chunks, ctx, desc=desc, unit="user", sizes=[len(c) for c in chunks]))
    )


def _choose_params(
    cfg: PrepConfig, info: datasets.DatasetInfo, split: Split, engine: Any, timer: _Timer
) -> tuple[SansaParams, Model | None, list[dict[str, Any]]]:
    factorizer = cfg.factorizer or info.factorizer
    grid = [
        SansaParams(l2=l2, density=d, factorizer=factorizer, umr_scans=info.umr_scans)
        for l2 in (cfg.l2 or info.l2)
        for d in (cfg.density or info.density)
    ]
    if len(grid) == 1:
        return grid[0], None, []
    if split.validation is None or len(split.validation.user_ids) == 0:
        raise ParamError("choosing l2/density needs validation users; give one {l2} and one {density} value")
    results: list[dict[str, Any]] = []
    best: tuple[float, SansaParams, Model] | None = None
    with timer.step(
        "grid_search", f"choosing l2 × density on {len(split.validation.user_ids)} validation users ({len(grid)} fits)"
    ):
        for params in tqdm(
            grid, desc="grid (fit + validate)", unit="fit", disable=None if cfg.progress is None else not cfg.progress
        ):
            model = fit(split.train, split.item_ids, params, cfg.verbose, cfg.progress)
            top = _top(engine, model, split.validation, 100, cfg.chunk_users, "validation")
            acc = accuracy(top.index, split.validation.targets)
            results.append({"l2": params.l2, "density": params.density, **acc})
            if best is None or acc[SELECTION_METRIC] > best[0]:
                best = (acc[SELECTION_METRIC], params, model)
    assert best is not None
    return best[1], best[2], results


def _candidates_frame(user_ids: np.ndarray, top: TopK, item_ids: np.ndarray) -> pl.DataFrame:
    count = top.count
    valid = top.index >= 0  # padding is always at the end of a row
    return pl.DataFrame(
        {
            "user_id": np.repeat(user_ids.astype(str), count),
            "rank": np.nonzero(valid)[1].astype(np.int32),
            "item_id": item_ids[top.index[valid]],
            "score": top.score[valid],
        }
    )


def _population_frame(user_ids: np.ndarray, top: TopK, item_ids: np.ndarray, spec: PolicySpec) -> pl.DataFrame:
    """The policy sample of the sensitivity population (≤ ``spec.users``, seeded) as a
    candidates-schema frame: raw top-500 scores, public data stored as population.parquet."""
    pick = sample_users(len(user_ids), spec.users, spec.seed)
    sample = TopK(np.asarray(top.index[pick]), np.asarray(top.score[pick]))
    return _candidates_frame(np.asarray(user_ids)[pick], sample, item_ids)


def _inputs_frame(user_ids: np.ndarray, inputs: Any, item_ids: np.ndarray) -> pl.DataFrame:
    """The test users' fold-in (or target) items, one row each (eval scores them over the full catalog)."""
    x = inputs.tocsr()
    return pl.DataFrame(
        {"user_id": np.repeat(user_ids.astype(str), np.diff(x.indptr)), "item_id": item_ids[x.indices].astype(str)}
    )


def _sensitivities(
    cfg: PrepConfig, engine: Any, model: Model, group: UserGroup, scratch: Path, timer: _Timer
) -> tuple[ItemRanges, TopK]:
    n_users, n_items = group.inputs.shape
    store = BlockStore.create(scratch / "population_scores.f64", n_users, n_items)
    chunks = chunk_ranges(n_users, cfg.chunk_users)
    # The population's top-k lists go to disk too, so memory does not grow with the population.
    k = min(N_CANDIDATES, n_items)
    top_index = np.lib.format.open_memmap(scratch / "population_top_index.npy", "w+", np.int32, (n_users, k))
    top_score = np.lib.format.open_memmap(scratch / "population_top_score.npy", "w+", np.float64, (n_users, k))
    with timer.step("population_scoring"):
        ctx = ScoringContext(model, group.inputs, N_CANDIDATES)
        results = engine.map(
            score_population, chunks, ctx, desc="population scores", unit="user", sizes=[len(c) for c in chunks]
        )
        for rows, (scores, top) in zip(chunks, results, strict=True):
            store.write_rows(rows.start, scores)
            top_index[rows.start : rows.stop] = top.index
            top_score[rows.start : rows.stop] = top.score
    with timer.step("percentiles"):
        disable = None if cfg.progress is None else not cfg.progress
        with tqdm(total=n_items, desc="item percentiles", unit="item", disable=disable) as bar:
            ranges = item_ranges(store, cfg.percentiles, progress=bar.update)
    store.path.unlink()
    return ranges, TopK(top_index, top_score)


@dataclass(frozen=True)
class _MultiSelect:
    factors: np.ndarray
    radius: float
    sample: Prototypes
    code: SizeChoice
    codebook: np.ndarray  # the code signal's item rows


def _multiselect(cfg: PrepConfig, split: Split, model: Model) -> _MultiSelect:
    """The public embedding, its radius and the server's population sample, from training users only."""
    users, items = split.train.shape
    factors = fit_embedding(split.train, cfg.embedding_dim_for(users, items), cfg.seed)
    train_emb = user_embeddings(split.train, factors)
    radius = choose_radius(train_emb)
    sample = population_prototypes(
        split.train,
        train_emb,
        radius,
        model,
        cfg.multiselect_users,
        cfg.multiselect_group,
        cfg.multiselect_top,
        cfg.seed,
    )
    # The code signal's size C, chosen on the population (public data) at SELECTION_EPSILON.
    pop = Population(sample.embeddings, sample.top_index.astype(np.int64), sample.top_score, items).warm()
    code = choose_size(pop)
    return _MultiSelect(factors, radius, sample, code, blind_codebook(pop, code.size))


def run(cfg: PrepConfig) -> Path:
    """Builds the artifact directory and returns its path. Bad input raises ValueError
    (DataError / ArtifactError / OutputError) before any directory is created; a failed run
    leaves no temp dir and removes the parent directories it made (see StagedDir)."""
    cfg.validate()
    info = _dataset_info(cfg)
    limit = cfg.memory_limit_bytes()
    if limit is not None:
        memory.check(limit, _memory_estimate(cfg, info))
    out = cfg.output_dir()
    # Checks --out (a file, under a file, exists without --force, the cwd or the input data); creates nothing.
    writer = ArtifactWriter(out, cfg.force, protect={} if cfg.data_dir is None else {"data_dir": cfg.data_dir})
    t_start = time.perf_counter()
    engine = _connect(cfg)
    try:
        with writer:  # creates out's parents, so _build's scratch dir can go in out.parent
            return _build(cfg, info, out, writer, engine, t_start)
    finally:
        engine.close()


def _build(
    cfg: PrepConfig, info: datasets.DatasetInfo, out: Path, writer: ArtifactWriter, engine: Any, t_start: float
) -> Path:
    timer = _Timer()
    with timer.step("load_split", f"loading and splitting {cfg.dataset}"):
        split, source, extra = _load_and_split(cfg, info)
    population, population_kind = _population(cfg, split)
    scratch = Path(
        tempfile.mkdtemp(prefix=f".{out.name}.scratch-", dir=writer.tmp.parent)
    )  # next to out, same file system
    try:
        params, model, grid = _choose_params(cfg, info, split, engine, timer)
        if model is None:
            with timer.step(
                "fit",
                f"fitting SANSA ({params.factorizer}, l2={params.l2:g}, density={params.density:g}) "
                f"on {split.train.shape[0]} training users",
            ):
                model = fit(split.train, split.item_ids, params, cfg.verbose, cfg.progress)
        with timer.step("multiselect", "multi-selection: embedding (truncated SVD) and population prototypes"):
            ms = _multiselect(cfg, split, model)
        with timer.step("test_candidates"):
            top = _top(engine, model, split.test, N_CANDIDATES, cfg.chunk_users, "test candidates")
        acc = accuracy(top.index, split.test.targets)
        ranges, pop_top = _sensitivities(cfg, engine, model, population, scratch, timer)
        with timer.step("spearman"):
            rho = population_spearman(pop_top, ranges, cfg.chunk_users)
        items = pl.DataFrame(
            {"item_id": split.item_ids, "lo": ranges.lo, "hi": ranges.hi, "sensitivity": ranges.sensitivity}
        )
        # rs/rs_improved with the γ the paper used on this data (the manifest's default_gamma)
        spec = PolicySpec(trials=cfg.policy_trials, seed=cfg.seed, users=cfg.policy_users, params={"gamma": info.gamma})
        with timer.step("policy", f"`auto` policy table on ≤ {spec.users} {population_kind} users"):
            pop_frame = _population_frame(population.user_ids, pop_top, split.item_ids, spec)
            # Read back exactly as `recsvc policy` reads population.parquet: the same table bits.
            pop_matrix = UserRows(
                pop_frame, items, {i: r for r, i in enumerate(split.item_ids.tolist())}, POPULATION
            ).matrix()
            policy, policy_users = build_table(pop_matrix, spec, engine, cfg.progress)
        del pop_top  # release the scratch memmaps before the scratch directory goes
    finally:
        engine.close()
        shutil.rmtree(scratch, ignore_errors=True)
    with timer.step("write", "writing the artifact"):
        writer.write_items(items)
        writer.write_candidates(_candidates_frame(split.test.user_ids, top, split.item_ids))
        writer.write_population(pop_frame)
        writer.write_policy(policy)
        writer.write_model(model)
        writer.write_test_inputs(_inputs_frame(split.test.user_ids, split.test.inputs, split.item_ids))
        if split.test.targets is not None:
            writer.write_test_targets(_inputs_frame(split.test.user_ids, split.test.targets, split.item_ids))
        embedding_version = writer.write_client_bundle(
            split.item_ids, ms.factors, ms.radius, model, split.item_ids[ms.codebook]
        )
        writer.write_multiselect_population(
            ms.sample.embeddings, ms.sample.top_index, ms.sample.top_score, len(split.item_ids)
        )
        acc_users = acc.pop("users")
        manifest = {
            "dataset": cfg.dataset,
            "source": source,
            "seed": cfg.seed,
            "split": {**split.sizes(), "kind": extra.pop("split_kind"), "target_fraction": 0.2},
            "sansa": {
                **asdict(params),
                "selected_on": "validation " + SELECTION_METRIC if grid else "fixed",
                "grid": grid,
            },
            "accuracy": acc,
            "accuracy_users": acc_users,
            "population_spearman": rho,
            "percentiles": list(cfg.percentiles),
            "sensitivity_population": population_kind,
            "sensitivity_population_users": int(population.inputs.shape[0]),
            "items_without_population_scores": int((ranges.count == 0).sum()),
            "candidates_per_user": N_CANDIDATES,
            "policy": spec.describe(policy_users, int(pop_matrix.count.max())),
            "default_gamma": info.gamma,
            "multiselect": {
                "embedding_version": embedding_version,
                "dim": int(ms.factors.shape[1]),
                "radius": ms.radius,
                "radius_rule": RADIUS_RULE,
                "users": int(ms.sample.user_rows.size),
                "group": cfg.multiselect_group,
                "prototypes": int(ms.sample.top_index.shape[0]),
                "top": int(ms.sample.top_index.shape[1]),
                "signal": {
                    "kind": "code",
                    "code_size": ms.code.size,
                    "codebook_version": codebook_version([str(i) for i in split.item_ids[ms.codebook].tolist()]),
                    "chosen_at_epsilon": ms.code.epsilon,
                    "rule": "the codebook size with the largest greedy k = 1 utility on the population itself",
                    "estimates": {str(c): round(u, 6) for c, u in ms.code.estimates.items()},
                },
            },
            "engine": {"engine": cfg.engine_name(), "chunk_users": cfg.chunk_users},
            "versions": _versions(),
            **extra,
        }
        timer.steps["total"] = round(time.perf_counter() - t_start, 3)
        manifest["timings_s"] = dict(timer.steps)
        return writer.commit(manifest)
