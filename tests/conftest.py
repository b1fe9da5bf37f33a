"""Fixtures shared by several test modules.

Import style: helper modules in tests/ (``data_prep_fixtures``, ``eval_fixtures``,
``mechanisms_audit``, ``mechanisms_reference``, ``service_fixtures``) are imported by their bare
names. tests/ has no ``__init__.py``, so pytest's default import mode puts tests/ itself first on
sys.path; nothing imports ``tests.…``, because an installed distribution that ships a top-level
``tests`` package (diffprivlib does) would shadow this directory under that name. Test modules
never import each other: shared helpers live in the helper modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recsvc.ledger.testing.cluster import Cluster, pg_bin, remove_cluster, start_cluster
from service_fixtures import make_artifact, make_certs


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service tests' toy artifact (one per module, so no module sees another's ledger or files)."""
    return make_artifact(tmp_path_factory.mktemp("art") / "toy")


@pytest.fixture(scope="session")
def ml100k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ml-100k artifact (embedded RecBole copy, `recsvc prep` defaults), built once per
    session: the pipeline's end-to-end test and the `auto` targets share it."""
    from data_prep.pipeline import PrepConfig, run

    return run(PrepConfig(out=tmp_path_factory.mktemp("ml100k") / "ml-100k", progress=False))


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
