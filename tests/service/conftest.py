"""Fixtures of the service tests: an in-process server on the toy artifact and its client.

A module configures the shared server with ``SERVER_OPTIONS``, a dict of flat ServerConfig
parameters (``{"budget": 5.0, "max_candidates": 25}``); without it the server has the defaults.
``server``/``client`` live for the module (one ledger, so tests use distinct user ids);
``fresh_server``/``fresh_client`` give a test a server and ledger of its own.
Non-fixture helpers are in :mod:`recsvc.service.testing`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from recsvc.service.client import Client
from recsvc.service.server import ServerHandle
from recsvc.service.testing import client_of, served


def _options(request: pytest.FixtureRequest) -> dict:
    return dict(getattr(request.module, "SERVER_OPTIONS", {}))


@pytest.fixture(scope="module")
def server(
    artifact: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerHandle]:
    with served(artifact, tmp_path_factory.mktemp("led") / "l.db", **_options(request)) as h:
        yield h


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[Client]:
    with client_of(server) as c:
        yield c


@pytest.fixture
def fresh_server(artifact: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    with served(artifact, tmp_path / "l.db", **_options(request)) as h:
        yield h


@pytest.fixture
def fresh_client(fresh_server: ServerHandle) -> Iterator[Client]:
    with client_of(fresh_server) as c:
        yield c


@pytest.fixture(scope="module")
def bundle(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A client bundle of the toy artifact's model for the device tests: a seeded 6-d embedding with
    factors large enough that most histories are clipped (R = 1.5), which the small factors of
    ``make_artifact(bundle=True)`` rarely are."""
    import numpy as np

    from recsvc.artifact import load_artifact
    from recsvc.artifact.bundle import write_client_bundle

    model = load_artifact(artifact).model
    out = tmp_path_factory.mktemp("bundle") / "client"
    factors = np.random.default_rng(4).normal(size=(len(model.item_ids), 6))
    write_client_bundle(out, model.item_ids, factors, 1.5, model, model.item_ids[[3, 0, 5, 1]])  # a codebook of C = 4
    return out


@pytest.fixture
def survivors() -> Callable[[list[psutil.Process], float], list[psutil.Process]]:
    """``survivors(procs, timeout)``: those of ``procs`` still running after up to ``timeout`` seconds
    of waiting for them all to end (a zombie has ended: an orphan's new parent may be slow to reap it)."""

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        alive = [p for p in procs if running(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if running(p)]
        return alive

    return wait
