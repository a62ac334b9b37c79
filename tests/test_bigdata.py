"""Data larger than memory: a preprocess that yields chunks streams its shards, a failed or killed write commits
nothing, and a data set several times an RSS budget is preprocessed and trained under it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import training.data as data
import training.shard_write as shard_write
from conftest import PYTHON, python_env
from stores import apply_env
from thrifty.config import ConfigError, build_config
from thrifty.runs.shards import read_manifest
from thrifty.storage import open_store
from training.data import FileRows, ShardedArray, cache_key, ensure_shards, load_split, open_cache
from training.loop import train
from training.recipes import Dataset
from training.recipes import synthetic

SYNTHETIC = "training.recipes.synthetic:recipe"


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shard_write, "SHARD_BYTES", 16 * 2**10)  # many shards from a small set


def shard_hashes(manifest: dict) -> dict:
    return {split: {name: [s["sha256"] for s in spec["shards"]] for name, spec in arrays.items()}
            for split, arrays in manifest["splits"].items()}


def entry_files(store_dir: Path, key: str) -> list[str]:
    entry = store_dir / "cache" / key
    return sorted(p.name for p in entry.iterdir()) if entry.is_dir() else []


def with_preprocess(preprocess) -> object:
    return dataclasses.replace(synthetic.recipe(), name="chunks", preprocess=preprocess)


# ---------------------------------------------------------------- chunks in, the same shards and weights out


def test_chunks_give_the_same_shards_and_weights_as_the_whole_set(tmp_path, small_shards):
    params = {"rows": 3000, "val_rows": 500, "features": 16}
    results = {}
    for name, chunk_rows in (("whole", 0), ("chunked", 700)):  # 700: chunks that cut shards and the split boundary
        results[name] = train(build_config({
            "run_name": name, "store": str(tmp_path / "store"), "recipe": SYNTHETIC,
            "recipe_params": {**params, "chunk_rows": chunk_rows},
            "train": {"max_epochs": 2, "micro_batch": 64, "precision": "fp32", "checkpoint_every": 1000,
                      "early_stopping": {"enabled": False}, "lr": 0.01}}))
    whole, chunked = (json.loads(p.read_text()) for p in sorted(
        (tmp_path / "store" / "cache").glob("*/manifest.json"), key=lambda p: json.loads(p.read_text())["params"]
        ["chunk_rows"]))
    assert shard_hashes(whole) == shard_hashes(chunked)
    assert len(whole["splits"]["train"]["x"]["shards"]) == 12  # 3000 rows of 64 bytes in 16 KiB shards
    assert whole["meta"] == chunked["meta"] == {"features": 16, "classes": 10}
    assert results["whole"].summary.weights_sha256 == results["chunked"].summary.weights_sha256
    assert results["chunked"].summary.final_metrics["val_accuracy"] > 0.6  # it learned (chance is 0.1)


def test_chunks_may_hold_any_splits_and_their_meta_is_merged(tmp_path, small_shards):
    rows = np.arange(40, dtype=np.float32).reshape(20, 2)

    def preprocess(params):
        yield Dataset({"train": {"x": rows[:8], "y": np.arange(8)}}, meta={"features": 2, "note": "first"})
        yield Dataset({"test": {"x": rows[:3], "y": np.arange(3)}, "val": {"x": rows[8:12], "y": np.arange(8, 12)}},
                      meta={"classes": 3})
        yield Dataset({"train": {"x": rows[12:], "y": np.arange(12, 20)}, "test": {"x": rows[3:5], "y": np.arange(2)}},
                      meta={"note": "last"})

    recipe = with_preprocess(preprocess)
    store = open_store(str(tmp_path / "store"))
    cache = ensure_shards(store, recipe, recipe.parse_params({}))
    assert list(cache.manifest["splits"]) == ["train", "test", "val"]
    assert cache.manifest["meta"] == {"features": 2, "note": "last", "classes": 3}
    train_split = load_split(store, cache.manifest, "train")
    assert train_split.n == 16
    np.testing.assert_array_equal(train_split.arrays["x"].take(np.arange(16)), np.concatenate([rows[:8], rows[12:]]))
    np.testing.assert_array_equal(load_split(store, cache.manifest, "test").arrays["x"].take(np.arange(5)), rows[:5])


# ---------------------------------------------------------------- a failed write commits nothing


def _chunk(n: int, dtype=np.float32, features: int = 4) -> Dataset:
    return Dataset({"train": {"x": np.ones((n, features), dtype=dtype), "y": np.zeros(n, dtype=np.int64)},
                    "val": {"x": np.ones((8, features), dtype=dtype), "y": np.zeros(8, dtype=np.int64)}})


def _raises_midway(params):
    yield _chunk(3000)
    yield _chunk(3000)
    raise RuntimeError("raw file truncated")


def _bad_dtype(params):
    yield _chunk(3000)
    yield _chunk(3000, dtype=np.float64)


def _bad_shape(params):
    yield _chunk(3000)
    yield _chunk(3000, features=5)


def _unreadable(params):
    yield _chunk(3000)
    raise FileNotFoundError(2, "No such file or directory", "raw/part-0001.csv")


def _not_a_dataset(params):
    yield _chunk(3000)
    yield {"train": {}}


def _too_small(sizes):
    raise ConfigError(f"micro_batch is larger than the {sizes['train']} training examples")


@pytest.mark.parametrize("preprocess, check, error, match", [
    (_raises_midway, None, RuntimeError, "raw file truncated"),
    (_bad_dtype, None, ConfigError,
     r"chunk 1, split 'train', array 'x': dtype float64 .*expected dtype float32 .* first chunk"),
    (_bad_shape, None, ConfigError, r"chunk 1, split 'train', array 'x': .*rows of shape \(5,\), expected .*\(4,\)"),
    (_unreadable, None, ConfigError, r"could not read its raw data \(making chunk 1\).*part-0001.csv"),
    (_not_a_dataset, None, ConfigError, "yielded dict as chunk 1; every chunk must be a training.recipes.Dataset"),
    (lambda params: (_chunk(3000) for _ in range(2)), _too_small, ConfigError, "larger than the 6000 training"),
], ids=["generator-raises", "dtype", "trailing-shape", "raw-data-gone", "not-a-dataset", "size-check"])
def test_a_failed_write_leaves_no_entry(tmp_path, small_shards, monkeypatch, preprocess, check, error, match):
    written = []
    real_write = shard_write._ArrayStream._write
    monkeypatch.setattr(shard_write._ArrayStream, "_write", lambda self, rows: (written.append(1), real_write(self, rows)))
    recipe = with_preprocess(preprocess)
    params = recipe.parse_params({})
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(error, match=match) as info:
        ensure_shards(store, recipe, params, check)
    assert len(written) >= 2  # shards were on disk before the failure ...
    assert read_manifest(store, cache_key(recipe, params)) is None  # ... and nothing of them remains
    assert store.list("cache/") == [] and not (tmp_path / "store" / "cache").exists()
    if error is RuntimeError:  # a recipe's own error keeps its type and says where it happened
        assert "making chunk 2" in "".join(getattr(info.value, "__notes__", []))


# ---------------------------------------------------------------- kill -9 while preprocessing


KILLED_WRITER = """
import json, sys, time
import training.shard_write as shard_write
from thrifty.storage import open_store
from training.data import ensure_shards
from training.recipes import synthetic

