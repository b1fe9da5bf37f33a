"""Tests of the project's shape rather than its behaviour in one part: the layering of the packages,
what a serving host must not load, the test suite's own layout, the benchmark package, and the
byte-for-byte outputs of a prep + eval run that every refactor must keep.

They read the source tree (``REPO``, the repository root) and run ``recsvc`` or Python in
subprocesses, so they need no fixtures of their own.
"""
