#!/usr/bin/env bash
# Lint (ruff check), format check (ruff format --check) and type check (mypy) with the configuration in
# pyproject.toml, then check that every suppression states its reason. Runs every step even when one fails,
# so one run shows every finding; exits non-zero on any.
# RECSVC_PYTHON picks the interpreter whose ruff and mypy run (default: the project's .venv, as test.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${RECSVC_PYTHON:-.venv/bin/python}
PATHS=(recsvc data_prep eval tests scripts)
failed=()

"$PY" -m ruff check "${PATHS[@]}" || failed+=("ruff check")
"$PY" -m ruff format --check "${PATHS[@]}" || failed+=("ruff format --check")
"$PY" -m mypy "${PATHS[@]}" || failed+=("mypy")

# A suppression names its codes and gives its reason on the same line, after the codes:
#   x = f()  # type: ignore[attr-defined]  # polars stubs lack X        y = g  # noqa: B023  # bound per call
# (ruff and mypy already refuse suppressions without codes; this checks the reason.)
bare=$(grep -rnE --include='*.py' '#[[:space:]]*(noqa|type:[[:space:]]*ignore)' "${PATHS[@]}" \
    | grep -vE '_pb2(_grpc)?\.py:' \
    | grep -vE '#[[:space:]]*(noqa:[[:space:]]*[A-Z]+[0-9]+([[:space:]]*,[[:space:]]*[A-Z]+[0-9]+)*|type:[[:space:]]*ignore\[[a-z0-9, -]+\])[[:space:]]+#[[:space:]]*[^[:space:]]' || true)
if [ -n "$bare" ]; then
    echo "$bare"
    echo "[lint] $(printf '%s\n' "$bare" | wc -l) suppression(s) above give no reason (append '  # why' on the same line)" >&2
    failed+=("suppression reasons")
fi

if [ ${#failed[@]} -ne 0 ]; then
    echo "[lint] failed: ${failed[*]}" >&2
    exit 1
fi
echo "[lint] ruff check, ruff format --check, mypy and suppression reasons: no findings"
