"""recsvc's benchmarks, each a module run from the repository root as ``python -m scripts.bench.<name>``.

:mod:`scripts.bench.harness` holds what several benchmarks share (the synthetic artifact and the
request payloads, starting and stopping servers, CPU accounting, the python load client, the
throwaway PostgreSQL cluster); the benchmarks import it and never each other, except that
:mod:`scripts.bench.service` runs :mod:`scripts.bench.service_batch` for ``--batch`` and
:mod:`scripts.bench.profile_batch` builds that benchmark's SelectBatch payloads.
"""
