"""An up-front estimate of `recsvc prep`'s peak memory, from sizes known before loading anything
(a synthetic preset's, or the input files' bytes), so a run that cannot finish within
``--memory-limit`` fails at once instead of being killed hours later
(docs/guides/offline-pipeline.md#memory).

The model is the pipeline's three peaks, whichever is largest, with constants measured by
``scripts/bench/prep_scale.py`` (PSS of the whole process tree):

* load and split: bytes per interaction held while the matrix is built and split;
* fit: the split (8 bytes per interaction) plus SANSA: its float64 copy of the training data,
  and for CHOLMOD the factor of the items × items Gramian, near dense for Netflix-like data;
* scoring: each worker's chunk of users × items float64 scores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recsvc.checks import ParamError

GIB = 1 << 30
BASE_BYTES = int(0.8 * GIB)  # interpreter, numpy/scipy/polars/numba/sansa, the engine's workers
SYNTHETIC_LOAD_PER_INTERACTION = 16.0  # generator blocks + the matrix + the split's copies (≈ 13 measured)
FILE_LOAD_PER_INTERACTION = 40.0  # parsed arrays, their concatenation, the key sort (Netflix: 41.6)
SPLIT_PER_INTERACTION = 8.0  # int32 index + float32 one, train and held-out matrices
SANSA_PER_INTERACTION = 12.0  # SANSA's float64 copy of the training data with its indices
CHOLMOD_PER_ITEM_PAIR = 20.0  # Gramian + factor + its CSC copy (5.9 GiB at 17,770 items, measured)
ICF_PER_ITEM_PAIR = 2.0  # the incomplete factor and the Gramian's sparse pattern
SCORE_COPIES = 4  # scores, their clipped/masked copy, the top-k partition, the block write

# Bytes of text per rating in each dataset's original files, to size the data before reading it.
BYTES_PER_RATING = {"netflix": 20.0, "ml-20m": 28.0, "ml-100k": 20.0, "amazon-book": 6.0}
ITEMS = {"netflix": 17_770, "ml-20m": 26_744, "ml-100k": 1_682, "amazon-book": 91_599}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'12GiB', '12G', '512MiB', '2.5T' or plain bytes → bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ParamError(
            "{memory_limit} {value} is not a size; expected e.g. 12GiB, 512MiB or a number of bytes",
            value=repr(text),
        )
    power = " KMGT".index((m.group(2) or " ").upper())
    size = int(float(m.group(1)) * 1024**power)
    if size <= 0:
        raise ParamError("{memory_limit} must be positive, got {value}", value=repr(text))
    return size


@dataclass(frozen=True)
class Estimate:
    interactions: int
    items: int
    load_split: int
    fit: int
    scoring: int

    @property
    def peak(self) -> int:
        return BASE_BYTES + max(self.load_split, self.fit, self.scoring)

    def describe(self) -> str:
        parts = ", ".join(
            f"{name} {value / GIB:.1f} GiB"
            for name, value in (("load and split", self.load_split), ("fit", self.fit), ("scoring", self.scoring))
        )
        return f"{self.peak / GIB:.1f} GiB for {self.interactions:,} interactions and {self.items:,} items ({parts})"


def estimate(
    interactions: int, items: int, factorizer: str, from_files: bool, chunk_users: int, workers: int
) -> Estimate:
    load = (FILE_LOAD_PER_INTERACTION if from_files else SYNTHETIC_LOAD_PER_INTERACTION) * interactions
    pair = CHOLMOD_PER_ITEM_PAIR if factorizer == "cholmod" else ICF_PER_ITEM_PAIR
    fit = (SPLIT_PER_INTERACTION + SANSA_PER_INTERACTION) * interactions + pair * items * items
    scoring = SPLIT_PER_INTERACTION * interactions + workers * SCORE_COPIES * 8 * chunk_users * items
    return Estimate(interactions, items, int(load), int(fit), int(scoring))


def file_interactions(dataset: str, data_dir: Path | None) -> int:
    """Ratings in a real dataset's files, estimated from their size (0 if none is found yet: the
    loader reports missing files)."""
    if data_dir is None or not Path(data_dir).is_dir():
        return 0
    names = {
        "netflix": ["combined_data_*.txt", "training_set/mv_*.txt", "mv_*.txt"],
        "ml-20m": ["ratings.csv", "rating.csv"],
        "ml-100k": ["u.data", "ml-100k.inter"],
        "amazon-book": ["train.txt", "test.txt"],
    }[dataset]
    size = sum(p.stat().st_size for pattern in names for p in Path(data_dir).glob(pattern) if p.is_file())
    return int(size / BYTES_PER_RATING[dataset])


def check(limit: int, est: Estimate) -> None:
    if est.peak > limit:
        raise ParamError(
            "this run needs an estimated {need}, more than {memory_limit} {limit}; "
            "expected a larger {memory_limit}, or fewer interactions/items (the estimate: {detail})",
            need=f"{est.peak / GIB:.1f} GiB",
            limit=f"{limit / GIB:.1f} GiB",
            detail=est.describe(),
        )
