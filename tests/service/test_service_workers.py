"""`recsvc serve --workers N`: the parent's supervision of its forked workers (they exit with it,
a worker that dies is replaced, a crash loop stops the server)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from recsvc.service import workers
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.shutdown import StopSignal
from recsvc.service.testing import candidates, free_port, server_process


def test_workers_exit_when_the_parent_is_killed(artifact: Path, tmp_path: Path) -> None:
    workers: list[psutil.Process] = []
    try:
        # The log holds how each worker drained, or the watchdog's stacks.
        with server_process(
            artifact,
            tmp_path / "l.db",
            "--workers",
            "2",
            "--drain-delay",
            "0",
            "--grace",
            "1",
            port=free_port(),
            log_path=tmp_path / "serve.log",
        ) as srv:
            workers = psutil.Process(srv.proc.pid).children()
            assert len(workers) == 2
            srv.proc.send_signal(signal.SIGKILL)
            srv.proc.wait(10)
            # Each worker drains (grace 1 s) on its parent-death SIGTERM; a full suite run on 2 busy
            # cores once took longer than 8 s, so allow 20 s: the point is that they exit at all.
            _gone, alive = psutil.wait_procs(workers, timeout=20)
            log = srv.log()
            assert alive == [], f"workers outlived their parent: {[p.pid for p in alive]}; their log:\n{log}"
            # ... and that they drained cleanly: not ended by their drain watchdog (11 s here), which
            # would mean the drain hung (its thread stacks are in the log then).
            assert "drain did not finish" not in log and log.count("recsvc.service: stopped") == 2, log
            with socket.socket() as s:  # nobody serves the port any more
                assert s.connect_ex(("127.0.0.1", srv.port)) != 0
    finally:
        for p in [*workers, *psutil.Process().children(recursive=True)]:  # orphans are no longer our children
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def test_a_worker_killed_by_sigkill_is_replaced_while_the_other_serves(artifact: Path, tmp_path: Path) -> None:
    """F7: with --workers 2, SIGKILL of one worker starts another in its place; the server keeps
    answering, and SIGTERM then drains both and exits 0."""
    with server_process(
        artifact,
        tmp_path / "l.db",
        "--workers",
        "2",
        "--drain-delay",
        "0",
        port=free_port(),
        log_path=tmp_path / "s.log",
    ) as srv:
        parent = psutil.Process(srv.proc.pid)
        first = {p.pid for p in parent.children()}
        assert len(first) == 2
        victim = psutil.Process(min(first))
        victim.send_signal(signal.SIGKILL)
        victim.wait(20)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len({p.pid for p in parent.children()} - first) < 1:
            time.sleep(0.1)
        now = {p.pid for p in parent.children()}
        assert len(now) == 2 and victim.pid not in now and srv.proc.poll() is None, srv.log()
        with Client(srv.target) as c:
            assert c.select("u", candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == pytest.approx(0.5)
        assert re.search(rf"worker {victim.pid} exited with -9; worker \d+ replaces it", srv.log()), srv.log()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()
        assert not psutil.wait_procs([psutil.Process(p) for p in now if psutil.pid_exists(p)], timeout=20)[1]


def test_a_crash_loop_stops_the_server_instead_of_restarting_forever(artifact: Path, tmp_path: Path) -> None:
    """More than RESTARTS crashes within RESTART_WINDOW_S: the supervisor stops replacing and exits 1
    (real child processes that exit 3 at once stand in for workers)."""

    class Crashing(workers._Replacements):
        def fork(self) -> int:
            self.forked = getattr(self, "forked", 0) + 1
            pid = os.fork()
            if pid == 0:
                os._exit(3)
            return pid

    config = ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db")
    supervisor = os.fork()  # its own process: _supervise reaps any child of the process it runs in
    if supervisor == 0:
        code = 99
        try:
            crashing = Crashing(config, os.getpid())
            returned = workers._supervise(config, [crashing.fork()], StopSignal(), crashing)
            code = 10 * returned + (crashing.forked == 1 + workers.RESTARTS)  # the first, then RESTARTS more
        finally:
            os._exit(code)
    _, status = os.waitpid(supervisor, 0)
    assert os.waitstatus_to_exitcode(status) == 11
