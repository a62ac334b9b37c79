"""Preprocessing cache and the loader over its binary shards.

The layout (``cache/<key>/`` shards, ``manifest.json`` written last, ``LAST_USED``) is
``thrifty.shards``'; the key hashes the raw data's content fingerprint, the recipe's
preprocessing source and its params. An entry whose manifest cannot be read because it was
archived (S3, Azure, file) is a miss and is rebuilt, sooner than a restore; GCS reads its cold
classes in place, so there it stays a hit.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from thrifty.config import ConfigError
from thrifty.shards import MANIFEST, entry_prefix, mark_used, read_manifest
from thrifty.storage import NotFound, Store, atomic_write_bytes, join_key
from training.recipes.base import Dataset, EmptyDataError, Recipe, RecipeParams

log = logging.getLogger("thrifty.data")

FORMAT_VERSION = 1
SHARD_BYTES = 64 * 2**20  # rows per shard are chosen to keep each file near this size


def cache_key(recipe: Recipe, params: RecipeParams) -> str:
    """Hash of raw-data fingerprint + preprocessing source + params: equal keys mean equal shards."""
    parts = {
        "format": FORMAT_VERSION,
        "recipe": recipe.name,
        "raw": recipe.fingerprint_raw(params),
        "code": hashlib.sha256(recipe.preprocessing_source().encode()).hexdigest(),
        "params": params.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class CacheResult:
    key: str
    hit: bool
    manifest: dict[str, Any]
    seconds: float


class ShardedArray:
    """Rows of one array spread over shards, read by global row index without concatenating."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.shape = (int(self.offsets[-1]),) + tuple(parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, idx: np.ndarray) -> np.ndarray:
        if len(self.parts) == 1:
            return np.asarray(self.parts[0][idx])
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        out = np.empty((len(idx),) + self.shape[1:], dtype=self.dtype)
        for s in np.unique(which):
            sel = which == s
            out[sel] = self.parts[s][idx[sel] - self.offsets[s]]
        return out


