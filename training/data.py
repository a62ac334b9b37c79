"""Preprocessing cache and the loader over its binary shards.

The layout (``cache/<key>/`` shards, ``manifest.json`` written last, ``LAST_USED``) is
``thrifty.runs.shards``'; the key hashes the raw data's content fingerprint, the recipe's
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
from thrifty.config.reuse import DataConfig
from thrifty.runs.shards import entry_prefix, mark_used, read_manifest
from thrifty.storage import NotFound, Store, join_key
from training.dedup import Deduper
from training.recipes.base import Recipe, RecipeParams
from training.shard_write import FORMAT_VERSION, SizeCheck, require_examples, write_shards

__all__ = ["CacheResult", "DamagedCache", "ShardedArray", "Split", "SizeCheck", "cache_key", "ensure_shards",
           "epoch_permutation", "load_split", "manifest_sizes", "open_cache", "require_examples", "write_shards"]

log = logging.getLogger("thrifty.data")

# An array whose shards total more than this is read with positioned reads (``os.preadv``) instead of a memory map:
# nothing is mapped into the process, so RSS does not grow with what is read (the page cache holds the file and
# is not the process's), and a random row costs one system call instead of a page fault that maps the 2 MiB
# folio around it. Arrays this size or smaller are mapped whole: indexing a mapped array is the fastest read.
RESIDENT_BYTES = 128 * 2**20


def cache_key(recipe: Recipe, params: RecipeParams, data: DataConfig | None = None) -> str:
    """Hash of raw-data fingerprint + preprocessing source + params (+ the ``data`` section's deduplication, when
    on): equal keys mean equal shards."""
    parts = {
        "format": FORMAT_VERSION,
        "recipe": recipe.name,
        "raw": recipe.fingerprint_raw(params),
        "code": hashlib.sha256(recipe.preprocessing_source().encode()).hexdigest(),
        "params": params.model_dump(mode="json"),
    }
    if data is not None and data.cache_part() is not None:  # off adds nothing: older entries keep their keys
        parts["data"] = data.cache_part()
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class CacheResult:
    key: str
    hit: bool
    manifest: dict[str, Any]
    seconds: float


class FileRows:
    """The rows of one ``.npy`` shard on local disk, read with ``os.preadv`` into the caller's buffer.

    A batch of consecutive rows (an evaluation pass in order) is one read; scattered rows (a shuffled
    training batch) are one read each, in file order. Holds one open descriptor, as a map would.
    """

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype, offset: int):
        self.shape, self.dtype, self.offset = shape, dtype, offset
        self.row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)

    def read_into(self, local: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = row local[i]`` for every i (``out``: C-contiguous, ``len(local)`` rows of this dtype)."""
        if not len(local):
            return
        rb, buf = self.row_bytes, memoryview(out).cast("B")
        first = int(local[0])
        if int(local[-1]) - first == len(local) - 1 and (len(local) == 1 or bool(np.all(np.diff(local) == 1))):
            self._read(buf, self.offset + first * rb)
            return
        order = np.argsort(local, kind="stable")  # file order: the disk and the page cache read ahead
        for j, i in zip(order.tolist(), local[order].tolist()):
            self._read(buf[j * rb : (j + 1) * rb], self.offset + i * rb)

    def _read(self, buf: memoryview, at: int) -> None:
        got = os.preadv(self.fd, [buf], at)
        if got != len(buf):  # the verified shard changed under the reader
            raise DamagedCache(f"a shard read returned {got} of {len(buf)} bytes at offset {at} (truncated?)")


