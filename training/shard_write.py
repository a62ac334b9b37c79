"""Writing a preprocessing-cache entry as a stream: Dataset chunks in, ``.npy`` shards out, the manifest last.

Per array, rows are buffered only up to one shard; a full shard is written at once (hashed as it
is written, never read back), so memory holds about one chunk plus one shard per array whatever
the data set's size. The sizes are known only at the end, so the checks on them run then and the
manifest (the commit record, ``thrifty.runs.shards``) is written only when they pass; a failed check,
an error in the recipe's generator or a bad chunk removes every shard this writer wrote. A
killed writer leaves shards without a manifest: an unfinished entry, never read, cleared by the
next miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import numpy as np

from thrifty.config import ConfigError
from thrifty.runs.shards import MANIFEST, entry_prefix
from thrifty.storage import Store, join_key
from training.recipes.base import Dataset, EmptyDataError, Preprocessed, Recipe, RecipeParams

log = logging.getLogger("thrifty.data")

FORMAT_VERSION = 1
SHARD_BYTES = 64 * 2**20  # rows per shard are chosen to keep each file near this size (tests lower it)

SizeCheck = Callable[[dict[str, int]], None]  # raises ConfigError when the data cannot train as configured


class _HashingFile:
    """A write-only file that hashes and counts what passes through it (np.lib.format writes the .npy into it)."""

    def __init__(self, f: BinaryIO):
        self._f, self.sha256, self.bytes = f, hashlib.sha256(), 0

    def write(self, data: bytes | memoryview) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self._f.write(data)


class _ArrayStream:
    """One array of one split: rows buffered up to a shard, each full shard written as soon as it is."""

    def __init__(self, store: Store, prefix: str, split: str, name: str, first: np.ndarray, written: list[str]):
        self.store, self.prefix, self.split, self.name, self.written = store, prefix, split, name, written
        self.dtype, self.trailing = first.dtype, tuple(first.shape[1:])
        row_bytes = max(1, first.dtype.itemsize * int(np.prod(self.trailing, dtype=np.int64)))
        self.rows_per_shard = max(1, SHARD_BYTES // row_bytes)
        self.buf: np.ndarray | None = None  # allocated on first partial shard; pages are touched only as filled
        self.fill = 0
        self.rows = 0
        self.shards: list[dict[str, Any]] = []

    def add(self, arr: np.ndarray) -> None:
        pos, n, rps = 0, len(arr), self.rows_per_shard
        while pos < n:
            if self.fill == 0 and n - pos >= rps:  # a whole shard inside the chunk: written straight from it
                self._write(arr[pos : pos + rps])
                pos += rps
                continue
            if self.buf is None:
                self.buf = np.empty((rps,) + self.trailing, dtype=self.dtype)
            take = min(rps - self.fill, n - pos)
            self.buf[self.fill : self.fill + take] = arr[pos : pos + take]
            self.fill, pos = self.fill + take, pos + take
            if self.fill == rps:
                self._write(self.buf)
                self.fill = 0
        self.rows += n

    def finish(self) -> dict[str, Any]:
        if self.fill:
            self._write(self.buf[: self.fill])
            self.fill = 0
        self.buf = None
        return {"dtype": str(self.dtype), "shape": [self.rows, *self.trailing], "shards": self.shards}

    def _write(self, rows: np.ndarray) -> None:
        file = f"{self.split}.{self.name}.{len(self.shards):05d}.npy"
        key = join_key(self.prefix, file)
        self.written.append(key)
        rows = np.ascontiguousarray(rows)
        with self.store.writer(key) as f:
            out = _HashingFile(f)
            _write_npy(out, rows)
        self.shards.append({"file": file, "rows": int(len(rows)), "bytes": out.bytes,
                            "sha256": out.sha256.hexdigest()})


def _write_npy(out: _HashingFile, rows: np.ndarray) -> None:
    """``np.save``'s bytes, the data passed as one buffer (np.save would copy it in 16 MiB pieces)."""
    header = np.lib.format.header_data_from_array_1_0(rows)
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:  # a header over 64 KiB (a huge structured dtype): np.save writes version 2.0 then too
        np.lib.format.write_array_header_2_0(out, header)
    out.write(memoryview(rows.reshape(-1).view(np.uint8)))


def iter_chunks(recipe: Recipe, data: Preprocessed) -> Iterator[Dataset]:
    """What ``preprocess`` returned, as chunks: a Dataset is one chunk; an iterable gives them one by one."""
    if isinstance(data, Dataset):
        yield data
        return
    if isinstance(data, (str, bytes, dict)) or not isinstance(data, Iterable):
        raise ConfigError(f"recipe {recipe.name!r}: preprocess returned {type(data).__name__}; return a "
                          "training.recipes.Dataset, or an iterable (a generator) of Dataset chunks")
    for i, chunk in enumerate(data):
        if not isinstance(chunk, Dataset):
            raise ConfigError(f"recipe {recipe.name!r}: preprocess yielded {type(chunk).__name__} as chunk {i}; "
                              "every chunk must be a training.recipes.Dataset")
        yield chunk
        del chunk  # each layer lets go of a chunk before the next is made: one chunk in memory, not two


