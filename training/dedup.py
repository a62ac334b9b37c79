"""Duplicate examples out of the preprocessing cache (``data.dedup``), as the recipe's chunks stream to the shards.

An example is one row of every array of its split. ``exact`` keeps the first of byte-identical examples: splits
are read evaluation splits first (the recipe's ``eval_splits``), then train, then any others, so a training
example that is also a validation example (leakage) is removed from train and the validation set stays whole;
duplicates inside a split keep their first row. ``near`` then treats text (token ids, one sequence per row) as
the set of its n-grams and removes an example whose MinHash-estimated Jaccard similarity to one kept before it
is at least the threshold (``datasketch``'s MinHashLSH finds the candidates, each checked against its estimate).
What was removed, per split and reason, goes into the manifest with a sentence the report shows.

A preprocess that yields chunks is filtered as it streams, in chunk order: a twin seen in an earlier chunk wins,
so a validation example whose twin came in an earlier training chunk is removed from validation instead.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any, Iterator

import numpy as np

from thrifty.config import ConfigError
from thrifty.config.reuse import NEAR_NUM_PERM, DataConfig
from training.recipes.base import Dataset, Preprocessed, Recipe

LISTED = 200  # removed examples listed one by one in the manifest (the counts cover every one)
_SPLIT_WORDS = {"val": "validation", "test": "test"}


class Deduper:
    """One cache entry's deduplication state: what was kept so far, and what was removed."""

    def __init__(self, settings: DataConfig, recipe: Recipe):
        self.settings, self.recipe = settings, recipe
        self.near = settings.dedup == "near"
        self.seen: dict[bytes, tuple[str, int]] = {}  # exact: digest -> the kept example (split, row)
        self.before: Counter[str] = Counter()  # rows each split had before (the next chunk's first row index)
        self.removed: dict[str, Counter[str]] = defaultdict(Counter)  # split -> reason -> count
        self.listed: list[dict[str, Any]] = []
        self._lsh = self._sigs = self._perms = None
        self.text_array: str | None = None

    @classmethod
    def maybe(cls, settings: DataConfig | None, recipe: Recipe) -> "Deduper | None":
        return cls(settings, recipe) if settings is not None and settings.dedup != "off" else None

    # ---------------------------------------------------------------- filtering
    def filter(self, data: Preprocessed) -> Preprocessed:
        """``data`` without its duplicates: a Dataset at once, chunks as they come."""
        if isinstance(data, Dataset):
            return self.chunk(data)
        return self._stream(data)

    def _stream(self, chunks: Any) -> Iterator[Any]:
        for chunk in chunks:
            yield self.chunk(chunk) if isinstance(chunk, Dataset) else chunk  # the writer names a non-Dataset
            del chunk

    def _order(self, splits: list[str]) -> list[str]:
        evals = [s for s in self.recipe.eval_splits if s in splits]
        return evals + [s for s in ("train",) if s in splits] + sorted(s for s in splits if s not in evals + ["train"])

    def chunk(self, data: Dataset) -> Dataset:
        out: dict[str, dict[str, np.ndarray]] = {}
        for split in self._order(list(data.splits)):
            arrays = {name: np.asarray(a) for name, a in (data.splits[split] or {}).items()}
            n = len(next(iter(arrays.values()))) if arrays else 0
            first = self.before[split]
            self.before[split] += n
            keep = np.ones(n, dtype=bool)
            digests = _row_digests(arrays, n)
            texts = self._texts(split, arrays) if self.near else None
            for i in range(n):
                twin = self.seen.get(digests[i])
                if twin is not None:
                    keep[i] = False
                    self._removed(split, first + i, twin, "exact")
                    continue
                if texts is not None:
                    near = self._near(split, first + i, texts[i])
                    if near is not None:
                        keep[i] = False
                        self._removed(split, first + i, near, "near")
                        continue
                self.seen[digests[i]] = (split, first + i)
            out[split] = arrays if keep.all() else {name: a[keep] for name, a in arrays.items()}
        return Dataset(splits={s: out[s] for s in data.splits}, meta=data.meta)

    def _removed(self, split: str, row: int, twin: tuple[str, int], how: str) -> None:
        reason = f"{how} duplicate" + ("" if twin[0] == split else f" of a {twin[0]} example")
        self.removed[split][reason] += 1
        if len(self.listed) < LISTED:
            self.listed.append({"split": split, "row": row, "reason": reason, "kept": {"split": twin[0], "row": twin[1]}})

    # ---------------------------------------------------------------- near duplicates
    def _texts(self, split: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
        name = self.settings.text_array
        if name is None:
            seqs = sorted(k for k, a in arrays.items() if a.ndim == 2 and np.issubdtype(a.dtype, np.integer))
            if len(seqs) != 1:
                shapes = ", ".join(f"{k} ({a.dtype} rows of {list(a.shape[1:])})" for k, a in sorted(arrays.items()))
                why = "none holds" if not seqs else f"{len(seqs)} hold"
                raise ConfigError(f"'data.dedup': near compares text as token ids, one sequence per row; in recipe "
                                  f"{self.recipe.name!r}'s split {split!r} {why} one ({shapes}). Set "
                                  "data.text_array to the array of token ids, or use dedup: exact")
            name = seqs[0]
        if name not in arrays or arrays[name].ndim != 2 or not np.issubdtype(arrays[name].dtype, np.integer):
            raise ConfigError(f"'data.text_array': split {split!r} of recipe {self.recipe.name!r} has no integer "
                              f"array {name!r} of one sequence per row (it has {', '.join(sorted(arrays))})")
        self.text_array = name
        return arrays[name]

    def _near(self, split: str, row: int, tokens: np.ndarray) -> tuple[str, int] | None:
        from datasketch import MinHash, MinHashLSH

        if self._lsh is None:
            # candidates from a looser band setting (recall: an estimate near the threshold still gets checked)
            self._lsh = MinHashLSH(threshold=min(0.9, max(0.1, self.settings.near_threshold - 0.1)),
                                   num_perm=NEAR_NUM_PERM)
            self._sigs = {}
            self._perms = MinHash(num_perm=NEAR_NUM_PERM, seed=1, scheme="affine32").permutations
        m = MinHash(num_perm=NEAR_NUM_PERM, seed=1, hashfunc=int, permutations=self._perms, scheme="affine32")
        m.update_batch(ngram_hashes(tokens, self.settings.near_ngram).tolist())
        for key in sorted(self._lsh.query(m), key=lambda k: (k[0], k[1])):  # candidates, each checked
            if m.jaccard(self._sigs[key]) >= self.settings.near_threshold:
                return key
        key = (split, row)
        self._lsh.insert(key, m)
        self._sigs[key] = m
        return None

    # ---------------------------------------------------------------- the record
    def manifest_entry(self) -> dict[str, Any]:
        """What the manifest records: the setting, counts per split and reason, the first removals, a sentence."""
        total = sum(sum(c.values()) for c in self.removed.values())
        entry: dict[str, Any] = {
            "mode": self.settings.dedup, "examples_before": dict(self.before),
            "removed": {s: dict(c) for s, c in sorted(self.removed.items())}, "removed_total": total,
            "listed": self.listed, "listed_all": total <= LISTED, "summary": self.sentence(),
        }
        if self.near:
            entry.update(near_threshold=self.settings.near_threshold, near_ngram=self.settings.near_ngram,
                         text_array=self.text_array, num_perm=NEAR_NUM_PERM)
        return entry

    def sentence(self) -> str:
        """'1,204 duplicates removed (train 1,190, val 14); 37 validation examples were also in train'."""
        total = sum(sum(c.values()) for c in self.removed.values())
        if not total:
            return f"dedup {self.settings.dedup}: no duplicates found"
        per = ", ".join(f"{s} {sum(c.values()):,}" for s, c in sorted(self.removed.items()))
        how = Counter()
        for c in self.removed.values():
            for reason, k in c.items():
                how[reason.split()[0]] += k
        kinds = f"; {how['exact']:,} exact, {how['near']:,} near" if self.near else ""
        text = f"{total:,} duplicate{'s' if total != 1 else ''} removed ({per}{kinds})"
        for ev in self.recipe.eval_splits:
            leaked = sum(k for r, k in self.removed.get("train", {}).items() if r.endswith(f"of a {ev} example"))
            leaked += sum(k for r, k in self.removed.get(ev, {}).items() if r.endswith("of a train example"))
            if leaked:
                text += (f"; {leaked:,} {_SPLIT_WORDS.get(ev, ev)} example{'s were' if leaked != 1 else ' was'} also "
                         "in train")
        return text


def _row_digests(arrays: dict[str, np.ndarray], n: int) -> list[bytes]:
    """One digest per example: every array's name, dtype, row shape and row bytes."""
    views = []
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        views.append((f"{name}|{a.dtype.str}|{a.shape[1:]}|".encode(), a.reshape(n, -1).view(np.uint8) if n else a))
    out = []
    for i in range(n):
        h = hashlib.blake2b(digest_size=16)
        for head, rows in views:
            h.update(head)
            h.update(rows[i].tobytes())
        out.append(h.digest())
    return out


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """The distinct 32-bit hashes of a sequence's n-grams (the whole sequence when shorter than n)."""
    t = np.asarray(tokens, dtype=np.uint64).reshape(-1)
    if len(t) == 0:
        return np.zeros(1, dtype=np.uint64)
    if len(t) < n:
        n = len(t)
    grams = np.lib.stride_tricks.sliding_window_view(t, n)
    h = np.full(len(grams), 1469598103934665603, dtype=np.uint64)  # FNV-1a over the tokens, wrapping in 64 bits
    with np.errstate(over="ignore"):
        for j in range(n):
            h = (h ^ grams[:, j]) * np.uint64(1099511628211)
    return np.unique((h ^ (h >> np.uint64(32))) & np.uint64(0xFFFFFFFF))
