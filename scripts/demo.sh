#!/usr/bin/env bash
# Set up (idempotent) and run the end-to-end demo: prep ml-100k, evaluate, serve, select.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/recsvc demo "$@"
