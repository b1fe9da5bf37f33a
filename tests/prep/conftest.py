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

Dataset files in each source's own on-disk format come from :mod:`data_prep.testing`. A refused
``recsvc prep`` says why in one error line (``prep_error_line``, below); ``snapshot`` and
``one_line_error`` (tests/conftest.py) check that ``recsvc policy`` changes nothing when it refuses,
and ``ml100k`` is the real ml-100k artifact, built once per session.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest


@pytest.fixture
def prep_error_line(capsys: pytest.CaptureFixture[str]) -> Callable[[], str]:
    """``prep_error_line()``: the one ``recsvc prep: error:`` line a refused prep wrote to stderr,
    after whatever progress lines (``[prep] loading …``) it printed before it found the problem;
    no traceback."""

    def line() -> str:
        err = capsys.readouterr().err
        errors = [text for text in err.splitlines() if re.match(r"recsvc prep: error: ", text)]
        assert len(errors) == 1 and "Traceback" not in err, err
        return errors[0]

    return line
