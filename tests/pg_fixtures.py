"""The throwaway PostgreSQL cluster of the tests: it lives in :mod:`recsvc.service.pg_cluster`, which
the benchmarks share; re-exported here under the tests' helper-module name."""

from recsvc.service.pg_cluster import Cluster, pg_bin, remove_cluster, start_cluster

__all__ = ["Cluster", "pg_bin", "remove_cluster", "start_cluster"]
