"""Where a Select's server CPU goes: the shipped server cut after each step of its call, in one run.

Each rung is ``recsvc serve`` (one worker, a durable SQLite ledger) with the Select call ending
after one more step than the rung before; the steps past the cut are replaced, in the server's
process, by a fixed answer (benchmark-only patches, :func:`patch`):

- ``echo``: the no-op echo server of :mod:`scripts.bench.service` (gRPC's sync stack, no recsvc code);
- ``gate``: the gate (authentication, rate limit, slots, the read, the request thread and back,
  metrics) with the request left undecoded, and a fixed answer;
- ``decode``: + the bounded pre-scan and the protobuf parse;
- ``prepare``: + the Select's checks, clipping and price (:meth:`SelectionServicer.price_select`);
- ``draw``: + the draw (rnm, 500 candidates, the request thread's CSPRNG), no ledger;
- ``full``: + the ledger's reserve and commit and the real answer's encoding: the shipped call.

Every rung but echo starts through this module (the same imports, the same process size). Each
round sends lone Selects to all the rungs call by call (the order reversed every call: the median
latency at concurrency 1), then h2load's Select at concurrency 32 to each in turn (QPS and the
server's CPU per call), the order reversed every other round. A step's cost is its rung's CPU
per call minus the rung before's, the median over the rounds of that round's difference.

Usage: ``.venv/bin/python -m scripts.bench.ladder [--rounds 6] [--tmp /dev/shm]``
The machine may be shared: compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from scripts.bench.harness import Server, bench_artifact, serve_command, stop, tree_cpu_seconds
from scripts.bench.service import h2load_body, h2load_run
from scripts.bench.transport import lone_calls

MODULE = "scripts.bench.ladder"
RUNGS = ("echo", "gate", "decode", "prepare", "draw", "full")
STEP = {
    "gate": "gRPC's aio stack and the gate, beyond the echo server",
    "decode": "the pre-scan and the parse",
    "prepare": "checks, clipping, the price",
    "draw": "the draw",
    "full": "the ledger (reserve, commit) and the answer's encoding",
}


def patch(rung: str) -> None:
    """Cuts the Select call after ``rung``'s step, in this process, before the server is built."""
    from recsvc.rng import thread_csprng
    from recsvc.service import codec, servicer
    from recsvc.service.draws import Price, Priced
    from recsvc.service.requests import draw
    from recsvc.v1 import selection_pb2 as pb

    if rung not in RUNGS[1:]:
        raise ValueError(f"no rung named {rung!r}; expected one of {', '.join(RUNGS[1:])}")
    canned = pb.SelectResponse(item_id="i1", item_ids=["i1"], item_rows=[1], mechanism="rnm", epsilon_spent=0.1)
    original = codec.decoder

    def unpriced(self: Any, caller: Any, request: Any) -> Any:
        return Priced(None, Price(1.0, True))

    def undecoded(message_type: Any, shape: Any, limits: Any) -> Any:
        return (lambda data: data) if message_type is pb.SelectRequest else original(message_type, shape, limits)

    def canned_answer(self: Any, p: Any) -> Any:
        return canned

    def drawn_answer(self: Any, p: Any) -> Any:
        draw(p, thread_csprng())
        return canned

    cls: Any = servicer.SelectionServicer
    if rung == "gate":
        codec.decoder = undecoded
    if rung in ("gate", "decode"):
        cls.price_select = unpriced
    if rung in ("gate", "decode", "prepare"):
        cls.answer = canned_answer
    elif rung == "draw":
        cls.answer = drawn_answer


class Rung(Server):
    def command(self, artifacts: Path, extra: tuple[str, ...]) -> list[str]:
        if self.kind == "echo":
            return [sys.executable, "-m", "scripts.bench.service", "--serve-echo", str(self.port)]
        serve = serve_command(artifacts, self.ledger_target, self.port, "--workers", "1", "--drain-delay", "0")
        return [sys.executable, "-m", MODULE, "--serve", self.kind, *serve[3:]]  # after "-m recsvc.app.cli"


def one_round(servers: dict[str, Server], order: list[str], r: int, n1: int, n32: int, tmp: Path) -> dict[str, dict]:
    seed = 1000 * r
    lone = asyncio.run(lone_calls(servers, order, n1, seed))
    out: dict[str, dict] = {k: {"c1_p50_us": statistics.median(lone[k]) * 1e6} for k in order}
    for j, kind in enumerate(order if r % 2 == 0 else order[::-1]):
        srv = servers[kind]
        body = h2load_body("rnm", f"h2load-{seed + j}", seed + j)
        cpu0 = tree_cpu_seconds(srv.proc.pid)
        h2 = h2load_run(srv.port, body, n32, 32, tmp)
        out[kind]["c32_qps"] = h2["qps"]
        out[kind]["c32_cpu_us"] = (tree_cpu_seconds(srv.proc.pid) - cpu0) / n32 * 1e6
    print(
        json.dumps({"round": r, **{k: {m: round(v, 1) for m, v in row.items()} for k, row in out.items()}}), flush=True
    )
    return out


def table(rounds: list[dict[str, dict]]) -> str:
    """The markdown table: each rung's medians, and each step's median difference to the rung before."""
    lines = [
        "| rung | c32 QPS ÷ echo | server CPU per call, µs | the step | its CPU, µs | lone p50, µs | its latency, µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, rung in enumerate(RUNGS):
        med = {m: statistics.median(rd[rung][m] for rd in rounds) for m in ("c32_cpu_us", "c1_p50_us")}
        qps = statistics.median(rd[rung]["c32_qps"] / rd["echo"]["c32_qps"] for rd in rounds)
        if i == 0:
            step, dcpu, dlat = "", "", ""
        else:
            prev = RUNGS[i - 1]
            dcpu = f"{statistics.median(rd[rung]['c32_cpu_us'] - rd[prev]['c32_cpu_us'] for rd in rounds):+,.0f}"
            dlat = f"{statistics.median(rd[rung]['c1_p50_us'] - rd[prev]['c1_p50_us'] for rd in rounds):+,.0f}"
            step = STEP[rung]
        lines.append(
            f"| `{rung}` | {qps:.2f} | {med['c32_cpu_us']:,.0f} | {step} | {dcpu} | {med['c1_p50_us']:,.0f} | {dlat} |"
        )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        patch(sys.argv[2])
        from recsvc.app.cli import main as cli

        return cli(sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds over every rung (default 6)")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the rounds here")
    ap.add_argument("--tmp", type=Path, help="where the ledgers go (default: the system's temporary directory)")
    args = ap.parse_args()
    if shutil.which("h2load") is None:
        print("ladder: needs h2load (apt-get install nghttp2-client)", file=sys.stderr)
        return 2
    n1, n32 = (40, 300) if args.quick else (200, 1500)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the servers are stopped on the way out
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ladder-", dir=args.tmp) as td:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        servers: dict[str, Server] = {}
        try:
            for rung in RUNGS:
                servers[rung] = Rung(rung, art, tmp)
            one_round(servers, list(RUNGS), 99, 20, 200, tmp)  # warm-up, not kept
            for r in range(args.rounds):
                rounds.append(one_round(servers, list(RUNGS) if r % 2 == 0 else list(RUNGS)[::-1], r, n1, n32, tmp))
        finally:
            for srv in servers.values():
                stop(srv.proc)
    print(table(rounds))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
