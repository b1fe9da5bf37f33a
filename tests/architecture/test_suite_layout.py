"""The test suite's layout: tests live by area, share code through fixtures and ``testing`` modules,
and run when another installed distribution ships a top-level ``tests`` package (diffprivlib does).

* Every test module sits in an area folder (``tests/<area>/test_*.py``) that has a conftest.py;
  directly in tests/ there is only the conftest.py of the fixtures the areas share.
* tests/ holds no helper modules: a fixture goes to the conftest.py of the widest area that uses
  it, and a reusable non-fixture helper to the ``testing`` module of the package it tests.
* There is no ``__init__.py`` under tests/, so pytest puts each test's own folder first on sys.path;
  test modules keep unique basenames, and nothing imports ``tests.…`` (the foreign package would
  shadow this directory under that name), ``conftest`` or another test module.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
AREAS = ("mechanisms", "ledger", "service", "prep", "eval", "architecture")
# Tests that use the shared conftest fixtures and a package's ``testing`` module: (module, test or
# None for every test of the module).
SAMPLE = [
    ("test_eval_safety", "test_out_that_is_a_file_is_refused"),  # eval.testing, one_line_error
    ("test_eval_sweep", "test_bad_flags_are_refused_before_any_level_runs"),  # one_line_error, snapshot
    ("test_data_prep_split", None),  # data_prep.testing
    ("test_service_security", "test_tls_and_mtls"),  # recsvc.service.testing, conftest artifact and certs
    # mechanisms.testing, conftest fixture
    ("test_mechanisms_privacy", "test_the_exact_audit_catches_an_understated_map"),
    ("test_exact_units", "test_budget_rounds_down_and_stored_floats_round_up"),  # ledger's conftest
    ("test_app_cli", "test_engine_default_workers"),  # architecture's conftest
]


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _stub_tests_package(root: Path) -> dict[str, str]:
    """An environment whose first sys.path entry holds a ``tests`` package that cannot be imported."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text('raise ImportError("the stub tests package was imported")\n')
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }


def test_the_suite_collects_and_runs_with_a_foreign_tests_package_first_on_sys_path(tmp_path):
    """One pytest process collects a module of every area, so every conftest.py (a module that fails
    to import is a collection error, which stops the run), and runs only SAMPLE, deselecting the
    rest of those modules. The other modules import nothing under ``tests``: the static check below
    holds them to it without importing them all (a whole-suite collection takes ~20 s of CPU)."""
    env = _stub_tests_package(tmp_path / "stub")
    files = sorted(str(p.relative_to(REPO)) for m, _ in SAMPLE for p in TESTS.glob(f"*/{m}.py"))
    assert len(files) == len(SAMPLE) and {Path(f).parts[1] for f in files} == set(AREAS), files
    select = " or ".join(f"({module}.py and {test})" if test else f"{module}.py" for module, test in SAMPLE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-k", select, *files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and not re.search(r"\d+ (failed|errors?)", out), out
    summary = re.search(r"(\d+) passed, (\d+) deselected", out)
    assert summary and int(summary.group(1)) >= len(SAMPLE) and int(summary.group(2)) > 10, out


def test_a_tests_dot_import_resolves_to_the_foreign_package(tmp_path):
    """Why nothing may import ``tests.…``: the name belongs to whichever ``tests`` comes first on sys.path."""
    code = ["-c", "import tests; print(list(tests.__path__))"]
    clean = subprocess.run([sys.executable, *code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and str(TESTS) in clean.stdout, clean.stderr
    env = _stub_tests_package(tmp_path / "stub")
    shadowed = subprocess.run([sys.executable, *code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert shadowed.returncode == 1 and "the stub tests package was imported" in shadowed.stderr, shadowed.stderr


def test_no_module_imports_tests_conftest_or_another_test_module():
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.relative_to(TESTS)}:{node.lineno} {n}"
                for n in names
                if n == "tests" or n.startswith(("tests.", "test_")) or n == "conftest"
            ]
    assert offenders == []


def test_area_folders_hold_only_test_modules_and_their_conftest():
    """No helper modules: shared code is a fixture or lives in a package's ``testing`` module."""
    helpers = [
        p.relative_to(TESTS).as_posix()
        for p in _python_files()
        if p.parent != TESTS and p.name != "conftest.py" and not p.name.startswith("test_")
    ]
    assert helpers == []
    assert not list(TESTS.rglob("__init__.py"))


def test_test_modules_have_unique_basenames():
    counts = Counter(p.name for p in _python_files() if p.name.startswith("test_"))
    assert [name for name, n in counts.items() if n > 1] == []


def test_every_area_folder_is_a_known_area_with_a_conftest():
    folders = sorted({p.parent for p in _python_files()} - {TESTS})
    assert [f.relative_to(TESTS).as_posix() for f in folders if f.parent != TESTS or f.name not in AREAS] == []
    assert [f.name for f in folders if not (f / "conftest.py").is_file()] == []


def test_tests_itself_holds_only_the_shared_conftest():
    """Neither test modules nor helper modules sit directly in tests/."""
    assert sorted(p.name for p in TESTS.glob("*.py") if p.name != "conftest.py") == []


def test_the_leftover_check_finds_and_kills_what_the_run_left_running() -> None:
    """scripts/leftovers.py (the test command's last step) fails on a process that carries the
    run's token and kills it, passes when none remains, and never counts its own parents."""
    token = f"leftover-check-{os.getpid()}"
    check = [sys.executable, str(REPO / "scripts" / "leftovers.py"), token, "--grace", "0.2"]
    env = {**os.environ, "RECSVC_TEST_RUN": token}
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        found = subprocess.run(check, capture_output=True, text=True, timeout=60)
        assert found.returncode == 1 and f"pid {left.pid} " in found.stderr
        assert left.wait(10) is not None  # killed
        clean = subprocess.run(check, capture_output=True, text=True, timeout=60, env=env)  # a parent with the token
        assert clean.returncode == 0, clean.stderr
    finally:
        left.kill()
        left.wait()
