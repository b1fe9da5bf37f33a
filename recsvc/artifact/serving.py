"""The serving bundle: the public subset of an artifact that ``recsvc serve`` needs.

A serving host never reads the test users' candidates and histories or the population's
scores, so it should not hold them. The bundle keeps only the files
:func:`~recsvc.artifact.format.is_serving_file` names (per-item ranges, the model, the policy
table, the multi-selection client bundle) with a manifest of its own (``kind`` = ``"serving"``),
and is written atomically like any artifact.
"""

from __future__ import annotations

from pathlib import Path

from recsvc.artifact.format import SERVING_KIND, ArtifactError, is_serving_file
from recsvc.artifact.reader import load_artifact
from recsvc.artifact.writer import ArtifactWriter

# Manifest fields that describe per-user evaluation files the bundle leaves out.
_EVALUATION_FIELDS = ("accuracy", "accuracy_users", "candidates_per_user")


def write_serving_bundle(artifacts: Path, out: Path, force: bool = False) -> Path:
    """Writes the serving bundle of the full artifact ``artifacts`` to ``out`` and returns it.
    The source is verified (checksums) first; nothing appears at ``out`` unless it all works."""
    writer = ArtifactWriter(out, force, protect={"artifacts": artifacts})  # checks out before any work
    art = load_artifact(artifacts)
    if art.is_serving_bundle:
        raise ArtifactError(f"{artifacts} is already a serving bundle; expected a full artifact from `recsvc prep`")
    keep = sorted(rel for rel in art.manifest.files if is_serving_file(rel))
    content = {k: v for k, v in art.manifest.to_dict().items() if k not in ("files", "format_version")}
    for name in _EVALUATION_FIELDS:
        content.pop(name, None)
    content["kind"] = SERVING_KIND
    with writer:
        writer.keep(art.path, keep)
        return writer.commit(content)
