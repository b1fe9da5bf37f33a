"""``recsvc policy``: rebuild the `auto` policy table of an existing artifact.

The table's input is the artifact's own ``population.parquet`` (the sampled sensitivity
population's top candidates, written by ``recsvc prep``), so no dataset files are needed and
the result equals what ``recsvc prep`` wrote for the same settings. The artifact is replaced
atomically (a staged copy whose unchanged files are hard links, then one rename): a failure at
any point, or bad input, leaves it as it was.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from recsvc.artifact import MANIFEST, POLICY, ArtifactWriter, load_artifact
from recsvc.engines import make_engine
from recsvc.policy import DEFAULT_TRIALS, DEFAULT_USERS, PolicySpec, build_table, sample_users
from recsvc.staging import check_out


def rebuild(
    artifacts: Path,
    users: int = DEFAULT_USERS,
    trials: int = DEFAULT_TRIALS,
    seed: int | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Recomputes ``policy.parquet`` of the artifact ``artifacts`` over at most ``users`` of its
    population.parquet users (seeded sample), with ``trials`` Monte Carlo selections per user where
    no exact expectation exists; ``seed`` None = the artifact's own seed (what ``recsvc prep`` used).
    Every check runs before any work; the artifact is replaced only once the table is complete."""
    PolicySpec(trials=trials, users=users).check()
    art = load_artifact(artifacts)  # every sha256 checked; a missing artifact is an ArtifactError
    population = art.population_matrix()  # refused, before any work, if the artifact has none
    gamma = art.manifest.default_gamma  # rs/rs_improved with the γ the paper used on this data, as prep does
    spec = PolicySpec(
        trials=trials,
        seed=(art.manifest.seed or 0) if seed is None else seed,
        users=users,
        params={} if gamma is None else {"gamma": gamma},
    ).check()
    check_out(artifacts, force=True, param="artifacts")  # e.g. never the working directory itself
    pick = sample_users(len(population.user_ids), spec.users, spec.seed)
    if len(pick) < len(population.user_ids):
        population = population.take(pick)
    print(
        f"[policy] {len(spec.mechanisms)} mechanisms × {len(spec.epsilons)} ε × k ∈ {list(spec.ks)} on "
        f"{len(pick)} population users",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    engine = make_engine("local", workers, progress=progress)
    try:
        table, n_users = build_table(population, spec, engine, progress)
    finally:
        engine.close()
    content = art.manifest.to_dict()
    for key in ("files", "format_version"):  # the writer sets both
        content.pop(key)
    content["policy"] = spec.describe(n_users, int(population.count.max()))
    content["timings_s"] = {**content.get("timings_s", {}), "policy": round(time.perf_counter() - t0, 3)}
    with ArtifactWriter(artifacts, force=True, param="artifacts") as writer:
        writer.keep(art.path, [f for f in art.manifest.files if f not in (POLICY, MANIFEST)])
        writer.write_policy(table)
        return writer.commit(content)
