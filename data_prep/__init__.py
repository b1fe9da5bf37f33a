"""Offline pipeline (docs/reference/specification.md §4): ``recsvc prep`` / :func:`data_prep.pipeline.run`."""

DATASETS = ("ml-100k", "ml-20m", "netflix", "amazon-book", "synthetic")
FACTORIZERS = ("cholmod", "icf")  # SANSA's: exact (then sparsified) or incomplete Cholesky