class _EntryWriter:
    """The streams of one entry, created as splits and arrays first appear; each chunk checked against the first."""

    def __init__(self, store: Store, key: str, recipe: Recipe):
        self.store, self.prefix, self.recipe = store, entry_prefix(key), recipe
        self.streams: dict[str, dict[str, _ArrayStream]] = {}
        self.meta: dict[str, Any] = {}
        self.written: list[str] = []  # every shard key started: what an abort removes

    def add(self, i: int, chunk: Dataset) -> None:
        what = f"recipe {self.recipe.name!r}, chunk {i}"
        for split, arrays in chunk.splits.items():
            arrays = {name: np.asarray(a) for name, a in (arrays or {}).items()}
            for name, a in arrays.items():
                if a.ndim == 0 or a.dtype.hasobject:
                    raise ConfigError(f"{what}, split {split!r}, array {name!r}: a {a.dtype} array of shape "
                                      f"{a.shape}; give arrays of numbers with examples along axis 0")
            if len({len(a) for a in arrays.values()}) > 1:
                lengths = {name: len(a) for name, a in arrays.items()}
                raise ConfigError(f"{what}, split {split!r}: its arrays differ in length {lengths}; every array of a "
                                  "split needs one row per example")
            streams = self.streams.get(split)
            if streams is None:
                self.streams[split] = {name: _ArrayStream(self.store, self.prefix, split, name, a, self.written)
                                       for name, a in arrays.items()}
            else:
                self._check_like(what, split, streams, arrays)
            for name, a in arrays.items():
                self.streams[split][name].add(a)
        self.meta.update(chunk.meta)

    @staticmethod
    def _check_like(what: str, split: str, streams: dict[str, _ArrayStream], arrays: dict[str, np.ndarray]) -> None:
        if set(arrays) != set(streams):
            raise ConfigError(f"{what}, split {split!r}: arrays {sorted(arrays)}, where the first chunk with this "
                              f"split had {sorted(streams)}; every chunk must give a split the same arrays")
        for name, a in arrays.items():
            s = streams[name]
            if a.dtype != s.dtype or tuple(a.shape[1:]) != s.trailing:
                raise ConfigError(
                    f"{what}, split {split!r}, array {name!r}: dtype {a.dtype} and rows of shape {tuple(a.shape[1:])}, "
                    f"expected dtype {s.dtype} and rows of shape {s.trailing} as in the first chunk with this split; "
                    "cast or reshape it in preprocess so every chunk matches")

    def finish(self) -> dict[str, Any]:
        return {split: {name: s.finish() for name, s in arrays.items()} for split, arrays in self.streams.items()}

    def abort(self) -> None:
        """Remove every shard this writer wrote (a failed write's temp file its own ``writer`` already removed)."""
        for key in self.written:
            try:
                self.store.delete(key)
            except Exception as exc:  # a cleanup that fails is logged; the entry has no manifest, so it is never read
                log.warning("could not remove %s of an unfinished cache entry from %s: %s", key, self.store.uri, exc)


def require_examples(recipe: Recipe, params: RecipeParams, sizes: dict[str, int]) -> None:
    """Every split the recipe trains and evaluates on was produced, with examples (before the manifest commits)."""
    try:
        recipe.require_splits(sizes)
    except EmptyDataError as exc:
        raise EmptyDataError(f"{exc} (recipe_params {params.model_dump(mode='json')})") from None


def _guarded(recipe: Recipe, chunks: Iterator[Dataset]) -> Iterator[Dataset]:
    """The chunks, an error raised while making one told as such (the writer's own errors pass through unchanged)."""
    i = 0
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except OSError as exc:  # the raw data is gone or unreadable: a setting or a file to fix, not a crash
            raise ConfigError(f"recipe {recipe.name!r} could not read its raw data (making chunk {i}): {exc}; "
                              "nothing was cached") from None
        except ConfigError:
            raise
        except Exception as exc:
            exc.add_note(f"(raised by recipe {recipe.name!r}'s preprocess while making chunk {i}; the unfinished "
                         "cache entry was removed)")
            raise
        yield chunk
        del chunk
        i += 1


def write_shards(store: Store, key: str, data: Preprocessed, recipe: Recipe, params: RecipeParams,
                 preprocess_seconds: float = 0.0, *, check: SizeCheck | None = None,
                 started: float | None = None, annotate: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Stream a Dataset or Dataset chunks into shards, check the sizes, then write the manifest (the commit).

    Returns the manifest. On a failed check, a bad chunk or an error from the recipe's generator, every
    shard written is removed again and the error raised: nothing committed remains. ``started`` (a
    ``time.perf_counter()``) makes the manifest's preprocess time the whole miss, chunks and writes together;
    ``annotate`` adds entries to the manifest once every chunk is written (what deduplication removed).
    """
    entry = _EntryWriter(store, key, recipe)
    try:
        if isinstance(data, Dataset):  # whole: the sizes are known before anything is written
            sizes = {split: data.num_examples(split) for split in data.splits}
            require_examples(recipe, params, sizes)
            if check is not None:
                check(sizes)
        for i, chunk in enumerate(_guarded(recipe, iter_chunks(recipe, data))):
            entry.add(i, chunk)
            del chunk  # not held while the generator makes the next one
        splits = entry.finish()
        sizes = {split: arrays[next(iter(arrays))]["shape"][0] for split, arrays in splits.items() if arrays}
        require_examples(recipe, params, sizes)
        if check is not None:
            check(sizes)
        seconds = time.perf_counter() - started if started is not None else preprocess_seconds
        manifest = {
            "format": FORMAT_VERSION,
            "key": key,
            "recipe": recipe.name,
            "params": params.model_dump(mode="json"),
            "created_unix": time.time(),
            "preprocess_seconds": round(seconds, 3),  # what a cache hit saves
            "splits": splits,
            "meta": entry.meta,
            **(annotate() if annotate else {}),
        }
        store.put_bytes(join_key(entry.prefix, MANIFEST), json.dumps(manifest, indent=1).encode())
    except BaseException:
        entry.abort()
        raise
    return manifest
