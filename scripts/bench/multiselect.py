"""MultiSelect latency: p50/p99 at concurrency 1 against an echo server in the same run.

By default it builds an ml20m-shape-sized artifact (20,720 items, d = 32, a population sample of
1,000 users × their top 100 items, drawn Zipf-popular as real top lists are) in a temp dir, then
starts, each in its own process and one after the other, `recsvc serve` on it (durable SQLite
ledger) and an echo server on the same sync gRPC stack that parses a MultiSelectRequest and
answers k fixed items. Requests are sent one at a time over loopback, each with a fresh
request_id and a fresh device signal: with ``--signal code`` (the default, what a device sends)
a population user's code by exact randomised response, whose answer the server computes once per
(code, ε, k) and then keeps, so after the first C requests every answer is a kept one; with
``--signal lattice`` the clipped embedding's lattice point + exact discrete Laplace noise
(integers), a greedy per request. Each is sent charged to a user (a ledger commit each),
uncharged (no user_id), and to the echo server. It also times the server's steps in-process
(posterior weights and greedy of a fresh signal, the E·s baseline), and each server's CPU time
per request (user + system, from outside), which a loaded machine inflates far less than latency.

Usage: .venv/bin/python -m scripts.bench.multiselect [--artifacts DIR] [--requests 2000] [--k 10] [--top 100]
       [--signal code|lattice]   (target: charged p99 ≤ 10 ms at k = 10 on ml20m-shape)
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.harness import REPO, free_port, launch, serve_command, stop, tree_cpu_seconds

MODULE = "scripts.bench.multiselect"
ML20M_ITEMS, DIM, USERS, TOP, RADIUS, CODE_SIZE = 20_720, 32, 1000, 100, 1.0, 16


def multiselect_artifact(out: Path, n_items: int = ML20M_ITEMS, seed: int = 0, top: int = TOP) -> Path:
    """An artifact with a client bundle (random orthonormal-ish E, R = 1, a sparse random W1/W2)
    and a population sample whose top lists favour popular items (Zipf over the catalog)."""
    import polars as pl
    import scipy.sparse as sp

    from recsvc.artifact import ArtifactWriter
    from recsvc.model import Model
    from recsvc.multiselection import Population, blind_codebook, clip_l1

    rng = np.random.default_rng(seed)
    ids = np.array([f"item{k}" for k in range(n_items)])
    lo = rng.uniform(0, 0.05, n_items)
    hi = lo + rng.uniform(0.01, 1.0, n_items)
    factors = rng.normal(size=(n_items, DIM)) / np.sqrt(n_items)
    w1 = sp.random(n_items, 256, density=0.02, random_state=seed, format="csr")
    w2 = sp.random(256, n_items, density=0.02, random_state=seed + 1, format="csr")
    popularity = 1.0 / np.arange(1, n_items + 1)
    popularity /= popularity.sum()
    top_index = np.stack([rng.choice(n_items, top, replace=False, p=popularity) for _ in range(USERS)])
    top_score = -np.sort(-rng.gamma(2.0, 0.05, (USERS, top)), axis=1)
    emb = clip_l1(rng.laplace(0, 0.1, (USERS, DIM)), RADIUS)
    with ArtifactWriter(out) as w:
        w.write_items(pl.DataFrame({"item_id": ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(
            pl.DataFrame({"user_id": ["u"], "rank": [0], "item_id": ["item0"], "score": [0.1]}).cast({"rank": pl.Int32})
        )
        book = ids[blind_codebook(Population(emb, top_index.astype(np.int64), top_score, n_items), CODE_SIZE)]
        version = w.write_client_bundle(ids, factors, RADIUS, Model(w1=w1, w2=w2, item_ids=ids), book)
        w.write_multiselect_population(emb, top_index, top_score, n_items)
        return w.commit(
            {
                "dataset": "bench-multiselect",
                "seed": seed,
                "population_spearman": {"median": 0.3, "mean": 0.3, "frac_positive": 0.8, "users": 100},
                "multiselect": {
                    "embedding_version": version,
                    "dim": DIM,
                    "radius": RADIUS,
                    "radius_rule": "fixed (benchmark)",
                    "users": USERS,
                    "group": 1,  # random histories, no real user's
                    "prototypes": USERS,
                    "top": top,
                },
            }
        )


def signals(population_embeddings: np.ndarray, radius: float, epsilon: float, count: int, seed: int = 1) -> np.ndarray:
    """Lattice signals of population-like users: a population embedding's lattice point + exact
    discrete Laplace noise (what a device sends)."""
    from recsvc.multiselection import Lattice, Words

    rng = np.random.default_rng(seed)
    grid = Lattice.of(radius, population_embeddings.shape[1])
    picks = rng.integers(0, len(population_embeddings), count)
    words = Words(rng)
    return np.stack([grid.signal(population_embeddings[i], epsilon, words) for i in picks])


def codes(artifacts: Path, epsilon: float, count: int, seed: int = 1) -> list[int]:
    """Code signals of population-like users: a prototype's own code by exact randomised response."""
    from recsvc.artifact import load_artifact
    from recsvc.multiselection import Words, prototype_codes, randomized_response

    art = load_artifact(artifacts)
    own = prototype_codes(art.multiselect_population, art.client_bundle.codebook)
    rng = np.random.default_rng(seed)
    words = Words(rng)
    size = art.client_bundle.code_size
    return [randomized_response(int(own[i]), size, epsilon, words) for i in rng.integers(0, own.size, count)]


