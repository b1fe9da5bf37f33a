"""recsvc.checks: the shared checks of user-given numbers and paths."""

import os

import numpy as np
import pytest

from recsvc.checks import check_int, check_regular_file


def test_check_int_accepts_python_and_numpy_integers_at_or_above_the_floor():
    assert check_int("--n", 3, 1) == 3 and type(check_int("--n", np.int64(5), 1)) is int
    for bad in (0, -1, 2.0, True, "3", None):
        with pytest.raises(ValueError, match=r"^--n must be an integer ≥ 1, got "):
            check_int("--n", bad, 1)


def test_check_regular_file(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("x\n")
    check_regular_file("token file", f, "a token file")  # a regular file passes
    with pytest.raises(ValueError, match=r"^token file .*/d is a directory or not a regular file; expected a token file$"):
        (tmp_path / "d").mkdir()
        check_regular_file("token file", tmp_path / "d", "a token file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        check_regular_file("--ledger", fifo, "an SQLite ledger")
    with pytest.raises(FileNotFoundError, match=r"^token file .*/missing does not exist; expected a token file$"):
        check_regular_file("token file", tmp_path / "missing", "a token file")
