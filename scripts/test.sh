#!/usr/bin/env bash
# Set up (idempotent), lint and type-check (scripts/lint.sh), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
exec .venv/bin/python -m pytest "$@"