def serve_echo(port: int, k: int) -> None:
    """No-op MultiSelect server on the shipped server's stack (sync, 16 threads): parse, answer k fixed items."""
    from concurrent import futures

    import grpc

    from recsvc.v1 import selection_pb2 as pb

    items = [f"item{j}" for j in range(k)]

    def echo(req: pb.MultiSelectRequest, _ctx: Any) -> pb.MultiSelectResponse:
        return pb.MultiSelectResponse(item_ids=items[: req.k], request_id=req.request_id)

    handler = grpc.method_handlers_generic_handler(
        "recsvc.v1.PrivateSelection",
        {
            "MultiSelect": grpc.unary_unary_rpc_method_handler(
                echo,
                request_deserializer=pb.MultiSelectRequest.FromString,
                response_serializer=pb.MultiSelectResponse.SerializeToString,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[handler], options=[("grpc.so_reuseport", 0)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    gc.freeze()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def request_fields(bundle: Any, kind: str, sig: np.ndarray, code: list[int]) -> list[dict[str, Any]]:
    """Each request's signal fields: the code and codebook version, or the lattice signal and grid step."""
    if kind == "code":
        return [{"code": c, "codebook_version": bundle.codebook_version} for c in code]
    return [{"lattice_signal": s.tolist(), "grid_step": bundle.lattice.step} for s in sig]


def measure(port: int, sent: list[dict[str, Any]], version: str, k: int, epsilon: float, charged: bool) -> np.ndarray:
    """Seconds per MultiSelect call, one at a time, each with a fresh request_id."""
    import grpc

    from recsvc.v1 import selection_pb2 as pb
    from recsvc.v1 import selection_pb2_grpc as pb_grpc

    out = np.empty(len(sent))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.PrivateSelectionStub(channel)
        for i, fields in enumerate(sent):
            req = pb.MultiSelectRequest(
                user_id=f"user{i % 1000}" if charged else "",
                request_id=uuid.uuid4().hex,
                embedding_version=version,
                k=k,
                epsilon=epsilon,
                **fields,
            )
            t0 = time.perf_counter()
            stub.MultiSelect(req, timeout=30)
            out[i] = time.perf_counter() - t0
    return out


def steps(artifacts: Path, sig: np.ndarray, code: list[int], k: int, epsilon: float) -> dict[str, float]:
    """In-process medians (ms) of the response's steps, no gRPC and no ledger."""
    from recsvc.artifact import load_artifact
    from recsvc.multiselection import (
        Lattice,
        baseline,
        code_log_likelihood,
        greedy,
        lattice_log_likelihood,
        prototype_codes,
        weights_from_log_likelihood,
    )

    art = load_artifact(artifacts)
    pop = art.multiselect_population.warm()
    bundle = art.client_bundle
    grid = Lattice.of(bundle.radius, bundle.dim)
    points = grid.point(pop.embeddings)
    own = prototype_codes(pop, bundle.codebook)
    times: dict[str, list[float]] = {
        "posterior": [],
        "greedy": [],
        "baseline E·s": [],
        "code greedy (a new answer)": [],
    }
    for c in code:
        t0 = time.perf_counter()
        greedy(pop, weights_from_log_likelihood(code_log_likelihood(c, own, epsilon)), k)
        times["code greedy (a new answer)"].append(time.perf_counter() - t0)
    for s in sig:
        t0 = time.perf_counter()
        w = weights_from_log_likelihood(lattice_log_likelihood(s, points, epsilon, grid))
        t1 = time.perf_counter()
        greedy(pop, w, k)
        t2 = time.perf_counter()
        baseline(s * grid.step, bundle.embedding, k)
        t3 = time.perf_counter()
        times["posterior"].append(t1 - t0)
        times["greedy"].append(t2 - t1)
        times["baseline E·s"].append(t3 - t2)
    return {name: float(np.median(v)) * 1e3 for name, v in times.items()}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-echo":
        serve_echo(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--artifacts", type=Path, help="an artifact with a client bundle (default: build ml20m-shape-sized)"
    )
    ap.add_argument("--requests", type=int, default=2000, help="requests per row (default 2000)")
    ap.add_argument("--k", type=int, default=10, help="items per answer (default 10)")
    ap.add_argument("--epsilon", type=float, default=1.0, help="the device's ε (default 1.0)")
    ap.add_argument(
        "--top", type=int, default=TOP, help="items per population user in the built artifact (default 100)"
    )
    ap.add_argument(
        "--signal", choices=("code", "lattice"), default="code", help="what the device sends (default code)"
    )
    args = ap.parse_args()

    from recsvc.artifact import load_artifact

    with tempfile.TemporaryDirectory() as tmp:
        artifacts = args.artifacts or multiselect_artifact(Path(tmp) / "art", top=args.top)
        art = load_artifact(artifacts)
        bundle, pop = art.client_bundle, art.multiselect_population
        sig = signals(pop.embeddings, bundle.radius, args.epsilon, args.requests)
        code = codes(artifacts, args.epsilon, args.requests)
        sent = request_fields(bundle, args.signal, sig, code)
        print(
            f"artifact {artifacts if args.artifacts else 'ml20m-shape-sized (built)'}: {len(bundle.item_ids)} items, "
            f"d = {bundle.dim}, population {pop.size} × top {pop.top_index.shape[1]}, C = {bundle.code_size}; "
            f"{args.signal} signal, k = {args.k}, ε = {args.epsilon}; concurrency 1, loopback"
        )
        med = steps(artifacts, sig[:200], code[:200], args.k, args.epsilon)
        print("in-process medians (ms): " + ", ".join(f"{n} {v:.3f}" for n, v in med.items()))
        rows: list[tuple[str, np.ndarray, float]] = []  # label, latencies (s), server CPU (s) per request

        def row(label: str, pid: int, port: int, charged: bool) -> None:
            cpu0 = tree_cpu_seconds(pid)
            lat = measure(port, sent, bundle.version, args.k, args.epsilon, charged)
            rows.append((label, lat, (tree_cpu_seconds(pid) - cpu0) / len(sent)))

        port = free_port()
        proc = launch(serve_command(artifacts, Path(tmp) / "ledger.db", port), "server")
        try:
            measure(port, sent[:50], bundle.version, args.k, args.epsilon, True)  # warm-up
            row("MultiSelect, charged", proc.pid, port, True)
            row("MultiSelect, no user_id", proc.pid, port, False)
        finally:
            stop(proc)
        port = free_port()
        echo = launch([sys.executable, "-m", MODULE, "--serve-echo", str(port), str(args.k)], "echo server", REPO)
        try:
            measure(port, sent[:50], bundle.version, args.k, args.epsilon, False)
            row("echo (parse, k fixed items)", echo.pid, port, False)
        finally:
            stop(echo)
    echo_p99 = float(np.percentile(rows[-1][1], 99))
    head = f"{'row':<30} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/echo':>9}"
    print(head + f" {'server CPU ms/req':>18}")
    for label, lat, cpu in rows:
        p99 = float(np.percentile(lat, 99))
        print(
            f"{label:<30} {len(lat):>8} {np.percentile(lat, 50) * 1e3:>8.2f} {p99 * 1e3:>8.2f} "
            f"{lat.max() * 1e3:>8.2f} {p99 / echo_p99:>9.1f} {cpu * 1e3:>18.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
