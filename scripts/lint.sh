#!/usr/bin/env bash
# Lint (ruff check), format check (ruff format --check) and type check (mypy) with the configuration in
# pyproject.toml. Runs all three even when one fails, so one run shows every finding; exits non-zero on any.
# RECSVC_PYTHON picks the interpreter whose ruff and mypy run (default: the project's .venv, as test.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${RECSVC_PYTHON:-.venv/bin/python}
PATHS=(recsvc data_prep eval tests scripts)
failed=()

"$PY" -m ruff check "${PATHS[@]}" || failed+=("ruff check")
"$PY" -m ruff format --check "${PATHS[@]}" || failed+=("ruff format --check")
"$PY" -m mypy "${PATHS[@]}" || failed+=("mypy")

if [ ${#failed[@]} -ne 0 ]; then
    echo "[lint] failed: ${failed[*]}" >&2
    exit 1
fi
echo "[lint] ruff check, ruff format --check and mypy: no findings"
