"""The JavaScript reference device (clients/js): its own tests (`node --test`, against a live
`recsvc serve` they start) run in this suite, and it computes what the Python device computes:
the same embeddings, scores and codes for the same histories, and bit-identical integer signals
(lattice and code) for the same random words."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recsvc.device import Device
from recsvc.multiselection import Words
from recsvc.service.testing import REPO, item_ids

JS = REPO / "clients" / "js"
WORDS = 4000  # enough for any of these signals: a d = 6 signal takes about 60


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("Node.js and clients/js/node_modules are needed: run `bash scripts/setup.sh`")
    return node


def test_the_javascript_device_passes_its_tests_against_a_live_server() -> None:
    env = {**os.environ, "RECSVC_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    run = subprocess.run([_node(), "--test", "test/"], cwd=JS, env=env, capture_output=True, text=True, timeout=180)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    passed = re.search(r"^# pass (\d+)$", run.stdout, re.M)
    assert passed and int(passed.group(1)) >= 9 and re.search(r"^# fail 0$", run.stdout, re.M), tail


def test_the_javascript_and_python_devices_agree(bundle: Path) -> None:
    device = Device.load(bundle)
    ids = item_ids()
    histories = [[], ["it3"], ["it3", "it17", "it29", "it17", "ghost"], ids[::3], ids, ["ghost"]]
    items = ids[:12]
    words = np.random.default_rng(11).integers(0, 2**32, WORDS, dtype=np.uint64).tolist()
    query = json.dumps({"histories": histories, "items": items, "epsilon": 0.3, "words": words})
    run = subprocess.run(
        [_node(), "bin/crosscheck.js", str(bundle)], cwd=JS, input=query, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    js = json.loads(run.stdout)
    codes = []
    for h, e, s, z, c, y in zip(
        histories, js["embeddings"], js["scores"], js["signals"], js["codes"], js["codeSignals"], strict=True
    ):
        np.testing.assert_allclose(e, device.embedding(h), rtol=0, atol=1e-9)
        want = device.scores(h, items)
        got = np.array([-np.inf if x is None else x for x in s])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert [int(v) for v in z] == device.signal(h, 0.3, Words(words)).tolist()  # integers: exactly equal
        assert c == device.code(h) and y == device.code_signal(h, 0.3, Words(words))
        codes.append(c)
    assert len(set(codes)) >= 2  # the histories' codes differ
    clipped = [np.abs(device.embedding(h)).sum() for h in histories]
    assert max(clipped) == pytest.approx(device.radius)  # some history is clipped
