"""In-process CPU profile of the SelectBatch path (or lone Selects): server CPU per selection.

Builds the payloads of ``python -m scripts.bench.service --batch`` (rows encoding, n = 500 rnm
candidates, ``--size`` items per batch, every item a fresh charge) and runs them through the
server's own decoder (:mod:`recsvc.service.codec`) and ``SelectionServicer.SelectBatch`` against a
durable SQLite ledger in a temporary directory, in this one thread. Reports CPU time
(``time.process_time``, so other jobs on the machine do not count) per selection, the best of
``--reps`` rounds, and with ``--profile`` a cProfile top-30 (cumulative and own time).

``--threads N`` serves the batches from N threads at once (the server's thread pool; GIL hand-offs
count). ``--lone`` sends the same selections as lone Selects instead (ids encoding, what
``scripts.bench.attack``'s lone calls send): decoded, served by ``SelectionServicer.Select`` and
the response serialized, one at a time: the request thread's work for one lone call.
Usage: ``.venv/bin/python -m scripts.bench.profile_batch [--batches 40] [--size 100] [--reps 3]
[--threads 1] [--lone [--steps]] [--tmpfs] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scripts.bench.harness import batch_bodies, bench_artifact, select_bodies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40, help="batches per round")
    ap.add_argument("--size", type=int, default=100, help="requests per batch")
    ap.add_argument("--reps", type=int, default=3, help="rounds (the best is reported)")
    ap.add_argument("--threads", type=int, default=1, help="threads serving the batches concurrently")
    ap.add_argument("--lone", action="store_true", help="lone Select calls instead of SelectBatch ones")
    ap.add_argument("--tmpfs", action="store_true", help="the ledger on /dev/shm, as scripts.bench.attack's servers")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile top-30 of one round")
    ap.add_argument(
        "--steps",
        action="store_true",
        help="also each step's CPU per selection (decode, checks, reserve, draw, commit, encode), "
        "the median of --reps rounds",
    )
    args = ap.parse_args()

    from recsvc.artifact import load_artifact
    from recsvc.ledger.sqlite import SQLiteLedger
    from recsvc.service import codec
    from recsvc.service.auth import ADMIN, Caller, Principal, Scope
    from recsvc.service.config import SelectorConfig
    from recsvc.service.servicer import SelectionServicer
    from recsvc.v1 import selection_pb2 as pb

    shm = "/dev/shm" if args.tmpfs and Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="profile-batch-", dir=shm) as td:
        tmp = Path(td)
        art = load_artifact(bench_artifact(tmp / "art"))
        ledger = SQLiteLedger(tmp / "ledger.db", 1e6)
        servicer = SelectionServicer(art, ledger, SelectorConfig())
        decode = codec.decoder(pb.SelectBatchRequest, codec.BATCH, servicer.config.limits)
        decode_one = codec.decoder(pb.SelectRequest, codec.SELECT, servicer.config.limits)
        caller = Caller((Principal("profile", Scope(ADMIN)),), "profile")
        gc.freeze()  # as a served worker does after startup (recsvc/service/server.py)

        def serve(bodies: list[bytes]) -> None:
            for body in bodies:
                if args.lone:
                    one = servicer.answer(servicer.price_select(caller, decode_one(body)).value)
                    one.SerializeToString()  # what the gate's serializer does
                    continue
                # the serialized SelectBatchResponse (codec.Framed)
                servicer.answer_batch(servicer.price_batch(caller, decode(body)).value)

        def round_(bodies: list[bytes]) -> float:
            """CPU of this whole process (every thread) per selection."""
            t0 = time.process_time()
            if args.threads == 1:
                serve(bodies)
            else:  # concurrent batches, as the server's thread pool runs them
                threads = [
                    threading.Thread(target=serve, args=(bodies[k :: args.threads],)) for k in range(args.threads)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            return (time.process_time() - t0) / (args.batches * args.size)

        def bodies(seed: int) -> list[bytes]:  # built before the clock starts
            if args.lone:
                return select_bodies(args.batches * args.size, seed, "ids")
            return batch_bodies(args.batches, args.size, seed, "rows")

        round_(bodies(0))  # warm-up: caches, the ledger's first pages
        best = min(round_(bodies(rep)) for rep in range(args.reps))
        charged = ledger._conn().execute("SELECT count(*) FROM requests").fetchone()[0]
        expected = (args.reps + 1) * args.batches * args.size
        if charged != expected:
            raise SystemExit(f"the ledger charged {charged} requests, expected {expected}")
        what = f"{args.batches * args.size} lone Selects" if args.lone else f"{args.batches} batches x {args.size}"
        print(
            f"CPU per selection: {best * 1e6:.1f} us (best of {args.reps} rounds of {what}, "
            f"{args.threads} thread(s); {charged} charges)"
        )
        if args.steps:
            rounds = [bodies(100 + rep) for rep in range(args.reps)]
            if args.lone:
                print_steps(servicer, ledger, decode_one, rounds)
            else:
                print_batch_steps(servicer, ledger, decode, caller, rounds, args.size)
        if args.profile:
            todo = bodies(1)
            prof = cProfile.Profile()  # wall time: a CPU-time timer costs a system call per event
            prof.enable()
            round_(todo)
            prof.disable()
            for key in ("cumulative", "tottime"):
                pstats.Stats(prof).sort_stats(key).print_stats(30)
        ledger.close()
    return 0


STEPS = ("decode", "decoded → inputs", "ids → rows", "checks and clipping", "reserve", "draw", "commit", "encode")


def print_steps(servicer: Any, ledger: Any, decode: Any, rounds: list[list[bytes]]) -> None:
    """Each step of a lone Select in this one thread, CPU per call (``time.process_time``), the
    median over the rounds: the method's own work, without gRPC, the gate or other threads."""
    from recsvc.ledger import Drawn
    from recsvc.rng import thread_csprng
    from recsvc.service import codec
    from recsvc.service.requests import Columns, draw
    from recsvc.service.selection import Selected

    clock, sel = time.process_time, servicer.selector
    per_round = []
    for bodies in rounds:
        total = dict.fromkeys(STEPS, 0.0)
        for body in bodies:
            t0 = clock()
            req = decode(body)
            t1 = clock()
            x, raw, _ = codec.select_input(req)
            ids = x.item_ids
            assert ids is not None  # the benchmark's Selects name their candidates by id
            t2 = clock()
            sel.catalog.rows(ids)  # timed alone; the checks below map them again
            t3 = clock()
            p = sel.prepare_many([x], Columns.of([raw], []))[0]
            t4 = clock()
            got = ledger.reserve(p.user_id, p.request_id, p.fingerprint, p.charge, p.mechanism)
            t5 = clock()
            with got:
                picked = draw(p, thread_csprng())
                t6 = clock()
                charge = ledger.commit(got, Drawn(*p.answer(picked)))
            t7 = clock()
            codec.select_response(Selected(charge.answer, p.request_id, charge.replayed)).SerializeToString()
            t8 = clock()
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3 - (t3 - t2), t5 - t4, t6 - t5, t7 - t6, t8 - t7)
            for step, span in zip(STEPS, spans, strict=True):
                total[step] += span
        per_round.append({step: total[step] / len(bodies) * 1e6 for step in STEPS})
    print_table(
        "each step of a lone Select, CPU µs per call (median of rounds; 'checks and clipping' excludes ids → rows):",
        per_round,
    )


