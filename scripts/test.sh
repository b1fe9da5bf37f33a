#!/usr/bin/env bash
# Set up (idempotent), lint and type-check (scripts/lint.sh) while numba compiles the kernels, run the whole test suite, run its
# float_paths tests again on another CPU's code paths (scripts/other_cpu.sh), and fail if any process
# the run started is still running (scripts/leftovers.py).
# Arguments go to pytest; with arguments, only that pytest run and the leftover check are done.
# The whole suite runs on RECSVC_TEST_WORKERS pytest-xdist workers (default 2), each taking whole files,
# so a module's fixtures are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# numba's kernels compile on the second core while the linter runs on the first (scripts/warm_kernels.py).
.venv/bin/python scripts/warm_kernels.py &
warm=$!
# On the CPU those two leave idle, pytest rewrites the test modules' asserts once and writes them to
# tests/**/__pycache__ (even where PYTHONDONTWRITEBYTECODE is set): every pytest process below then
# loads them instead of rewriting ~150 modules itself (~5 s of CPU each).
PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
rewrite=$!
lint_status=0
bash scripts/lint.sh || lint_status=$?
wait "$warm"
wait "$rewrite" || true  # a collection error shows in the run below
[ "$lint_status" -eq 0 ] || exit "$lint_status"

RECSVC_TEST_RUN=$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(8))')
export RECSVC_TEST_RUN
run_start=$(date +%s)
status=0
run_all=
if [ $# -eq 0 ]; then
    set -- -n "${RECSVC_TEST_WORKERS:-2}" --dist loadfile
    run_all=1
fi
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 0 ] && [ -n "$run_all" ]; then
    bash scripts/other_cpu.sh || status=$?
fi
.venv/bin/python scripts/leftovers.py "$RECSVC_TEST_RUN" --since "$run_start" || { [ "$status" -ne 0 ] || status=1; }
exit "$status"
