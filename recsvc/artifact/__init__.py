"""The one reader and writer of artifact directories (docs/reference/specification.md §4).

:mod:`~recsvc.artifact.format` (file names, schemas, checks), :mod:`~recsvc.artifact.manifest`
(the typed ``manifest.json``), :mod:`~recsvc.artifact.reader` (:func:`load_artifact`, which
verifies the checksums before anything is trusted) and :mod:`~recsvc.artifact.writer`
(:class:`ArtifactWriter`: a crash never leaves a half-written artifact).
"""

from recsvc.artifact.bundle import ClientBundle, read_client_bundle
from recsvc.artifact.candidates import CandidateMatrix
from recsvc.artifact.format import (
    CANDIDATE_ARRAY_FILES,
    CANDIDATE_ARRAYS_DIR,
    CANDIDATES,
    CANDIDATES_SCHEMA,
    CLIENT_DIR,
    FORMAT_VERSION,
    ITEMS,
    ITEMS_SCHEMA,
    MANIFEST,
    MIN_SENSITIVITY,
    MODEL_DIR,
    MULTISELECT_DIR,
    POLICY,
    POLICY_SCHEMA,
    POPULATION,
    SERVING_KIND,
    TEST_INPUTS,
    TEST_TARGETS,
    ArtifactError,
    json_default,
    sha256_file,
    validate_candidates,
    validate_items,
    validate_policy,
)
from recsvc.artifact.manifest import Manifest, MultiSelectInfo, PolicyInfo, SansaInfo, SpearmanStats, SplitInfo
from recsvc.artifact.reader import Artifact, load_artifact, load_model, read_manifest
from recsvc.artifact.serving import write_serving_bundle
from recsvc.artifact.writer import ArtifactWriter, save_model

__all__ = [
    "CANDIDATES",
    "CANDIDATES_SCHEMA",
    "CANDIDATE_ARRAYS_DIR",
    "CANDIDATE_ARRAY_FILES",
    "CLIENT_DIR",
    "FORMAT_VERSION",
    "ITEMS",
    "ITEMS_SCHEMA",
    "MANIFEST",
    "MIN_SENSITIVITY",
    "MODEL_DIR",
    "MULTISELECT_DIR",
    "POLICY",
    "POLICY_SCHEMA",
    "POPULATION",
    "SERVING_KIND",
    "TEST_INPUTS",
    "TEST_TARGETS",
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
    "json_default",
    "load_artifact",
    "load_model",
    "read_client_bundle",
    "read_manifest",
    "save_model",
    "sha256_file",
    "validate_candidates",
    "validate_items",
    "validate_policy",
    "write_serving_bundle",
]
