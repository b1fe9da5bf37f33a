#!/usr/bin/env bash
# Run the tests marked float_paths again on other CPU code paths than this machine's own, so one
# machine shows what another would compute: numpy's SIMD dispatch and OpenBLAS's kernel are each
# moved one level down.
#   AVX-512 host (X86_V4): numpy without AVX-512 and OpenBLAS's Haswell kernel (what an AVX2-only
#                          machine such as AMD Zen 3 computes).
#   AVX2 host (X86_V3):    numpy at its x86-64-v2 baseline and OpenBLAS's Nehalem kernel (an SSE4.2
#                          machine).
# numba's target (NUMBA_CPU_NAME) is left alone: no kernel uses fastmath (test_unchanged checks), so
# LLVM neither reassociates nor contracts to FMA and the target changes speed, not bits. Prep and eval
# wrote identical files with NUMBA_CPU_NAME=sandybridge and the native znver3 target (2026-12-01),
# and moving it would recompile every kernel (about 50 s of CPU).
# Elsewhere (an ARM Mac, aarch64) there is no lower level to move to, and the step says so.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${RECSVC_PYTHON:-.venv/bin/python}
level=$(NPY_DISABLE_CPU_FEATURES="" "$PY" -c '
import platform
from numpy._core._multiarray_umath import __cpu_features__ as f
if platform.machine() not in ("x86_64", "AMD64"):
    print("none")
else:
    print("v4" if f.get("AVX512F") else "v3" if f.get("AVX2") else "none")
')
case "$level" in
    v4) mode=(NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" OPENBLAS_CORETYPE=Haswell) ;;
    v3) mode=(NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" OPENBLAS_CORETYPE=Nehalem) ;;
    *)
        echo "[other-cpu] $(uname -m): no lower x86 level to emulate; the float_paths tests ran once, natively"
        exit 0
        ;;
esac
echo "[other-cpu] float_paths tests again with ${mode[*]}"
exec env "${mode[@]}" "$PY" -m pytest -m float_paths "$@"
