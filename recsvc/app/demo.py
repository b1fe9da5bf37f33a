"""`recsvc demo`: the main job end to end on real MovieLens-100K.

prep (reused when the artifact is already there) → evaluation → gRPC service with a fresh
ledger → private selections for real test users → the evaluation summary.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from recsvc.checks import ParamError
from recsvc.settings import add_arguments, from_namespace, setting

DEMO_EPSILON = 1.0
DEFAULT_RESULTS = Path("results/ml-100k")  # the demo's own output: replaced on every run


@dataclass(frozen=True)
class DemoConfig:
    """``recsvc demo``'s settings. ``trials`` and ``users`` are checked by the evaluation's own
    :func:`eval.evaluation.config.validate`, which states their constraints once."""

    artifacts: Path = setting(Path("artifacts/ml-100k"), help="artifact directory")
    results: Path | None = setting(
        None, help=f"evaluation output directory (default {DEFAULT_RESULTS}, replaced on every run)"
    )
    force: bool = setting(False, help="replace an existing --results directory")
    trials: int = setting(50, help="Monte Carlo trials per user, mechanism and ε")
    users: int | None = setting(None, help="evaluate only the first N test users")
    rebuild: bool = setting(False, help="rebuild the artifact even if it exists")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="end to end on ml-100k: prep, evaluate, serve, select privately",
        description="Builds artifacts/ml-100k (if missing), evaluates the default private mechanisms, starts the "
        "gRPC service on loopback and makes private selections for real test users.",
    )
    add_arguments(p, DemoConfig)
    p.set_defaults(func=run)


def _step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def _prep(artifacts: Path, rebuild: bool) -> None:
    from data_prep.pipeline import PrepConfig
    from data_prep.pipeline import run as prep

    if (artifacts / "manifest.json").is_file() and not rebuild:
        print(f"reusing {artifacts} (pass --rebuild to build it again)")
        return
    prep(PrepConfig(dataset="ml-100k", out=artifacts, force=rebuild))


def _eval_config(demo: DemoConfig):
    """The evaluation run. The default results directory is the demo's own and is replaced, so
    the demo can run again; a --results the user names is replaced only with --force."""
    from eval.evaluation.config import EvalConfig

    out = DEFAULT_RESULTS if demo.results is None else demo.results
    return EvalConfig(
        artifacts=demo.artifacts,
        out=out,
        trials=demo.trials,
        users=demo.users,
        force=demo.force or demo.results is None,
    )


def _history(user_id: str) -> list[str]:
    """The test user's own positive interactions: the private input `Recommend` scores."""
    import polars as pl

    from data_prep import datasets
    from data_prep.split import filter_implicit

    raw = datasets.load("ml-100k", None)
    df = filter_implicit(raw.df, datasets.INFO["ml-100k"].explicit, raw.source)
    return df.filter(pl.col("user").cast(pl.String) == user_id)["item"].cast(pl.String).to_list()


def _serve_and_select(artifacts: Path) -> None:
    import grpc

    from recsvc.artifact import load_artifact
    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    art = load_artifact(artifacts)
    cands = art.candidate_matrix(users=3)
    item_ids = art.items["item_id"].to_numpy()
    with tempfile.TemporaryDirectory(prefix="recsvc-demo-") as tmp:
        budget = 3.0
        handle = start(ServerConfig.of(artifacts, port=0, ledger=Path(tmp) / "ledger.db", budget=budget))
        print(f"service on 127.0.0.1:{handle.port}, per-user budget ε={budget}, fresh ledger")
        try:
            with Client(f"127.0.0.1:{handle.port}") as client:
                client.wait_ready()
                print("health:", client.health())
                for b, user in enumerate(cands.user_ids):
                    k = int(cands.count[b])
                    pairs = list(
                        zip(item_ids[cands.item_index[b, :k]].tolist(), cands.scores[b, :k].tolist(), strict=True)
                    )
                    rid = uuid.uuid4().hex
                    r = client.select(user, pairs, mechanism="auto", epsilon=DEMO_EPSILON, request_id=rid)
                    print(
                        f"user {user}: Select({k} candidates, auto, ε={DEMO_EPSILON}) → item {r.item_id} "
                        f"via {r.mechanism}; spent {r.epsilon_spent}, remaining {r.budget_remaining}"
                    )
                    again = client.select(user, pairs, mechanism="auto", epsilon=DEMO_EPSILON, request_id=rid)
                    print(
                        f"  retry of request {rid[:8]}… → item {again.item_id} (stored answer), "
                        f"remaining {again.budget_remaining}"
                    )
                user = str(cands.user_ids[0])
                history = _history(user)
                # Spend the rest of the budget; the ledger then refuses further requests.
                while True:
                    try:
                        r = client.recommend(user, history, mechanism="mgem", epsilon=DEMO_EPSILON)
                    except grpc.RpcError as exc:
                        print(f"user {user}: next request → {exc.code().name}: {exc.details()}")
                        break
                    print(
                        f"user {user}: Recommend(history of {len(history)} items, mgem, ε={DEMO_EPSILON}) → "
                        f"item {r.item_id}; remaining {r.budget_remaining}"
                    )
                b = client.budget(user)
                print(f"GetBudget({user}): spent {b.spent} of {b.budget} in {b.requests} requests")
        finally:
            handle.stop(grace=2.0)


def run(args: argparse.Namespace) -> int:
    from eval.evaluation.config import validate
    from eval.evaluation.outputs import summary
    from eval.evaluation.run import run as evaluate

    demo: DemoConfig = from_namespace(DemoConfig, args)
    cfg = _eval_config(demo)
    try:
        validate(cfg)  # every argument is checked before stage 1 builds anything
    except ParamError as exc:  # the eval's `out` is the demo's `results`
        raise type(exc)(exc.template.replace("{out}", "{results}"), **exc.values) from None
    _step("1/3 offline pipeline: artifacts/ml-100k")
    _prep(demo.artifacts, demo.rebuild)
    from recsvc.artifact import load_artifact

    acc = load_artifact(demo.artifacts).manifest.accuracy or {}
    print("SANSA accuracy on the test users: " + ", ".join(f"{k} {v:.4f}" for k, v in acc.items()))

    _step("2/3 evaluation: the default private mechanisms across ε")
    result = evaluate(cfg)

    _step("3/3 gRPC service: private selections for real test users")
    _serve_and_select(demo.artifacts)

    text, _ = summary(result)
    _step("evaluation summary")
    print(text)  # ends with the path of report.md
    return 0
