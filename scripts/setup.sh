#!/usr/bin/env bash
# Idempotent setup for a fresh Debian machine (run as root or with sudo available).
# Second runs are fast: every step checks before it works.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
stamp=.venv/.recsvc-installed
installed=

# sansa -> scikit-sparse -> CHOLMOD headers; OpenBLAS so CHOLMOD does not fall back to the
# reference BLAS (minutes instead of hours on ML-20M-sized fits).
if [ ! -e /usr/include/suitesparse/cholmod.h ] || ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
    echo "[setup] installing libsuitesparse-dev libopenblas0-pthread"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libsuitesparse-dev libopenblas0-pthread >/dev/null
fi

# PostgreSQL server binaries: the ledger tests start a throwaway cluster from /usr/lib/postgresql/*/bin.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "[setup] installing postgresql"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi

# iproute2 (`ip netns`): tests/test_service_netns.py runs replicas as separate network hosts.
if ! command -v ip >/dev/null 2>&1; then
    echo "[setup] installing iproute2"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq iproute2 >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    # No pip inside: uv installs everything (ensurepip alone costs ~9 s of CPU).
    "$PY" -m venv --without-pip .venv
fi

# Reinstall only when the dependency pins change.
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[setup] installing recsvc and its pinned dependencies into .venv (first run takes ~1 min)"
    log=.venv/pip-install.log
    run_logged() {
        if ! "$@" >"$log" 2>&1; then
            grep -v "^WARNING: Location" "$log" >&2
            echo "[setup] '$*' failed; full log in $log" >&2
            exit 1
        fi
    }
    # uv installs the same pins as pip in a fifth of the time (it unpacks in parallel). It goes into
    # the venv by the system's pip (pip >= 22.3 has --python), or by the venv's own pip where there is none.
    if "$PY" -m pip --python .venv/bin/python --version >/dev/null 2>&1; then
        run_logged "$PY" -m pip --python .venv/bin/python install -q uv==0.13.9
    else
        run_logged .venv/bin/python -m ensurepip -q
        run_logged .venv/bin/python -m pip install -q uv==0.13.9
    fi
    # Offline first: with the pins already in uv's cache this takes 2 s instead of ~35 s of CPU (online,
    # uv revalidates every index page and rebuilds scikit-sparse from its sdist). A fresh cache falls
    # through to the online install.
    uv_install=(.venv/bin/uv pip install --python .venv/bin/python -q -e ".[all,dev]")
    "${uv_install[@]}" --offline >"$log" 2>&1 || run_logged "${uv_install[@]}"
    installed=1
fi

# Bytecode for the installed packages and the project, written even where PYTHONDONTWRITEBYTECODE
# is set (then no import writes a .pyc, and each process would compile every module it imports:
# ~0.3 s of CPU for the project alone). The packages' own test suites are never imported, so they
# are skipped (half the work); compileall skips whatever is already current.
.venv/bin/python -m compileall -q -j 0 -x '/tests?/' .venv/lib/python*/site-packages recsvc data_prep eval >/dev/null \
    || echo "[setup] some files did not byte-compile; each compiles when imported instead"

if [ -n "${installed:-}" ]; then
    # Fail loudly if the install did not take. sansa is found, not imported: importing it compiles
    # its numba kernels (~20 s of CPU), which scripts/warm_kernels.py or the first fit does instead.
    .venv/bin/python -c "import importlib.util, recsvc, sksparse; assert importlib.util.find_spec('sansa'), 'sansa'"
    echo "$want" > "$stamp"
fi

# Keep the committed gRPC stubs in sync with the proto (cheap; no-op when unchanged).
if [ -f scripts/gen_proto.sh ]; then bash scripts/gen_proto.sh; fi

# Node.js for the JavaScript reference device (clients/js): its tests run in the suite.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "[setup] installing nodejs npm"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi

# Its pinned packages: `npm ci` again only when package-lock.json changes.
js_want=$(sha256sum clients/js/package-lock.json | cut -d' ' -f1)
js_stamp=clients/js/node_modules/.recsvc-installed
if [ ! -f "$js_stamp" ] || [ "$(cat "$js_stamp")" != "$js_want" ]; then
    echo "[setup] installing the JavaScript device's packages (npm ci in clients/js)"
    (cd clients/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$js_want" > "$js_stamp"
fi
