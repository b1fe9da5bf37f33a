"""The main evaluation study: ``recsvc eval`` and ``eval-synthetic``
(docs/reference/specification.md §6).

config (the run's settings and data-free checks) → sources (artifact test users or a scenario's
rows, in lazy chunks) → work (every metric for one chunk; pipelines: the candidate pipelines) →
aggregate (in-order reduction into results; pipeline_report: the pipelines' share) → outputs
(tables, plots, report; auto: the ``auto`` row and its regret). run drives it.
"""
