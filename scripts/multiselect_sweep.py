"""The signal sweep of docs/concepts/multi-selection.md ("Choosing what the device sends"): greedy
k = 1 utility fraction on an artifact's test users for each candidate signal, beside the no-signal
answer (ε = 0), with 95 % CIs over users.

- ``dN`` / ``skip1-dN``: the lattice signal of the top-N SVD directions (or directions 2..N+1),
  each with its own radius R (the median rule) and its own population prototypes (prep's code).
- ``code-C`` (``--codes``): the code signal devices send (:mod:`recsvc.multiselection.code`) for
  each C of ``CODE_SIZES``: the device's best of the codebook (the greedy's first C for no signal)
  by its true scores, its index sent by exact C-ary randomised response; the server's posterior
  gives each prototype the likelihood of its own code. What is served is the C prep chose
  (``recsvc eval-multiselect`` measures it); this sweeps the others.

Run from the repository root, e.g.
``.venv/bin/python -m scripts.multiselect_sweep --artifact artifacts/ml-100k --dataset ml-100k``.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from data_prep.config import PrepConfig
from data_prep.embedding import choose_radius, fit_embedding, population_prototypes, user_embeddings
from data_prep.pipeline import _dataset_info, _load_and_split
from recsvc.artifact import load_artifact
from recsvc.multiselection import (
    CODE_SIZES,
    Lattice,
    Population,
    Words,
    blind_codebook,
    clip_l1,
    code_of,
    greedy,
    prototype_codes,
    randomized_response,
    respond_code,
    respond_lattice,
)


def _ci(u: np.ndarray) -> str:
    return f"{100 * u.mean():.1f} ± {100 * 1.96 * u.std() / math.sqrt(u.size):.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--preset")
    p.add_argument("--users", type=int, help="synthetic: the prep run's --users")
    p.add_argument("--interactions", type=int, help="synthetic: the prep run's --interactions")
    p.add_argument("--test-users", type=int, default=100, help="the first N test users (default 100)")
    p.add_argument("--trials", type=int, default=5, help="signals per user and ε (default 5)")
    p.add_argument("--codes", action="store_true", help="sweep the best-of-C code instead of the embeddings")
    a = p.parse_args()
    sizes = {"preset": a.preset, "users": a.users, "interactions": a.interactions} if a.dataset == "synthetic" else {}
    cfg = PrepConfig(dataset=a.dataset, **sizes)  # the split prep made: the same dataset, sizes and seed
    cfg.validate()
    split, _, _ = _load_and_split(cfg, _dataset_info(cfg))
    model = load_artifact(a.artifact).client_bundle.model
    n = min(a.test_users, len(split.test.user_ids))
    xin = split.test.inputs[:n]
    raw = model.score(xin)
    seen = xin.toarray() > 0
    v = np.where(seen, 0.0, raw)
    frac = v / v.max(axis=1, keepdims=True)
    if a.codes:
        _codes(load_artifact(a.artifact).multiselect_population.warm(), np.where(seen, -np.inf, raw), frac, a.trials)
        return
    full = fit_embedding(split.train, 33, cfg.seed)
    for name, cols in [(f"d{d}", slice(0, d)) for d in (1, 2, 4, 8, 16, 32)] + [
        (f"skip1-d{d}", slice(1, d + 1)) for d in (1, 2, 4, 8)
    ]:
        e = np.ascontiguousarray(full[:, cols])
        emb = user_embeddings(split.train, e)
        r = choose_radius(emb)
        pro = population_prototypes(split.train, emb, r, model, 5000, 5, 100, cfg.seed)
        pop = Population(pro.embeddings, pro.top_index.astype(np.int64), pro.top_score, len(split.item_ids)).warm()
        grid = Lattice.of(r, e.shape[1])
        points = grid.point(pop.embeddings)
        mine = clip_l1(user_embeddings(xin, e), r)
        blind = int(greedy(pop, np.full(pop.size, 1 / pop.size), 1)[0])
        cells = [f"0: {_ci(frac[:, blind])}"]
        for eps in (1.0, 4.0, 16.0):
            words = Words(np.random.default_rng(1))
            u = np.array(
                [
                    np.mean(
                        [
                            frac[b, respond_lattice(pop, points, grid.signal(mine[b], eps, words), eps, grid, 1)[0]]
                            for _ in range(a.trials)
                        ]
                    )
                    for b in range(n)
                ]
            )
            cells.append(f"{eps:g}: {_ci(u)}")
        print(name, f"R={r:.3f}", "; ".join(cells), flush=True)


def _codes(pop: Population, dev: np.ndarray, frac: np.ndarray, trials: int) -> None:
    n = dev.shape[0]
    full = blind_codebook(pop, max(CODE_SIZES))
    for c in CODE_SIZES:
        book = full[:c]
        proto = prototype_codes(pop, book)
        user = np.array([code_of(row) for row in dev[:, book]])
        cells = [f"exact {_ci(frac[np.arange(n), book[user]])}"]
        for eps in (0.5, 1.0, 2.0, 4.0, 16.0):
            answer = np.array([respond_code(pop, proto, y, eps, 1)[0] for y in range(c)])
            words = Words(np.random.default_rng(0))
            sent = np.array([[randomized_response(int(x), c, eps, words) for x in user] for _ in range(trials)])
            cells.append(f"{eps:g}: {_ci(frac[np.arange(n), answer[sent]].mean(axis=0))}")
        print(f"code-{c}", "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
