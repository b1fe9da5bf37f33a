"""The suite runs when another installed distribution ships a top-level ``tests`` package
(diffprivlib does): helpers are imported by bare module names, never as ``tests.…``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# Fast tests from each area whose modules import the helper modules and the conftest fixtures.
SAMPLE = [
    "tests/test_data_prep_split.py",  # data_prep_fixtures
    "tests/test_eval_safety.py::test_out_that_is_a_file_is_refused",  # eval_fixtures
    "tests/test_eval_sweep.py::test_bad_flags_are_refused_before_any_level_runs",  # eval_fixtures (one_line_error, snapshot)
    "tests/test_mechanisms_privacy.py::test_random_stopping_exact_audit_by_quadrature",  # mechanisms_audit, _reference
    "tests/service/test_service_security.py::test_tls_and_mtls",  # recsvc.service.testing, conftest's artifact and certs
]


def _stub_tests_package(root: Path) -> dict[str, str]:
    """An environment whose first sys.path entry holds a ``tests`` package that cannot be imported."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text('raise ImportError("the stub tests package was imported")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def test_sample_passes_with_a_foreign_tests_package_first_on_sys_path(tmp_path):
    env = _stub_tests_package(tmp_path / "stub")
    proc = subprocess.run([sys.executable, "-m", "pytest", *SAMPLE], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 10 and not re.search(r"\d+ (failed|error)", out), out


def test_the_old_tests_dot_import_breaks_under_the_same_stub(tmp_path):
    """What the suite used to do (``from tests.x import …``) works only while no ``tests`` package is installed."""
    code = ["-c", "import tests.mechanisms_audit"]
    clean = subprocess.run([sys.executable, *code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    env = _stub_tests_package(tmp_path / "stub")
    shadowed = subprocess.run([sys.executable, *code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert shadowed.returncode == 1 and "the stub tests package was imported" in shadowed.stderr, shadowed.stderr


def test_no_module_imports_tests_or_another_test_module():
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names
                          if n == "tests" or n.startswith(("tests.", "test_")) or n == "conftest"]
    assert offenders == []
