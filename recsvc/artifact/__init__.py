"""The one reader and writer of artifact directories (docs/reference/specification.md §4).

:mod:`~recsvc.artifact.format` (file names, schemas, checks), :mod:`~recsvc.artifact.manifest`
(the typed ``manifest.json``), :mod:`~recsvc.artifact.reader` (:func:`load_artifact`, which
verifies the checksums before anything is trusted) and :mod:`~recsvc.artifact.writer`
(:class:`ArtifactWriter`: a crash never leaves a half-written artifact).
"""

from recsvc.artifact.bundle import ClientBundle, read_client_bundle
from recsvc.artifact.candidates import CandidateMatrix
from recsvc.artifact.format import (
    CANDIDATE_ARRAYS_DIR,
    CANDIDATES,
    MANIFEST,
    MIN_SENSITIVITY,
    POLICY,
    POLICY_SCHEMA,
    POPULATION,
    ArtifactError,
    validate_policy,
)
from recsvc.artifact.manifest import Manifest, MultiSelectInfo, PolicyInfo, SansaInfo, SpearmanStats, SplitInfo
from recsvc.artifact.reader import Artifact, load_artifact, read_manifest
from recsvc.artifact.serving import write_serving_bundle
from recsvc.artifact.writer import ArtifactWriter

__all__ = [
    "CANDIDATES",
    "CANDIDATE_ARRAYS_DIR",
    "MANIFEST",
    "MIN_SENSITIVITY",
    "POLICY",
    "POLICY_SCHEMA",
    "POPULATION",
    "Artifact",
    "ArtifactError",
    "ArtifactWriter",
    "CandidateMatrix",
    "ClientBundle",
    "Manifest",
    "MultiSelectInfo",
    "PolicyInfo",
    "SansaInfo",
    "SpearmanStats",
    "SplitInfo",
    "load_artifact",
    "read_client_bundle",
    "read_manifest",
    "validate_policy",
    "write_serving_bundle",
]