shard_write.SHARD_BYTES = 16 * 2**10
real = shard_write._write_npy
def stalled(out, rows, n=[0]):  # the third shard stalls half-written: a kill lands inside a write
    n[0] += 1
    if n[0] == 3:
        out.write(b"half")
        out._f.flush()
        time.sleep(60)
    real(out, rows)
shard_write._write_npy = stalled
recipe = synthetic.recipe()
ensure_shards(open_store(sys.argv[1]), recipe, recipe.parse_params(json.loads(sys.argv[2])))
"""


def test_kill_9_while_preprocessing_leaves_no_committed_entry_and_the_next_run_rebuilds(tmp_path, small_shards):
    store_dir = tmp_path / "store"
    params = {"rows": 3000, "val_rows": 500, "features": 16, "chunk_rows": 500}
    recipe = synthetic.recipe()
    key = cache_key(recipe, recipe.parse_params(params))
    proc = subprocess.Popen([PYTHON, "-c", KILLED_WRITER, str(store_dir), json.dumps(params)], env=python_env(),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    def stalled() -> bool:  # two shards complete, the third half-written
        names = entry_files(store_dir, key)
        return sum(n.endswith(".npy") for n in names) == 2 and any(n.endswith(".tmp") for n in names)

    while not stalled():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the writer never reached its third shard"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stderr.close()
    left = entry_files(store_dir, key)
    assert "manifest.json" not in left and sum(name.endswith(".npy") for name in left) == 2  # an unfinished entry
    store = open_store(str(store_dir))
    assert read_manifest(store, key) is None  # never read

    cache = ensure_shards(store, recipe, recipe.parse_params(params))  # the next run: a miss, rebuilt
    assert not cache.hit
    files = [s["file"] for arrays in cache.manifest["splits"].values() for spec in arrays.values()
             for s in spec["shards"]]
    assert entry_files(store_dir, key) == sorted(files + ["manifest.json"])  # the killed writer's leftovers are gone
    again, splits = open_cache(store, recipe, recipe.parse_params(params))
    assert again.hit and splits["train"].n == 3000


# ---------------------------------------------------------------- the reader


def test_take_over_many_shards_matches_one_array_mapped_or_read(tmp_path, small_shards, monkeypatch):
    recipe = synthetic.recipe()
    params = recipe.parse_params({"rows": 3000, "val_rows": 500, "features": 16, "chunk_rows": 999})
    store = open_store(str(tmp_path / "store"))
    cache = ensure_shards(store, recipe, params)
    expected = synthetic._rows(params, "train", 0, 3000)["x"]
    mapped = load_split(store, cache.manifest, "train").arrays["x"]
    monkeypatch.setattr(data, "RESIDENT_BYTES", 64 * 2**10)  # 188 KiB of x: over it, nothing is mapped
    reads = []
    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at: (reads.append(at), real_preadv(fd, bufs, at))[1])
    read = load_split(store, cache.manifest, "train").arrays["x"]
    assert len(read.parts) == 12 and all(isinstance(p, FileRows) for p in read.parts)
    assert not any(isinstance(p, FileRows) for p in mapped.parts)
    for seed in range(5):
        idx = np.random.default_rng(seed).permutation(3000)[:257]
        np.testing.assert_array_equal(read.take(idx), expected[idx])
        np.testing.assert_array_equal(mapped.take(idx), expected[idx])
    assert len(reads) == 5 * 257  # one positioned read per scattered row
    reads.clear()
    np.testing.assert_array_equal(read.take(np.arange(2990, 3000)), expected[2990:])
    np.testing.assert_array_equal(read.take(np.arange(0, 200)), expected[:200])
    assert len(reads) == 1 + 1  # a run of rows in one shard is one read (the first 200 rows: shard 0 holds 250)
    np.testing.assert_array_equal(ShardedArray([expected[:100], expected[100:]]).take(np.array([150, 3, 99])),
                                  expected[[150, 3, 99]])  # in-memory parts


def test_object_store_shards_are_fetched_to_disk_and_a_damaged_local_copy_is_fetched_again(
        tmp_path, small_shards, s3_standin, monkeypatch):
    apply_env(monkeypatch, s3_standin.env())
    monkeypatch.setenv("THRIFTY_LOCAL_CACHE", str(tmp_path / "local"))
    s3_standin.client().create_bucket(Bucket="bigdata-reader")
    store = open_store("s3://bigdata-reader/p")
    real_get_bytes = store.get_bytes
    monkeypatch.setattr(store, "get_bytes", lambda key: (_ for _ in ()).throw(AssertionError(f"{key} read whole"))
                        if key.endswith(".npy") else real_get_bytes(key))
    recipe = synthetic.recipe()
    params = recipe.parse_params({"rows": 1000, "val_rows": 200, "features": 16, "chunk_rows": 300})
    cache, splits = open_cache(store, recipe, params)
    expected = synthetic._rows(params, "train", 0, 1000)["x"]
    np.testing.assert_array_equal(splits["train"].arrays["x"].take(np.arange(1000)), expected)
    local = sorted((tmp_path / "local" / cache.key).glob("train.x.*.npy"))
    assert len(local) == 4
    raw = bytearray(local[1].read_bytes())
    raw[-1] ^= 0xFF  # flipped on this machine's disk, same size
    local[1].write_bytes(bytes(raw))
    data._VERIFIED.clear()
    again, splits = open_cache(store, recipe, params)
    assert again.hit  # the entry in the store is fine: only the local copy is fetched again
    np.testing.assert_array_equal(splits["train"].arrays["x"].take(np.arange(1000)), expected)


# ---------------------------------------------------------------- larger than memory, under an RSS cap


RSS_PROBE = """
import json, resource, sys
import torch
torch.set_num_threads(1)
from thrifty.config import build_config
import training.data as data
import training.shard_write as shard_write
from training.loop import train