class Split:
    """One split (train/val) of a cached dataset: named ShardedArrays of equal length."""

    def __init__(self, arrays: dict[str, ShardedArray]):
        self.arrays = arrays
        self.n = len(next(iter(arrays.values())))

    def batch(self, idx: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        out = {}
        for name, arr in self.arrays.items():
            t = torch.from_numpy(arr.take(idx))
            if t.dtype == torch.uint16:
                t = t.to(torch.int64)
            out[name] = t.to(device, non_blocking=device.type == "cuda")
        return out


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def write_shards(store: Store, key: str, dataset: Dataset, recipe: Recipe, params: RecipeParams,
                 preprocess_seconds: float = 0.0) -> dict[str, Any]:
    """Write every array as shards, then the manifest (the commit). Returns the manifest."""
    require_examples(recipe, params, {split: dataset.num_examples(split) for split in dataset.splits})
    prefix = entry_prefix(key)
    splits: dict[str, Any] = {}
    for split, arrays in dataset.splits.items():
        lengths = {len(a) for a in arrays.values()}
        if len(lengths) != 1:
            raise ValueError(f"recipe {recipe.name!r}: arrays of split {split!r} differ in length: {lengths}")
        splits[split] = {}
        for name, arr in arrays.items():
            row_bytes = max(1, arr[:1].nbytes)
            rows_per_shard = max(1, SHARD_BYTES // row_bytes)
            shards = []
            for i, start in enumerate(range(0, len(arr), rows_per_shard)):
                data = _npy_bytes(arr[start : start + rows_per_shard])
                file = f"{split}.{name}.{i:05d}.npy"
                store.put_bytes(join_key(prefix, file), data)
                shards.append({"file": file, "rows": int(min(rows_per_shard, len(arr) - start)),
                               "bytes": len(data), "sha256": _sha256_bytes(data)})
            splits[split][name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "shards": shards}
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "recipe": recipe.name,
        "params": params.model_dump(mode="json"),
        "created_unix": time.time(),
        "preprocess_seconds": round(preprocess_seconds, 3),  # what a cache hit saves
        "splits": splits,
        "meta": dataset.meta,
    }
    store.put_bytes(join_key(prefix, MANIFEST), json.dumps(manifest, indent=1).encode())
    return manifest


def require_examples(recipe: Recipe, params: RecipeParams, sizes: dict[str, int]) -> None:
    try:
        recipe.require_splits(sizes)
    except EmptyDataError as exc:
        raise EmptyDataError(f"{exc} (recipe_params {params.model_dump(mode='json')})") from None


class DamagedCache(RuntimeError):
    """A cache entry whose files do not match its manifest; it is preprocessed again."""


SizeCheck = Callable[[dict[str, int]], None]  # raises ConfigError when the data cannot train as configured


def _preprocess(recipe: Recipe, params: RecipeParams) -> Dataset:
    try:
        return recipe.preprocess(params)
    except OSError as exc:  # the raw data is gone or unreadable: a setting or a file to fix, not a crash
        raise ConfigError(f"recipe {recipe.name!r} could not read its raw data: {exc}") from None


def ensure_shards(store: Store, recipe: Recipe, params: RecipeParams, check: SizeCheck | None = None,
                  rebuild: bool = False) -> CacheResult:
    """Return the cached shards for (data, code, params), preprocessing only on a miss (or when ``rebuild``).
    ``check`` sees the splits' sizes before anything is written: a run that cannot train writes nothing."""
    t0 = time.perf_counter()
    key = cache_key(recipe, params)
    manifest = None if rebuild else read_manifest(store, key)
    if manifest is not None:
        if check is not None:
            check(manifest_sizes(manifest))
        log.info("preprocess cache hit: %s", key)
        mark_used(store, key)
        return CacheResult(key, True, manifest, time.perf_counter() - t0)
    log.info("preprocess cache %s: %s; preprocessing %s", "rebuild" if rebuild else "miss", key, recipe.name)
    dataset = _preprocess(recipe, params)
    sizes = {split: dataset.num_examples(split) for split in dataset.splits}
    require_examples(recipe, params, sizes)
    if check is not None:
        check(sizes)
    manifest = write_shards(store, key, dataset, recipe, params, preprocess_seconds=time.perf_counter() - t0)
    return CacheResult(key, False, manifest, time.perf_counter() - t0)


def manifest_sizes(manifest: dict[str, Any]) -> dict[str, int]:
    """Examples per split of a cache entry."""
    return {split: arrays[next(iter(arrays))]["shape"][0] for split, arrays in manifest["splits"].items() if arrays}


def open_cache(store: Store, recipe: Recipe, params: RecipeParams, splits: tuple[str, ...],
               check: SizeCheck | None = None) -> tuple[CacheResult, dict[str, Split]]:
    """The entry and its splits, every shard checked against the manifest; a damaged entry is preprocessed again."""
    cache = ensure_shards(store, recipe, params, check)
    try:
        return cache, {name: load_split(store, cache.manifest, name) for name in splits}
    except DamagedCache as exc:
        log.warning("%s; preprocessing the entry again", exc)
    cache = ensure_shards(store, recipe, params, check, rebuild=True)
    return cache, {name: load_split(store, cache.manifest, name) for name in splits}


def _local_cache_dir() -> Path:
    return Path(os.environ.get("THRIFTY_LOCAL_CACHE", Path(tempfile.gettempdir()) / "thrifty-shards"))


_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) of shard files hashed by this process


def _sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path, shard: dict[str, Any], where: str) -> None:
    """Size and sha256 against the manifest, hashed once per process per file version."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DamagedCache(f"shard {where} is missing") from None
    sig = (str(path), st.st_size, st.st_mtime_ns)
    if sig in _VERIFIED:
        return
    if st.st_size != shard["bytes"]:
        raise DamagedCache(f"shard {where} has {st.st_size} bytes, its manifest says {shard['bytes']}")
    if _sha256_path(path) != shard["sha256"]:
        raise DamagedCache(f"shard {where} does not match its manifest's sha256 (damaged in place)")
    _VERIFIED.add(sig)


def _open_shard(store: Store, key: str, shard: dict[str, Any]) -> np.ndarray:
    obj = join_key(entry_prefix(key), shard["file"])
    where = f"{obj} in {store.uri}"
    path = store.local_path(obj)
    if path is None:  # object store: fetch once into a local cache, verified by hash
        path = _local_cache_dir() / key / shard["file"]
        if not (path.is_file() and path.stat().st_size == shard["bytes"]):
            try:
                data = store.get_bytes(obj)
            except NotFound:
                raise DamagedCache(f"shard {where} is missing") from None
            if _sha256_bytes(data) != shard["sha256"]:
                raise DamagedCache(f"shard {where} does not match its manifest's sha256")
            atomic_write_bytes(path, data)
    _verify(path, shard, where)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:  # a header the hash check let through cannot happen; a race can
        raise DamagedCache(f"shard {where} cannot be read ({exc})") from None


def load_split(store: Store, manifest: dict[str, Any], split: str) -> Split:
    arrays = {
        name: ShardedArray([_open_shard(store, manifest["key"], s) for s in spec["shards"]])
        for name, spec in manifest["splits"][split].items()
    }
    return Split(arrays)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of training examples in ``epoch``: a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)
