"""Fixtures shared by several test modules.

Import style: tests/ has no ``__init__.py`` and holds no helper modules. Fixtures shared by
several areas live here, each area's in its own conftest.py, and reusable helpers that are not
fixtures in the ``testing`` module of the package they test (``recsvc.mechanisms.testing``,
``recsvc.ledger.testing``, ``recsvc.service.testing``, ``data_prep.testing``, ``eval.testing``).
Nothing imports ``tests.…``: an installed distribution that ships a top-level ``tests`` package
(diffprivlib does) would shadow this directory under that name. Test modules never import each other.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recsvc.ledger.testing.cluster import Cluster, pg_bin, remove_cluster, start_cluster
from recsvc.service.testing import make_artifact, make_certs


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service tests' toy artifact (one per module, so no module sees another's ledger or files)."""
    return make_artifact(tmp_path_factory.mktemp("art") / "toy")


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that every pytest-xdist worker of this run sees (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def ml100k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ml-100k artifact (embedded RecBole copy, `recsvc prep` defaults), built once per
    run and shared by every xdist worker: the first to need it builds it under a file lock, the
    others wait for it. The pipeline's end-to-end test and the `auto` targets read it."""
    from data_prep.pipeline import PrepConfig, run

    root = _shared_dir(tmp_path_factory)
    out = root / "ml100k" / "ml-100k"
    with (root / "ml100k.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "manifest.json").is_file():
            run(PrepConfig(out=out, progress=False))
    return out


@pytest.fixture
def snapshot() -> Callable[[Path], dict[str, bytes]]:
    """``snapshot(d)``: every file under ``d`` with its bytes. Equal snapshots taken around a refused
    command mean it wrote, changed and removed nothing (prep, policy and eval refuse the same way)."""

    def take(d: Path) -> dict[str, bytes]:
        return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

    return take


@pytest.fixture
def one_line_error(capsys: pytest.CaptureFixture[str]) -> Callable[[str], str]:
    """``one_line_error(match)``: what the command wrote to stderr since the last read is one line
    (no traceback) that matches the regular expression ``match``; returns it."""

    def check(match: str) -> str:
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(match, err), err
        return err

    return check


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Throwaway CA, server and client certificates (file name → path)."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One throwaway PostgreSQL cluster for the whole run (skipped only without PostgreSQL's binaries,
    which scripts/setup.sh installs)."""
    if pg_bin() is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (run scripts/setup.sh)")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        remove_cluster(cluster)


@pytest.fixture(scope="session")
def dask_scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Dask cluster: a `dask scheduler` process and two `dask worker` processes (one thread
    each), as an operator would start them on separate machines. Yields the scheduler's address;
    every process is stopped afterwards."""
    d = tmp_path_factory.mktemp("dask")
    bin_dir = Path(sys.executable).parent
    info = d / "scheduler.json"
    common = ["--no-dashboard"]
    procs = [
        subprocess.Popen(
            [
                str(bin_dir / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--scheduler-file",
                str(info),
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not info.is_file() or not info.read_text().strip():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("the dask scheduler did not start within 60 s")
            time.sleep(0.1)
        address = json.loads(info.read_text())["address"]
        for i in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        str(bin_dir / "dask"),
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--name",
                        f"w{i}",
                        "--local-directory",
                        str(d / f"w{i}"),
                        "--no-nanny",
                        *common,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for p in procs:  # throwaway processes: no graceful retirement to wait for
            p.kill()
            p.wait()


# Files that share a session fixture too costly to build twice run on one xdist worker: both
# use the Dask cluster (a scheduler and two worker processes, ~10 s of CPU to start).
SHARED_WORKER = {"test_eval_dask_cluster.py": "dask-cluster", "test_prep_dask_cluster.py": "dask-cluster"}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist never calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the SHARED_WORKER files as one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]  # xdist ships no py.typed

    class FilesSharingFixtures(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return SHARED_WORKER.get(Path(file).name, file)

    return FilesSharingFixtures(config, log)


# The areas whose files run longest come first, so that xdist's workers (each taking whole files)
# end the run on the many short files of the mechanisms and the ledger instead of one worker
# finishing a long service file alone.
AREA_ORDER = ("service", "architecture", "eval", "prep", "ledger", "mechanisms")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Orders the items by area (stable: each file keeps its own order)."""

    def area(item: pytest.Item) -> int:
        parts = Path(str(item.path)).parts
        name = parts[parts.index("tests") + 1] if "tests" in parts[:-1] else ""
        return AREA_ORDER.index(name) if name in AREA_ORDER else len(AREA_ORDER)

    items.sort(key=area)
