#!/usr/bin/env bash
# Regenerate the committed gRPC stubs (recsvc/v1/selection_pb2*.py[i]) from proto/.
# Idempotent and fast: generates into a temp dir and replaces only files whose bytes changed,
# so an unchanged proto leaves the committed stubs (and their mtimes) untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PROTOC_PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -Iproto --python_out="$tmp" --grpc_python_out="$tmp" --pyi_out="$tmp" \
    proto/recsvc/v1/selection.proto
mkdir -p recsvc/v1
[ -f recsvc/v1/__init__.py ] || echo '"""Generated gRPC stubs for recsvc.v1 (see proto/ and scripts/gen_proto.sh)."""' > recsvc/v1/__init__.py
for f in selection_pb2.py selection_pb2_grpc.py selection_pb2.pyi; do
    if ! cmp -s "$tmp/recsvc/v1/$f" "recsvc/v1/$f"; then
        cp "$tmp/recsvc/v1/$f" "recsvc/v1/$f"
        echo "[gen_proto] updated recsvc/v1/$f"
    fi
done
