"""synthetic: random feature rows labelled by a fixed random teacher, any size, made in chunks.

The data set larger than memory of the tests and ``bench/bench_bigdata.py``: ``preprocess`` yields
Dataset chunks of ``chunk_rows`` rows (train rows first, then val; the chunk at the boundary holds
both), or returns one Dataset when ``chunk_rows`` is 0. Rows are made in fixed blocks, so the data
are the same however they are chunked. Use it as ``recipe: training.recipes.synthetic:recipe``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

import numpy as np
import torch
from pydantic import Field

from training.recipes.base import Dataset, Recipe, RecipeParams
from training.recipes.digits import step  # the same classification step: logits, cross-entropy, correct

BLOCK_ROWS = 256  # rows are generated in blocks of this many, each from its own seed: chunking cannot change them


class SyntheticParams(RecipeParams):
    rows: int = Field(8192, ge=1, description="Training examples (rows).")
    val_rows: int = Field(1024, ge=1, description="Validation examples (rows).")
    features: int = Field(64, ge=1, description="float32 features per row (a row is 4 x features bytes).")
    classes: int = Field(10, ge=2, description="Label classes.")
    hidden: int = Field(32, ge=1, description="Hidden units of the MLP.")
    chunk_rows: int = Field(0, ge=0, description="Rows per chunk preprocess yields; 0 = one Dataset, whole.")
    seed: int = Field(0, ge=0, description="Seed of the features and of the teacher that labels them.")


def fingerprint_raw(params: SyntheticParams) -> str:
    # no raw files: the data are a pure function of these (chunk_rows only changes how they arrive)
    raw = params.model_dump(include={"rows", "val_rows", "features", "classes", "seed"})
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()


def _rows(params: SyntheticParams, split: str, start: int, end: int) -> dict[str, np.ndarray]:
    """Rows [start, end) of a split: features ~ N(0, 1), label = argmax of a fixed linear teacher."""
    teacher = np.random.default_rng([params.seed, 7]).standard_normal((params.features, params.classes),
                                                                      dtype=np.float32)
    split_id = 0 if split == "train" else 1
    first, last = start // BLOCK_ROWS, (end - 1) // BLOCK_ROWS
    x = np.empty(((last - first + 1) * BLOCK_ROWS, params.features), dtype=np.float32)  # filled in place: one copy
    for b in range(first, last + 1):
        at = (b - first) * BLOCK_ROWS
        np.random.default_rng([params.seed, split_id, b]).standard_normal(dtype=np.float32, out=x[at : at + BLOCK_ROWS])
    x = x[start - first * BLOCK_ROWS : end - first * BLOCK_ROWS]
    return {"x": x, "y": (x @ teacher).argmax(axis=1).astype(np.int64)}


def _chunks(params: SyntheticParams) -> Iterator[Dataset]:
    meta = {"features": params.features, "classes": params.classes}
    total = params.rows + params.val_rows
    for start in range(0, total, params.chunk_rows):
        end = min(start + params.chunk_rows, total)
        splits = {}
        if start < params.rows:
            splits["train"] = _rows(params, "train", start, min(end, params.rows))
        if end > params.rows:
            splits["val"] = _rows(params, "val", max(start - params.rows, 0), end - params.rows)
        yield Dataset(splits=splits, meta=meta)


def preprocess(params: SyntheticParams) -> Dataset | Iterator[Dataset]:
    if params.chunk_rows:
        return _chunks(params)
    return Dataset(splits={"train": _rows(params, "train", 0, params.rows),
                           "val": _rows(params, "val", 0, params.val_rows)},
                   meta={"features": params.features, "classes": params.classes})


def build_model(params: SyntheticParams, meta: dict[str, Any]) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(meta["features"], params.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(params.hidden, meta["classes"]))


def recipe() -> Recipe:
    return Recipe(name="synthetic", params_model=SyntheticParams, fingerprint_raw=fingerprint_raw,
                  preprocess=preprocess, build_model=build_model, step=step, metrics={"accuracy": "correct"})
