"""What a refused request costs the server: CPU and memory per refusal.

Each case sends one kind of hostile request (pre-serialised raw bytes, through a generic gRPC
call with identity serializers) to a fresh ``recsvc serve`` process, ``--reps`` times, and
reads the server process's CPU time (user + system, every thread) around each call and its
resident memory: RSS before and after, and the peak (VmHWM, reset before the case through
/proc/PID/clear_refs where the kernel allows it). The message itself has to be received, so a
refusal's floor is the message's size in memory; anything above that is decoding work.

Cases: 3,000,000 one-character candidates (15 MB), the same in the columnar
encoding, a Recommend with 5,000,000 history entries, a SelectBatch whose one item holds the
3M candidates, a SelectBatch of 1,000 × 8,000 empty candidates (16 MB) and its gzip form, 15 MB
of malformed bytes, the 3M-candidate message from an unauthenticated
caller (server with a token file), a message over --max-message-bytes, and for comparison one
valid 500-candidate Select.

``--floor`` also sends every case to a bare gRPC server that refuses without looking (the cost of
receiving the message at all). ``--src DIR`` runs the server from another source tree (e.g. ``git archive`` of an older commit
unpacked in DIR) to measure the same cases before a change; only cases whose flags that tree
knows are meaningful there.

Usage: ``.venv/bin/python -m scripts.bench.refusals [--reps 20] [--floor] [--src DIR] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from recsvc.service.codec import length_delimited as _field
from scripts.bench.harness import REPO, bench_artifact, free_port, launch, serve_command, stop

MB = 1e6


def _select_head(user: str) -> bytes:
    from recsvc.v1 import selection_pb2 as pb

    return pb.SelectRequest(user_id=user, mechanism="rnm", epsilon=0.5, request_id=uuid.uuid4().hex).SerializeToString()


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    payload: bytes
    expect: str  # the status code name the server must answer
    token_file: bool = False  # run this case against a server with a token file (the client sends none)
    max_message_bytes: int | None = None
    compression: grpc.Compression = grpc.Compression.NoCompression  # how the client sends it


def cases() -> list[Case]:
    from recsvc.v1 import selection_pb2 as pb

    cands_3m = _select_head("victim") + _field(2, _field(1, b"1")) * 3_000_000
    empty_batch = _field(1, _select_head("victim") + _field(2, b"") * 8000) * 1000  # every per-request limit kept
    valid = pb.SelectRequest(
        user_id="ok", mechanism="rnm", epsilon=0.001, item_ids=[f"item{k}" for k in range(500)], scores=[0.5] * 500
    )
    return [
        Case("valid Select, 500 candidates (columnar)", "Select", valid.SerializeToString(), "OK"),
        Case("Select, 3M candidates (15 MB)", "Select", cands_3m, "INVALID_ARGUMENT"),
        Case(
            "Select, 3M item_ids columnar (9 MB)",
            "Select",
            _select_head("victim") + _field(9, b"1") * 3_000_000,
            "INVALID_ARGUMENT",
        ),
        Case(
            "Recommend, 5M history entries (15 MB)",
            "Recommend",
            pb.RecommendRequest(user_id="victim", mechanism="rnm", epsilon=0.5).SerializeToString()
            + _field(2, b"1") * 5_000_000,
            "INVALID_ARGUMENT",
        ),
        Case("SelectBatch, one item of 3M candidates", "SelectBatch", _field(1, cands_3m), "INVALID_ARGUMENT"),
        Case("SelectBatch, 1,000 × 8,000 empty candidates (16 MB)", "SelectBatch", empty_batch, "INVALID_ARGUMENT"),
        Case(
            "SelectBatch, 1,000 × 8,000 empty candidates, gzip (17.7 kB)",
            "SelectBatch",
            empty_batch,
            "INVALID_ARGUMENT",
            compression=grpc.Compression.Gzip,
        ),
        Case(
            "Select, 15 MB malformed bytes",
            "Select",
            _select_head("victim") + _field(9, b"1") * 5000 + os.urandom(15_000_000),
            "INVALID_ARGUMENT",
        ),
        Case("Select, 3M candidates, unauthenticated", "Select", cands_3m, "UNAUTHENTICATED", token_file=True),
        Case(
            "Select, 20 MB > --max-message-bytes 16 MiB",
            "Select",
            _select_head("victim") + _field(9, b"1") * 6_700_000,
            "RESOURCE_EXHAUSTED",
            max_message_bytes=16 * 1024 * 1024,
        ),
    ]


def serve_floor(port: int) -> None:
    """The floor: a bare gRPC server (same thread pool and message limit) that refuses every call
    without looking at it. What it costs is the price of receiving the message at all."""
    from concurrent import futures

    def refuse(_request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused unread")

    methods = ("Select", "SelectBatch", "Recommend", "ListMechanisms")
    handler = grpc.method_handlers_generic_handler(
        "recsvc.v1.PrivateSelection", {m: grpc.unary_unary_rpc_method_handler(refuse) for m in methods}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(16),
        handlers=[handler],
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.so_reuseport", 0)],
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


class Server:
    """`recsvc serve` (or the floor server) in its own process, optionally from another source tree."""

    def __init__(self, artifacts: Path, tmp: Path, src: Path | None, *extra: str, floor: bool = False) -> None:
        self.port = free_port()
        ledger = tmp / f"ledger-{uuid.uuid4().hex[:8]}.db"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if src is not None:
            env["PYTHONPATH"] = str(src)
        cmd = serve_command(artifacts, ledger, self.port, "--drain-delay", "0", *extra)
        if floor:  # this module from the checkout: the floor server needs only grpc
            cmd, src = [sys.executable, "-m", "scripts.bench.refusals", "--serve-floor", str(self.port)], None
        self.proc = launch(cmd, "server", cwd=src or REPO, env=env)
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        return sum(self.ps.cpu_times()[:2])

    def rss(self) -> float:
        return self.ps.memory_info().rss / MB

    def reset_peak(self) -> bool:
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # Linux ≥ 4.0: VmHWM := VmRSS
            return True
        except OSError:
            return False

    def peak(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / MB
        return float("nan")

    def stop(self) -> None:
        stop(self.proc)


def _call(
    channel: grpc.Channel, method: str, payload: bytes, compression: grpc.Compression = grpc.Compression.NoCompression
) -> str:
    call = channel.unary_unary(
        f"/recsvc.v1.PrivateSelection/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        call(payload, timeout=600, compression=compression)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def measure(case: Case, artifacts: Path, tmp: Path, src: Path | None, reps: int, floor: bool = False) -> dict:
    """CPU per request = (server CPU over the reps − its idle CPU over the same time) / reps: the
    kernel counts CPU in 10 ms ticks here, so only a total over many requests is precise."""
    extra: list[str] = []
    if case.token_file:
        tokens = tmp / "tokens"
        tokens.write_text("bench-token service\n")
        tokens.chmod(0o600)
        extra += ["--token-file", str(tokens)]
    if case.max_message_bytes is not None and src is None:
        extra += ["--max-message-bytes", str(case.max_message_bytes)]
    server = Server(artifacts, tmp, src, *extra, floor=floor)
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}", options) as ch:
            _call(ch, "ListMechanisms", b"")  # warm up the connection and the handlers
            c0, t0 = server.cpu(), time.perf_counter()
            time.sleep(1.0)
            idle = (server.cpu() - c0) / (time.perf_counter() - t0)  # CPU s per s with nothing to do
            rss0, peak_reset = server.rss(), server.reset_peak()
            peak0 = server.peak()
            codes, wall_ms, rss_first = set(), [], 0.0
            c0, t0 = server.cpu(), time.perf_counter()
            for i in range(reps):
                t1 = time.perf_counter()
                codes.add(_call(ch, case.method, case.payload, case.compression))
                wall_ms.append((time.perf_counter() - t1) * 1e3)
                if i == 0:
                    rss_first = server.rss()
            time.sleep(0.2)  # let the server's threads finish their bookkeeping before reading CPU
            elapsed = time.perf_counter() - t0
            cpu_ms = max(0.0, server.cpu() - c0 - idle * elapsed) / reps * 1e3
            rss1, peak1 = server.rss(), server.peak()
    finally:
        server.stop()
    return {
        "case": case.name,
        "server": "floor" if floor else (str(src) if src else "recsvc"),
        "status": "/".join(sorted(codes)),
        "expected": "INVALID_ARGUMENT" if floor else case.expect,
        "message_mb": round(len(case.payload) / MB, 2),
        "reps": reps,
        "cpu_ms": round(cpu_ms, 1),
        "wall_ms_median": round(statistics.median(wall_ms), 1),
        "rss_first_mb": round(rss_first - rss0, 1),
        "rss_growth_mb": round(rss1 - rss0, 1),
        "peak_growth_mb": round(peak1 - peak0, 1) if peak_reset else None,
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-floor":
        serve_floor(int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="requests per case (default 20)")
    ap.add_argument("--src", type=Path, help="run the server from this source tree instead of the checkout")
    ap.add_argument("--floor", action="store_true", help="also send every case to the bare gRPC floor server")
    ap.add_argument("--only", help="run only the cases whose name contains this text")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-refusals-") as d:
        tmp = Path(d)
        artifacts = bench_artifact(tmp / "art")
        print(
            f"{'case':44s} {'server':>7s} {'status':>18s} {'msg MB':>7s} {'CPU ms/req':>10s} {'wall ms':>8s} "
            f"{'ΔRSS 1st':>8s} {'ΔRSS end':>8s} {'Δpeak':>6s}   (memory in MB)",
            flush=True,
        )
        for case in cases():
            if args.only and args.only not in case.name:
                continue
            for floor in (False, True) if args.floor else (False,):
                if floor and case.token_file:
                    continue
                row = measure(case, artifacts, tmp, args.src, args.reps, floor)
                rows.append(row)
                flag = "" if row["status"] == row["expected"] else f"  (expected {row['expected']})"
                peak = row["peak_growth_mb"]
                print(
                    f"{row['case']:44s} {'floor' if floor else 'recsvc':>7s} {row['status']:>18s} "
                    f"{row['message_mb']:7.1f} {row['cpu_ms']:10.1f} {row['wall_ms_median']:8.1f} "
                    f"{row['rss_first_mb']:8.1f} {row['rss_growth_mb']:8.1f} {peak if peak is not None else '—':>6}"
                    f"{flag}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["status"] == r["expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
