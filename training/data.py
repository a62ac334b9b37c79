"""Preprocessing cache and the loader over its binary shards.

The layout (``cache/<key>/`` shards, ``manifest.json`` written last, ``LAST_USED``) is
``thrifty.shards``'; the key hashes the raw data's content fingerprint, the recipe's
preprocessing source and its params. An entry whose manifest cannot be read because it was
archived (S3, Azure, file) is a miss and is rebuilt, sooner than a restore; GCS reads its cold
classes in place, so there it stays a hit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrifty.config import ConfigError
from thrifty.shards import entry_prefix, mark_used, read_manifest
from thrifty.storage import NotFound, Store, join_key
from training.recipes.base import Recipe, RecipeParams
from training.shard_write import FORMAT_VERSION, SizeCheck, require_examples, write_shards

__all__ = ["CacheResult", "DamagedCache", "ShardedArray", "Split", "SizeCheck", "cache_key", "ensure_shards",
           "epoch_permutation", "load_split", "manifest_sizes", "open_cache", "require_examples", "write_shards"]

log = logging.getLogger("thrifty.data")

# Shard pages a reader has touched stay mapped into the process (and count in its RSS) until released; past this
# many bytes per array they are released (madvise DONTNEED: the page cache keeps them, a re-read is a minor fault),
# so reading a data set larger than memory keeps RSS near this, not near the data set.
RESIDENT_BYTES = 128 * 2**20
# what one touched row may map: the page cache holds files in large folios (2 MiB measured on ext4, kernel 6.18)
# and a fault maps the whole folio around the row, so a random row costs up to this much RSS until released
_MAPPED_PER_TOUCH_BYTES = 2 * 2**20


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
    """Rows of one array spread over shards, read by global row index without concatenating.

    ``take`` gathers a batch shard by shard (one fancy index per shard it touches), and keeps the
    shard pages it has mapped under ``RESIDENT_BYTES`` by releasing them (``maps``: the shards'
    mmaps, None for in-memory parts), so a pass over a data set larger than memory stays small.
    """

    def __init__(self, parts: list[np.ndarray], maps: list[mmap.mmap | None] | None = None):
        self.parts = parts
        self.maps = maps if maps is not None else [None] * len(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.shape = (int(self.offsets[-1]),) + tuple(parts[0].shape[1:])
        self.dtype = parts[0].dtype
        self.row_bytes = max(1, self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64)))
        self._mapped: dict[int, int] = {}  # shard -> bytes its reads may have mapped since the last release
        self._map_bytes = sum(len(m) for m in self.maps if m is not None)  # all of it mapped at once

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(self.parts) == 1:
            out = np.asarray(self.parts[0][idx])
            self._account(0, idx)
            return out
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        out = np.empty((len(idx),) + self.shape[1:], dtype=self.dtype)
        order = np.argsort(which, kind="stable")  # group the batch by shard: one gather per shard touched
        grouped = which[order]
        bounds = np.flatnonzero(np.diff(grouped)) + 1
        for sel in np.split(order, bounds):
            s = int(which[sel[0]])
            local = idx[sel] - self.offsets[s]
            out[sel] = self.parts[s][local]
            self._account(s, local)
        return out

    def _account(self, shard: int, local: np.ndarray) -> None:
        """Add what a read may have mapped (each row's folios, at most the span they cover and the shard)."""
        if self._map_bytes <= RESIDENT_BYTES or self.maps[shard] is None or not len(local):
            return  # (an array that fits under the limit whole never needs a release: no bookkeeping per batch)
        span = (int(local.max()) - int(local.min()) + 1) * self.row_bytes + 2 * _MAPPED_PER_TOUCH_BYTES
        scattered = len(local) * (self.row_bytes + _MAPPED_PER_TOUCH_BYTES)
        self._mapped[shard] = self._mapped.get(shard, 0) + min(span, scattered, len(self.maps[shard]))
        if sum(self._mapped.values()) > RESIDENT_BYTES:
            self.release()

    def release(self) -> None:
        """Unmap the pages reads have touched; the data stays in the page cache (and the file), so nothing is lost."""
        for shard in self._mapped:
            m = self.maps[shard]
            if m is not None and hasattr(m, "madvise"):
                m.madvise(mmap.MADV_DONTNEED)
        self._mapped.clear()


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


class DamagedCache(RuntimeError):
    """A cache entry whose files do not match its manifest; it is preprocessed again."""


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
    _clear_entry(store, key)
    try:
        data = recipe.preprocess(params)  # a Dataset, or a generator of chunks consumed as the shards are written
    except OSError as exc:  # the raw data is gone or unreadable: a setting or a file to fix, not a crash
        raise ConfigError(f"recipe {recipe.name!r} could not read its raw data: {exc}") from None
    manifest = write_shards(store, key, data, recipe, params, check=check, started=t0)
    return CacheResult(key, False, manifest, time.perf_counter() - t0)


def _clear_entry(store: Store, key: str) -> None:
    """A miss starts from an empty entry: what a killed writer left (shards with no manifest, temp files) or a
    damaged entry holds is removed first, so the entry is uncommitted until the new manifest lands."""
    prefix = entry_prefix(key)
    store.sweep(prefix)
    left = [o.key for o in store.list(prefix + "/")]
    for obj in left:
        store.delete(obj)
    if left:
        log.info("preprocess cache entry %s: removed %d object(s) of an unfinished or damaged write", key, len(left))


def manifest_sizes(manifest: dict[str, Any]) -> dict[str, int]:
    """Examples per split of a cache entry."""
    return {split: arrays[next(iter(arrays))]["shape"][0] for split, arrays in manifest["splits"].items() if arrays}


def open_cache(store: Store, recipe: Recipe, params: RecipeParams,
               check: SizeCheck | None = None) -> tuple[CacheResult, dict[str, Split]]:
    """The entry and the splits the recipe reads (train and its eval splits), every shard checked against the
    manifest; a damaged entry is preprocessed again."""
    cache = ensure_shards(store, recipe, params, check)
    try:
        return cache, {name: load_split(store, cache.manifest, name) for name in recipe.splits}
    except DamagedCache as exc:
        log.warning("%s; preprocessing the entry again", exc)
    cache = ensure_shards(store, recipe, params, check, rebuild=True)
    return cache, {name: load_split(store, cache.manifest, name) for name in recipe.splits}


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


def _fetch(store: Store, obj: str, path: Path, where: str) -> None:
    """An object store's shard streamed to a local file (never whole in memory), atomically."""
    try:
        store.get_file(obj, path)
    except NotFound:
        raise DamagedCache(f"shard {where} is missing") from None


def _local_copy(store: Store, key: str, obj: str, shard: dict[str, Any], where: str) -> Path:
    """An object store's shard in this machine's local cache, fetched once and verified by hash; a local copy
    damaged since it was fetched is fetched again."""
    path = _local_cache_dir() / key / shard["file"]
    fetched = not (path.is_file() and path.stat().st_size == shard["bytes"])
    if fetched:
        _fetch(store, obj, path, where)
    try:
        _verify(path, shard, where)
    except DamagedCache:
        path.unlink(missing_ok=True)
        if fetched:
            raise
        _fetch(store, obj, path, where)
        _verify(path, shard, where)
    return path


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _map_npy(path: Path) -> tuple[np.ndarray, mmap.mmap | None]:
    """A read-only array over the file's pages, and its mmap (kept so the reader can release pages it touched)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = _HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        if dtype.hasobject or fortran:
            raise ValueError("not a C-ordered array of numbers")
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize == 0:
            return np.empty(shape, dtype=dtype), None
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(m, "madvise"):
        m.madvise(mmap.MADV_RANDOM)
    return np.ndarray(shape, dtype=dtype, buffer=m, offset=offset), m


def _open_shard(store: Store, key: str, shard: dict[str, Any]) -> tuple[np.ndarray, mmap.mmap | None]:
    obj = join_key(entry_prefix(key), shard["file"])
    where = f"{obj} in {store.uri}"
    path = store.local_path(obj)
    if path is None:  # object store: fetched once into a local cache, verified by hash
        path = _local_copy(store, key, obj, shard, where)
    else:
        _verify(path, shard, where)
    try:
        return _map_npy(path)
    except (ValueError, OSError) as exc:  # a header the hash check let through cannot happen; a race can
        raise DamagedCache(f"shard {where} cannot be read ({exc})") from None


def load_split(store: Store, manifest: dict[str, Any], split: str) -> Split:
    arrays = {}
    for name, spec in manifest["splits"][split].items():
        opened = [_open_shard(store, manifest["key"], s) for s in spec["shards"]]
        if not opened:  # a split with no rows has no shards
            opened = [(np.empty([0, *spec["shape"][1:]], dtype=spec["dtype"]), None)]
        arrays[name] = ShardedArray([a for a, _ in opened], [m for _, m in opened])
    return Split(arrays)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of training examples in ``epoch``: a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)