BATCH_STEPS = ("decode", "authorize, checks and clipping", "reserve", "draw", "commit", "encode")


def print_batch_steps(
    servicer: Any, ledger: Any, decode: Any, caller: Any, rounds: list[list[bytes]], size: int
) -> None:
    """Each step of a SelectBatch in this one thread, CPU per selection (``time.process_time``),
    the median over the rounds."""
    from recsvc.ledger import Drawn
    from recsvc.rng import thread_csprng
    from recsvc.service.batch import draw_many, items_of
    from recsvc.service.selection import Selected

    clock, sel = time.process_time, servicer.selector
    per_round = []
    for bodies in rounds:
        total = dict.fromkeys(BATCH_STEPS, 0.0)
        for body in bodies:
            t0 = clock()
            req = decode(body)
            t1 = clock()
            batch = servicer.price_batch(caller, req).value
            prepared = list(batch.prepared.values())
            t2 = clock()
            with ledger.reserve_batch(items_of(prepared)) as reserved:
                todo = [prepared[i] for i in reserved.todo]
                t3 = clock()
                picked = draw_many(sel, todo, thread_csprng())
                drawn = [Drawn(*p.answer(s)) for p, s in zip(todo, picked, strict=True)]
                t4 = clock()
                charged = ledger.commit_batch(reserved, drawn)
            t5 = clock()
            outcomes: list[Any] = list(batch.outcomes)
            for (i, p), c in zip(batch.prepared.items(), charged, strict=True):
                outcomes[i] = (p, Selected(c.answer, p.request_id, c.replayed))
            servicer._encode_batch(outcomes)
            t6 = clock()
            for step, span in zip(BATCH_STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
                total[step] += span
        per_round.append({step: total[step] / (len(bodies) * size) * 1e6 for step in BATCH_STEPS})
    print_table("each step of a SelectBatch, CPU µs per selection (median of rounds):", per_round)


def print_table(title: str, per_round: list[dict[str, float]]) -> None:
    """Each step's median over the rounds (the rounds' dicts in step order), then their sum's."""
    width = max(map(len, per_round[0])) + 2
    print(title)
    for step in per_round[0]:
        print(f"  {step:<{width}} {statistics.median(r[step] for r in per_round):8.1f}")
    print(f"  {'sum':<{width}} {statistics.median(sum(r.values()) for r in per_round):8.1f}")


if __name__ == "__main__":
    sys.exit(main())