class ShardedArray:
    """Rows of one array spread over shards, read by global row index without concatenating.

    ``take`` gathers a batch shard by shard (one gather per shard it touches). Parts are arrays (in
    memory, or mapped shards of an array under ``RESIDENT_BYTES``) or ``FileRows`` (larger arrays:
    positioned reads, nothing mapped), so a pass over a data set larger than memory stays small.
    """

    def __init__(self, parts: list[np.ndarray | FileRows]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.shape = (int(self.offsets[-1]),) + tuple(parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(self.parts) == 1 and not isinstance(self.parts[0], FileRows):
            return np.asarray(self.parts[0][idx])
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        out = np.empty((len(idx),) + self.shape[1:], dtype=self.dtype)
        order = np.argsort(which, kind="stable")  # group the batch by shard: one gather per shard touched
        bounds = np.flatnonzero(np.diff(which[order])) + 1
        for sel in np.split(order, bounds):
            if not len(sel):
                continue
            s = int(which[sel[0]])
            local = idx[sel] - self.offsets[s]
            part = self.parts[s]
            if isinstance(part, FileRows):
                if len(sel) == len(idx):  # one shard: read straight into the batch
                    part.read_into(local, out)
                else:
                    rows = np.empty((len(sel),) + self.shape[1:], dtype=self.dtype)
                    part.read_into(local, rows)
                    out[sel] = rows
            else:
                out[sel] = part[local]
        return out


class Split:
    """One split (train/val) of a cached dataset: named ShardedArrays of equal length."""

    def __init__(self, arrays: dict[str, ShardedArray]):
        self.arrays = arrays
        self.n = len(next(iter(arrays.values())))
        # an array in one part in memory is gathered straight from it: a step's fetch does no shard bookkeeping
        self._readers = [(name, arr.parts[0] if len(arr.parts) == 1 and isinstance(arr.parts[0], np.ndarray)
                          else arr.take, arr.dtype == np.uint16) for name, arr in arrays.items()]

    def batch(self, idx: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
        out = {}
        for name, read, widen in self._readers:
            t = torch.from_numpy(np.asarray(read[idx]) if isinstance(read, np.ndarray) else read(idx))
            if widen:
                t = t.to(torch.int64)
            out[name] = t if device.type == "cpu" else t.to(device, non_blocking=device.type == "cuda")
        return out


class DamagedCache(RuntimeError):
    """A cache entry whose files do not match its manifest; it is preprocessed again."""


def ensure_shards(store: Store, recipe: Recipe, params: RecipeParams, check: SizeCheck | None = None,
                  rebuild: bool = False, dedup: DataConfig | None = None) -> CacheResult:
    """Return the cached shards for (data, code, params, ``dedup``), preprocessing only on a miss (or when
    ``rebuild``). ``check`` sees the splits' sizes before anything is written: a run that cannot train writes
    nothing."""
    t0 = time.perf_counter()
    key = cache_key(recipe, params, dedup)
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
    deduper = Deduper.maybe(dedup, recipe)  # data.dedup: duplicates out before the shards are written
    data = deduper.filter(data) if deduper else data
    manifest = write_shards(store, key, data, recipe, params, check=check, started=t0,
                            annotate=deduper and (lambda: {"dedup": deduper.manifest_entry()}))
    if deduper:
        log.info("preprocess cache %s: %s", key, deduper.sentence())
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


def open_cache(store: Store, recipe: Recipe, params: RecipeParams, check: SizeCheck | None = None,
               dedup: DataConfig | None = None) -> tuple[CacheResult, dict[str, Split]]:
    """The entry and the splits the recipe reads (train and its eval splits), every shard checked against the
    manifest; a damaged entry is preprocessed again."""
    cache = ensure_shards(store, recipe, params, check, dedup=dedup)
    try:
        return cache, {name: load_split(store, cache.manifest, name) for name in recipe.splits}
    except DamagedCache as exc:
        log.warning("%s; preprocessing the entry again", exc)
    cache = ensure_shards(store, recipe, params, check, rebuild=True, dedup=dedup)
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


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, offset of the data)`` of a C-ordered numeric ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = _HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, dtype = read_header(f)
        if dtype.hasobject or fortran:
            raise ValueError("not a C-ordered array of numbers")
        return tuple(shape), dtype, f.tell()


def _map_npy(path: Path, header: tuple[tuple[int, ...], np.dtype, int]) -> np.ndarray:
    """A read-only array over the file's pages."""
    shape, dtype, offset = header
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize == 0:
        return np.empty(shape, dtype=dtype)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.ndarray(shape, dtype=dtype, buffer=m, offset=offset)


def _shard_path(store: Store, key: str, shard: dict[str, Any]) -> Path:
    """The shard's verified local file (an object store's is fetched into this machine's cache first)."""
    obj = join_key(entry_prefix(key), shard["file"])
    where = f"{obj} in {store.uri}"
    path = store.local_path(obj)
    if path is None:
        return _local_copy(store, key, obj, shard, where)
    _verify(path, shard, where)
    return path


def load_split(store: Store, manifest: dict[str, Any], split: str) -> Split:
    arrays = {}
    for name, spec in manifest["splits"][split].items():
        if not spec["shards"]:  # a split with no rows has no shards
            arrays[name] = ShardedArray([np.empty([0, *spec["shape"][1:]], dtype=spec["dtype"])])
            continue
        mapped = sum(s["bytes"] for s in spec["shards"]) <= RESIDENT_BYTES
        parts: list[np.ndarray | FileRows] = []
        for shard in spec["shards"]:
            path = _shard_path(store, manifest["key"], shard)
            try:
                header = _npy_header(path)
                parts.append(_map_npy(path, header) if mapped else FileRows(path, *header))
            except (ValueError, OSError) as exc:  # a header the hash check let through cannot happen; a race can
                raise DamagedCache(f"shard {join_key(entry_prefix(manifest['key']), shard['file'])} in "
                                   f"{store.uri} cannot be read ({exc})") from None
        arrays[name] = ShardedArray(parts)
    return Split(arrays)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of training examples in ``epoch``: a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)
