"""recsvc's benchmarks, each a module run from the repository root as ``python -m scripts.bench.<name>``.

:mod:`scripts.bench.harness` holds what several benchmarks share (the synthetic artifact and the
request payloads, starting and stopping servers, CPU accounting, the python load client, the
throwaway PostgreSQL cluster). The benchmarks import the harness and never each other;
:mod:`scripts.bench.service_batch` is the ``--batch`` part of :mod:`scripts.bench.service`.
"""
