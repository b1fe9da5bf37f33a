"""Tests of the offline pipeline (``recsvc prep``, :mod:`data_prep`) and of the artifact layer it
produces and every later part reads.

Besides ``test_data_prep_*`` (loaders, split, scoring math, validation, the pipeline end to end),
this area holds the shared layer's tests, because prep is where that layer is written and where a
change to it shows first:

* ``test_artifacts``: the artifact format, written by prep through ArtifactWriter and read by
  eval and the service;
* ``test_staging``: the staged output directories that make a prep (or eval) run all-or-nothing;
* ``test_model``: the SANSA model's scoring, which prep's candidates and the service's Recommend
  must agree on;
* ``test_policy`` and ``test_policy_artifact``: the ``auto`` policy table, computed offline by
  ``recsvc prep`` / ``recsvc policy`` and stored in the artifact.

Dataset files in each source's own on-disk format come from :mod:`data_prep.testing`. The
``snapshot`` and ``one_line_error`` fixtures (tests/conftest.py) check that a refused command
changes nothing and says why in one line; ``ml100k`` is the real ml-100k artifact, built once.
"""