store, params = sys.argv[1], json.loads(sys.argv[2])
shard_write.SHARD_BYTES = 2**20
data.RESIDENT_BYTES = 4 * 2**20
def config(run, store, params):
    return build_config({"run_name": run, "store": store, "recipe": "training.recipes.synthetic:recipe",
                         "recipe_params": params, "train": {"max_epochs": 1, "micro_batch": 256, "precision": "fp32",
                         "checkpoint_every": 100, "early_stopping": {"enabled": False}, "log_every": 50}})
# warm-up on a small set first: the code pages torch and the loop fault in count in RSS, and are not data
train(config("warm", store + "-warm", {**params, "rows": 2048, "val_rows": 512, "chunk_rows": 1024}))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = train(config("big", store, params))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_bytes": (peak - base) * 1024, "steps": result.summary.steps,
                  **result.summary.final_metrics}))
"""


def test_a_set_several_times_the_rss_budget_preprocesses_and_trains_under_it(tmp_path):
    params = {"rows": 65536, "val_rows": 4096, "features": 256, "chunk_rows": 4096}  # 68 MiB of float32 rows
    data_bytes = (params["rows"] + params["val_rows"]) * params["features"] * 4
    budget = 32 * 2**20  # 4 MiB chunks, 1 MiB shards; x (64 MiB) is over RESIDENT_BYTES: read with preadv, never mapped
    out = subprocess.run([PYTHON, "-c", RSS_PROBE, str(tmp_path / "store"), json.dumps(params)], env=python_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert data_bytes > 2 * budget
    assert probe["growth_bytes"] < budget, f"peak RSS grew {probe['growth_bytes'] / 2**20:.1f} MiB"
    assert probe["steps"] == 256  # one pass over every training row
    assert probe["val_accuracy"] > 0.4  # chance is 0.1
    written = sum(s["bytes"] for p in (tmp_path / "store" / "cache").glob("*/manifest.json")
                  for arrays in json.loads(p.read_text())["splits"].values() for spec in arrays.values()
                  for s in spec["shards"])
    assert written > data_bytes
