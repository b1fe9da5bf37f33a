"""Helpers for testing the service and the programs around it (like numpy.testing): a tiny
artifact, throwaway certificates, an in-process server and its client, `recsvc serve` as a real
process, and the `recsvc` command. The pytest fixtures built on them live in the conftest.py
files under tests/."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import polars as pl
import scipy.sparse as sp

from recsvc.artifact import ArtifactWriter
from recsvc.ledger.testing.cluster import free_port
from recsvc.model import Model
from recsvc.service.testing.attacks import RawStreams, grpc_frame, heavy_attack

__all__ = [
    "AUDIT_ALPHA",
    "BUNDLE_DIM",
    "BUNDLE_RADIUS",
    "N_ITEMS",
    "REPO",
    "RawStreams",
    "ServerProcess",
    "add_bundle",
    "add_policy",
    "candidates",
    "client_of",
    "free_port",
    "grpc_frame",
    "heavy_attack",
    "item_ids",
    "make_artifact",
    "make_certs",
    "make_model",
    "once_admitted",
    "rpc_error",
    "run_recsvc",
    "select_request",
    "served",
    "server_process",
]

# The server draws from its CSPRNG, so an audit of its answers cannot be seeded: each such test
# fails by chance with this probability, small enough that the suite's handful of them never flake.
AUDIT_ALPHA = 1e-6

if TYPE_CHECKING:
    from recsvc.service.client import Client
    from recsvc.service.server import ServerHandle

REPO = Path(__file__).resolve().parents[3]  # the source checkout the tests run in
N_ITEMS = 40


def item_ids(n: int = N_ITEMS) -> list[str]:
    return [f"it{k}" for k in range(n)]


def make_model(n_items: int = N_ITEMS, seed: int = 0) -> Model:
    """A random sparse SANSA-shaped model over :func:`item_ids` ``(n_items)``."""
    w1 = sp.random(n_items, n_items, density=0.3, random_state=seed, format="csr") + sp.eye(n_items, format="csr")
    w2 = sp.random(n_items, n_items, density=0.3, random_state=seed + 1, format="csr")
    return Model(w1=sp.csr_matrix(w1), w2=sp.csr_matrix(w2), item_ids=np.array(item_ids(n_items)))


def make_artifact(
    out: Path, rho_median: float | None = 0.5, seed: int = 0, n_items: int = N_ITEMS, bundle: bool = False
) -> Path:
    """A few dozen items with clip ranges, a random sparse SANSA-shaped model and 3 users' candidates;
    with ``bundle``, multi-selection's client bundle and population sample too (:func:`add_bundle`)."""
    rng = np.random.default_rng(seed)
    ids = item_ids(n_items)
    lo = rng.uniform(0.0, 0.1, n_items)
    hi = lo + rng.uniform(0.05, 1.0, n_items)
    model = make_model(n_items, seed)
    cands: dict[str, list[str | int | float]] = {"user_id": [], "rank": [], "item_id": [], "score": []}
    per_user = min(10, n_items)
    for u in range(3):
        picked = rng.choice(n_items, per_user, replace=False)
        cands["user_id"] += [f"u{u}"] * per_user
        cands["rank"] += list(range(per_user))
        cands["item_id"] += [ids[k] for k in picked]
        cands["score"] += rng.uniform(0, 1, per_user).tolist()
    manifest: dict = {"dataset": "toy", "seed": seed}
    if rho_median is not None:
        manifest["population_spearman"] = {"median": rho_median, "mean": rho_median, "frac_positive": 0.5, "users": 10}
    with ArtifactWriter(out) as w:
        w.write_items(pl.DataFrame({"item_id": ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(pl.DataFrame(cands).cast({"rank": pl.Int32}))
        w.write_model(model)
        if bundle:
            manifest["multiselect"] = add_bundle(w, model, seed)
        return w.commit(manifest)


BUNDLE_DIM, BUNDLE_RADIUS, BUNDLE_USERS, BUNDLE_TOP, BUNDLE_CODE_SIZE = 4, 1.0, 60, 10, 4


def add_bundle(w: ArtifactWriter, model: Model, seed: int = 0) -> dict[str, Any]:
    """Writes a client bundle (a random embedding of d = BUNDLE_DIM, R = BUNDLE_RADIUS) and a
    population sample of BUNDLE_USERS random histories (clipped embeddings, top BUNDLE_TOP unseen
    items by the model's scores) into the artifact being written; returns its manifest section."""
    from recsvc.model import top_k
    from recsvc.multiselection import Population, blind_codebook, clip_l1, embed

    rng = np.random.default_rng(seed + 7)
    n = len(model.item_ids)
    factors = rng.normal(size=(n, BUNDLE_DIM)) / np.sqrt(n)
    histories = [rng.choice(n, int(rng.integers(1, 8)), replace=False) for _ in range(BUNDLE_USERS)]
    emb = clip_l1(np.stack([embed(h, factors) for h in histories]), BUNDLE_RADIUS)
    scores = np.stack([model.score_one(np.sort(h)) for h in histories])
    for u, h in enumerate(histories):
        scores[u, h] = -np.inf
    top = top_k(scores, BUNDLE_TOP)
    pop = Population(emb, top.index.astype(np.int64), top.score, n)
    book = model.item_ids[blind_codebook(pop, BUNDLE_CODE_SIZE)]
    version = w.write_client_bundle(model.item_ids, factors, BUNDLE_RADIUS, model, book)
    w.write_multiselect_population(emb, top.index, top.score, n)
    return {
        "embedding_version": version,
        "dim": BUNDLE_DIM,
        "radius": BUNDLE_RADIUS,
        "radius_rule": "fixed (test artifact)",
        "users": BUNDLE_USERS,
        "group": 1,  # random histories, no real user's
        "prototypes": BUNDLE_USERS,
        "top": BUNDLE_TOP,
        "signal": {"kind": "code", "code_size": BUNDLE_CODE_SIZE},
    }


def add_policy(
    art: Path, rows: list[tuple[float, int, str, float, int]], checked: bool = True, info: dict | None = None
) -> Path:
    """Re-publishes the artifact ``art`` with a policy.parquet of ``rows`` (ε, k, mechanism,
    expected MSE, rank), hashed in its manifest, and ``info`` as the manifest's policy section.
    ``checked=False`` writes the file as given, bypassing the writer's checks (to test that the
    server refuses a bad table)."""
    from recsvc.artifact import POLICY, POLICY_SCHEMA, load_artifact

    frame = pl.DataFrame(
        [(*r, "exact") for r in rows],
        orient="row",
        schema=POLICY_SCHEMA,
    )
    old = load_artifact(art)
    content = {k: v for k, v in old.manifest.to_dict().items() if k not in ("files", "format_version")}
    if info is not None:
        content["policy"] = info
    with ArtifactWriter(art, force=True) as w:
        w.keep(art, [f for f in old.manifest.files if f != POLICY])
        if checked:
            w.write_policy(frame)
        else:
            frame.write_parquet(w.tmp / POLICY)
        return w.commit(content)


def candidates(n: int = 20, seed: int = 1) -> list[tuple[str, float]]:
    rng = np.random.default_rng(seed)
    picked = rng.choice(N_ITEMS, n, replace=False)
    return [(f"it{k}", float(s)) for k, s in zip(picked, rng.uniform(0, 1, n), strict=False)]


def select_request(user: str, rid: str, epsilon: float = 0.5, seed: int = 1) -> Any:
    """A SelectRequest (``rnm``) over :func:`candidates` ``(seed=seed)`` in the id encoding."""
    from recsvc.v1 import selection_pb2 as pb

    cands = candidates(seed=seed)
    return pb.SelectRequest(
        user_id=user,
        request_id=rid,
        mechanism="rnm",
        epsilon=epsilon,
        item_ids=[i for i, _ in cands],
        scores=[s for _, s in cands],
    )


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def _self_signed(d: Path, name: str, cn: str) -> None:
    """``<name>.pem`` and ``<name>.key``: a self-signed CA certificate with CN=``cn``."""
    _openssl(
        d,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={cn}",
    )


def _signed(d: Path, name: str, cn: str, ext: str) -> tuple[Path, Path]:
    """``<name>.pem`` and ``<name>.key``, CN=``cn``, signed by the CA ``ca.pem`` in ``d`` with the
    OpenSSL extensions file ``ext`` (its subjectAltName)."""
    _openssl(
        d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}"
    )
    _openssl(
        d,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        ext,
    )
    return d / f"{name}.pem", d / f"{name}.key"


def make_certs(d: Path) -> dict[str, Path]:
    """A throwaway CA, a server cert for localhost/127.0.0.1 and a client cert (openssl CLI)."""
    _self_signed(d, "ca", "recsvc-test-ca")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _signed(d, "server", "localhost", "san.ext")
    _signed(d, "client", "recsvc-test-client", "san.ext")
    _self_signed(d, "rogue", "rogue")  # a second, unrelated CA: its certificate must be refused under mTLS
    return {
        k: d / f"{k}"
        for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "rogue.pem", "rogue.key")
    }


def make_client_cert(d: Path, name: str, san: str) -> tuple[Path, Path]:
    """A client certificate ``<name>.pem`` and key, signed by :func:`make_certs`' CA in ``d``, with
    CN=<name> and the OpenSSL ``subjectAltName`` value ``san`` (e.g. ``URI:spiffe://x,email:a@b``)."""
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n")
    return _signed(d, name, name, ext.name)


def run_recsvc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The `recsvc` command run to completion in the checkout (output captured as text)."""
    return subprocess.run(
        [sys.executable, "-m", "recsvc.app.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def served(artifact: Path, ledger: Path | str, **config: Any) -> Iterator[ServerHandle]:
    """An in-process server (``start``) on a free port, configured by flat ServerConfig
    parameters (``max_batch=3``); stopped with 1 s of grace afterwards."""
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    handle = start(ServerConfig.of(artifact, port=0, ledger=ledger, **config))
    try:
        yield handle
    finally:
        handle.stop(grace=1)


def rpc_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    """The status code and details of the RpcError that ``fn(*args, **kwargs)`` must raise."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    raise AssertionError(f"{getattr(fn, '__name__', fn)} returned; expected it to raise grpc.RpcError")


def once_admitted(call: Callable[[], Any], within: float = 60.0) -> Any:
    """``call()``'s answer, calling again while it is refused RESOURCE_EXHAUSTED: the calls that
    held a bound may have ended a moment before the server gave their share back."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


@contextmanager
def client_of(handle: ServerHandle) -> Iterator[Client]:
    """A client of an in-process server that never retries (a test sees every refusal)."""
    from recsvc.service.client import Client

    with Client(f"127.0.0.1:{handle.port}", retries=0) as c:
        yield c


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()


def serve_argv(artifacts: Path, ledger: Path | str, port: int, *extra: str) -> list[str]:
    """The command line of `recsvc serve` on ``artifacts`` and ``ledger`` at ``port``, then ``extra``."""
    cmd = [sys.executable, "-m", "recsvc.app.cli", "serve", "--artifacts", str(artifacts), "--ledger", str(ledger)]
    return [*cmd, "--port", str(port), *extra]


@contextmanager
def server_process(
    artifacts: Path, ledger: Path | str, *extra: str, port: int = 0, timeout: float = 60.0, log_path: Path | None = None
) -> Iterator[ServerProcess]:
    """`recsvc serve` as a real subprocess; yields once it printed its listening line. A PostgreSQL
    ``ledger`` URL needs ``log_path``."""
    log_path = log_path or Path(ledger).with_suffix(f".{time.monotonic_ns()}.log")
    cmd = serve_argv(artifacts, ledger, port, "--drain-delay", "0.3", *extra)
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE above: never None
            if not line:
                break
            m = re.search(r"listening on [^\s]+:(\d+)", line)
            if m:
                yield ServerProcess(proc, int(m.group(1)), log_path)
                break
        else:
            raise TimeoutError(f"server did not start within {timeout}s")
        if not line:
            raise RuntimeError(f"server exited early ({proc.wait()}):\n{log_path.read_text()}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
