"""recsvc.checks: the shared checks of user-given numbers and paths."""

import os

import numpy as np
import pytest

from recsvc.checks import MissingFileError, ParamError, check_int, check_regular_file


def test_check_int_accepts_python_and_numpy_integers_at_or_above_the_floor():
    assert check_int("n", 3, 1) == 3 and type(check_int("n", np.int64(5), 1)) is int
    for bad in (0, -1, 2.0, True, "3", None):
        with pytest.raises(ParamError, match=r"^n must be an integer ≥ 1, got ") as info:
            check_int("n", bad, 1)
        assert info.value.params == ("n",)
        assert info.value.render({"n": "--n"}) == f"--n must be an integer ≥ 1, got {bad!r}"


def test_check_regular_file(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("x\n")
    check_regular_file("token file", f, "a token file")  # a regular file passes
    with pytest.raises(
        ValueError, match=r"^token file .*/d is a directory or not a regular file; expected a token file$"
    ):
        (tmp_path / "d").mkdir()
        check_regular_file("token file", tmp_path / "d", "a token file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        check_regular_file("--ledger", fifo, "an SQLite ledger")
    with pytest.raises(FileNotFoundError, match=r"^token file .*/missing does not exist; expected a token file$"):
        check_regular_file("token file", tmp_path / "missing", "a token file")


def test_check_regular_file_may_name_a_parameter(tmp_path):
    """``what`` may be a parameter field: the CLI then shows its flag (test_service_startup's --ledger)."""
    (tmp_path / "d").mkdir()
    with pytest.raises(ParamError, match=r"^ledger .*/d is a directory or not a regular file; expected x$") as info:
        check_regular_file("{ledger}", tmp_path / "d", "x")
    assert info.value.render({"ledger": "--ledger"}).startswith("--ledger ")
    with pytest.raises(MissingFileError, match=r"^ledger .*/gone does not exist; expected x$") as info:
        check_regular_file("{ledger}", tmp_path / "gone", "x")
    assert isinstance(info.value, FileNotFoundError) and info.value.params == ("ledger",)
    # a path with braces is a value, never a field
    check_regular_file("token file", _touch(tmp_path / "{odd}"), "x")
    with pytest.raises(MissingFileError, match=r"^token file .*/\{gone\} does not exist"):
        check_regular_file("token file", tmp_path / "{gone}", "x")


def _touch(path):
    path.write_text("x")
    return path


def test_check_epsilon_is_the_one_epsilon_check_and_each_caller_keeps_its_error_type():
    from recsvc.checks import check_epsilon
    from recsvc.mechanisms import MechanismInputError, MechanismParamError
    from recsvc.mechanisms.validation import check_epsilon as mechanism_check
    from recsvc.service.catalog import InvalidRequest

    assert check_epsilon(1) == 1.0 and type(check_epsilon(np.float32(0.5))) is float
    assert check_epsilon(5e-324) == 5e-324 and check_epsilon(1e300) == 1e300
    for bad, shown in ((0.0, "0.0"), (-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf"), (-0.0, "-0.0")):
        with pytest.raises(ValueError, match=rf"^epsilon must be a positive finite number, got {shown}$"):
            check_epsilon(bad)
        with pytest.raises(MechanismInputError, match=rf"^epsilon must be a positive finite number, got {shown}$"):
            mechanism_check(bad)
        with pytest.raises(InvalidRequest, match=rf"^epsilon must be a positive finite number, got {shown}$"):
            check_epsilon(bad, error=InvalidRequest)
        with pytest.raises(ValueError, match=rf"^--epsilon must be a positive finite number, got {shown}$"):
            check_epsilon(bad, "--epsilon")
    for bad in (True, "1", None, 1j):
        with pytest.raises(MechanismInputError, match=rf"^epsilon must be a positive finite real number, got {bad!r}$"):
            mechanism_check(bad)
    assert MechanismInputError.status == MechanismParamError.status == ParamError.status == "INVALID_ARGUMENT"
    assert isinstance(MechanismInputError.status, str)
