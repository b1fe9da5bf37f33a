"""A serving host installs `recsvc[serve]` only: the service must not load training, plotting,
the Dask engine or the other parts. Checked in a fresh interpreter, on every service module.

The probe hides those packages, as on a serving host where they are not installed: a service
module that needs one fails to import, and a request for one from project code is reported even
when it is caught. Third-party optional imports are allowed to fall back (scipy.optimize tries
``sksparse`` when it is there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_FOR_SERVING = ("sansa", "sksparse", "dask", "distributed", "matplotlib", "pyarrow", "data_prep", "eval")

_PROBE = """
import json, pkgutil, sys, traceback
HIDDEN, REPO = set(sys.argv[1].split(",")), sys.argv[2]
requests = []

class Hide:  # a serving host does not have these
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in HIDDEN:
            return None
        frames = [f for f in traceback.extract_stack() if "importlib" not in f.filename]
        requests.append([name, frames[-2].filename, frames[-2].lineno])
        raise ModuleNotFoundError(f"No module named {name!r} (hidden: not installed on a serving host)", name=name)

sys.meta_path.insert(0, Hide())
import recsvc.service, recsvc.service.server
named = ["recsvc.service", "recsvc.service.server"]
for pkg in ("recsvc.service", "recsvc.v1"):  # and every other module of the service part
    mod = __import__(pkg, fromlist=["_"])
    for info in pkgutil.iter_modules(mod.__path__, pkg + "."):
        __import__(info.name)
        named.append(info.name)
print(json.dumps({"named": named, "requests": requests, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_the_service_loads_nothing_a_serving_host_does_not_install():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(NOT_FOR_SERVING), str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert {
        "recsvc.service.server",
        "recsvc.service.servicer",
        "recsvc.service.cli",
        "recsvc.v1.selection_pb2_grpc",
    } <= set(seen["named"])
    assert {"grpc", "numpy", "recsvc"} <= set(seen["loaded"])  # the probe did import the service
    assert sorted(set(NOT_FOR_SERVING) & set(seen["loaded"])) == []
    from_project = [
        r for r in seen["requests"] if Path(r[1]).resolve().is_relative_to(REPO) and ".venv" not in Path(r[1]).parts
    ]
    assert from_project == [], from_project


_HIDE_AND_RUN = """
import sys
from recsvc.app.cli import main

class Hide:  # a host installed without the eval extra
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pyarrow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Hide())
sys.exit(main(sys.argv[1:]))
"""


def test_a_command_without_its_extra_says_which_extra_to_install(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _HIDE_AND_RUN, "eval-synthetic", "--scenario", "1", "--out", str(tmp_path / "r")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert (
        out.stderr.strip() == "recsvc eval-synthetic: error: pyarrow is not installed; this command needs "
        "pip install 'recsvc[eval]'"
    )
    assert not (tmp_path / "r").exists()
