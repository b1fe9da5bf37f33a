"""What a thread hop costs a lone gRPC call: bare echo servers, no recsvc code in the call path.

Each kind is its own server process answering a 10 kB message with its first 16 bytes:

- ``sync``: grpcio's synchronous server (a thread pool);
- ``aio-inline``: ``grpc.aio``, the handler on the event loop;
- ``aio-hop``: ``grpc.aio``, the handler's work in a thread of :class:`recsvc.service.threads.Threads`
  (the server's request threads) and back;
- ``aio-hop-nobdp``: ``aio-hop`` with gRPC's BDP probe pings off.

Every round starts every server afresh and sends the lone calls to each in turn (the order
reversed every call), so the host's drifting load falls on all alike; it prints each kind's
median latency and the median of the rounds' ratios to the first kind.

Usage: ``.venv/bin/python -m scripts.bench.echo_hop [--kinds sync,aio-inline,aio-hop] [--rounds 5] [--calls 600]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from scripts.bench.harness import free_port, launch, stop

SERVICE, METHOD = "bench.Echo", "/bench.Echo/Call"
KINDS = ("sync", "aio-inline", "aio-hop", "aio-hop-nobdp")


def _echo(request: bytes, _context: object) -> bytes:
    return request[:16]


def serve(kind: str, port: int) -> None:
    options = [("grpc.http2.bdp_probe", 0)] if kind.endswith("nobdp") else []
    if kind == "sync":
        server = grpc.server(ThreadPoolExecutor(16), options=options)
        handler = grpc.unary_unary_rpc_method_handler(_echo)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Call": handler}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print(f"listening on 127.0.0.1:{port}", flush=True)  # what harness.launch waits for
        server.wait_for_termination()
        return

    async def main() -> None:
        from recsvc.service.threads import Threads

        threads = Threads(16, "echo")

        async def hop(request: bytes, context: object) -> bytes:
            return await threads.run(lambda: _echo(request, context))

        async def inline(request: bytes, context: object) -> bytes:
            return _echo(request, context)

        handler = grpc.unary_unary_rpc_method_handler(inline if kind == "aio-inline" else hop)
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Call": handler}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS[:3]), help=f"comma-separated, from {', '.join(KINDS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=600, help="lone calls per kind per round")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kind(s) {', '.join(unknown)}; expected some of {', '.join(KINDS)}")
    payload = os.urandom(10_000)
    medians: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        ports = {k: free_port() for k in kinds}
        procs = {
            k: launch([sys.executable, "-m", "scripts.bench.echo_hop", "--serve", k, str(ports[k])], k) for k in kinds
        }
        channels = {k: grpc.insecure_channel(f"127.0.0.1:{ports[k]}") for k in kinds}
        try:
            calls = {k: channels[k].unary_unary(METHOD) for k in kinds}
            for k in kinds:
                for _ in range(50):  # warm-up
                    calls[k](payload)
            latency: dict[str, list[float]] = {k: [] for k in kinds}
            for j in range(args.calls):
                for k in kinds if j % 2 else kinds[::-1]:
                    t0 = time.perf_counter()
                    calls[k](payload)
                    latency[k].append(time.perf_counter() - t0)
        finally:
            for k in kinds:
                channels[k].close()
                stop(procs[k])
        for k in kinds:
            medians[k].append(statistics.median(latency[k]) * 1e6)
        print(f"round {r}: " + ", ".join(f"{k} {medians[k][-1]:.0f} us" for k in kinds), flush=True)
    base = kinds[0]
    for k in kinds:
        ratio = statistics.median(a / b for a, b in zip(medians[k], medians[base], strict=True))
        print(f"{k}: median {statistics.median(medians[k]):.0f} us, {ratio:.3f} x {base}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
