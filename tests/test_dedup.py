"""data.dedup: exact and near duplicates out of the preprocessing cache, recorded in the manifest, in the cache key."""

from __future__ import annotations

import numpy as np
import pytest

from recipes_custom import PLANTED
from thrifty.config import ConfigError, build_config
from thrifty.config.reuse import DataConfig
from thrifty.storage import open_store
from training.data import cache_key, ensure_shards, load_split
from training.dedup import Deduper, ngram_hashes
from training.recipes import Dataset, resolve_recipe
from training.smoke import smoke_test

SMALL = {"hidden": 32, "limit": 600}


def shards(store_dir, recipe: str, dedup: str, **data):
    r = resolve_recipe(recipe)
    return ensure_shards(open_store(str(store_dir)), r, r.parse_params(SMALL), dedup=DataConfig(dedup=dedup, **data))


def test_exact_removes_leakage_from_train_and_repeats_inside_it(store_dir) -> None:
    off = shards(store_dir, "recipes_custom:duplicated", "off")
    exact = shards(store_dir, "recipes_custom:duplicated", "exact")
    assert off.key != exact.key and "dedup" not in off.manifest
    n = lambda c, split: c.manifest["splits"][split]["y"]["shape"][0]  # noqa: E731
    assert n(exact, "val") == n(off, "val")  # the validation set stays whole
    assert n(off, "train") - n(exact, "train") == PLANTED["within_train"] + PLANTED["leaked_val"]
    record = exact.manifest["dedup"]
    assert record["removed"] == {"train": {"exact duplicate": PLANTED["within_train"],
                                           "exact duplicate of a val example": PLANTED["leaked_val"]}}
    assert record["summary"] == "12 duplicates removed (train 12); 5 validation examples were also in train"
    leak = [e for e in record["listed"] if e["kept"]["split"] == "val"]
    assert len(leak) == 5 and all(e["split"] == "train" for e in leak)
    # no training example is byte-identical to a validation example any more
    store = open_store(str(store_dir))
    train, val = load_split(store, exact.manifest, "train"), load_split(store, exact.manifest, "val")
    rows = lambda s: {s.arrays["x"].take(np.arange(s.n))[i].tobytes() + bytes([int(y)])  # noqa: E731
                      for i, y in enumerate(s.arrays["y"].take(np.arange(s.n)))}
    assert not rows(train) & rows(val) and len(rows(train)) == train.n
    # a second run with the setting is a cache hit; the built-in digits has nothing to remove
    assert shards(store_dir, "recipes_custom:duplicated", "exact").hit
    assert shards(store_dir, "digits", "exact").manifest["dedup"]["removed_total"] == 0


def test_off_keeps_every_cache_key_as_it_was() -> None:
    r = resolve_recipe("digits")
    p = r.parse_params({})
    assert cache_key(r, p, DataConfig()) == cache_key(r, p) != cache_key(r, p, DataConfig(dedup="exact"))
    assert cache_key(r, p, DataConfig(dedup="near")) != cache_key(r, p, DataConfig(dedup="near", near_threshold=0.9))
    base = build_config({})
    assert base.training_fingerprint() != build_config({"data": {"dedup": "exact"}}).training_fingerprint()


def test_near_removes_near_duplicate_texts(store_dir) -> None:
    exact = shards(store_dir, "recipes_custom:texts", "exact")
    near = shards(store_dir, "recipes_custom:texts", "near")
    assert exact.manifest["dedup"]["removed_total"] == 0  # no planted copy is byte-identical
    record = near.manifest["dedup"]
    assert record["removed"] == {"train": {"near duplicate": 6, "near duplicate of a val example": 3}}
    assert record["text_array"] == "tokens" and record["near_threshold"] == 0.8
    assert record["summary"] == ("9 duplicates removed (train 9; 0 exact, 9 near); 3 validation examples were also "
                                 "in train")
    assert near.manifest["splits"]["train"]["tokens"]["shape"][0] == 240
    # a stricter threshold than the planted copies' similarity keeps them
    strict = shards(store_dir, "recipes_custom:texts", "near", near_threshold=0.99)
    assert strict.manifest["dedup"]["removed_total"] == 0


def test_near_needs_text_and_says_so(store_dir) -> None:
    with pytest.raises(ConfigError, match=r"near compares text as token ids.*x \(float32 rows of \[64\]\).*dedup: exact"):
        shards(store_dir, "digits", "near")
    assert not list((store_dir / "cache").glob("*/manifest.json"))


def test_chunks_are_filtered_as_they_stream() -> None:
    """A chunked preprocess: a twin in an earlier chunk wins (here a train row, so the later val copy goes)."""
    recipe = resolve_recipe("recipes_custom:texts")
    a = np.arange(40, dtype=np.int64).reshape(4, 10)
    chunks = [Dataset(splits={"train": {"tokens": a}}), Dataset(splits={"val": {"tokens": a[:2]},
                                                                        "train": {"tokens": a[2:]}})]
    d = Deduper(DataConfig(dedup="exact"), recipe)
    out = list(d.filter(iter(chunks)))
    assert [c.splits["train"]["tokens"].shape[0] for c in out] == [4, 0]
    assert out[1].splits["val"]["tokens"].shape[0] == 0
    assert d.removed == {"train": {"exact duplicate": 2}, "val": {"exact duplicate of a train example": 2}}
    assert d.sentence().endswith("; 2 validation examples were also in train")


def test_ngram_hashes_are_a_set_of_32_bit_values() -> None:
    h = ngram_hashes(np.array([1, 2, 3, 1, 2, 3, 1, 2, 3]), 3)
    assert len(h) == 3 and h.max() < 2**32
    assert len(ngram_hashes(np.array([5, 6]), 5)) == 1


def test_smoke_and_training_read_the_deduplicated_entry(tmp_path) -> None:
    cfg = build_config({"run_name": "dd", "recipe": "recipes_custom:duplicated", "recipe_params": SMALL,
                        "store": str(tmp_path / "store"), "data": {"dedup": "exact"},
                        "train": {"max_epochs": 1, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5}})
    result = smoke_test(cfg)
    assert result.cache_key == shards(tmp_path / "store", "recipes_custom:duplicated", "exact").key


def test_script_mode_refuses_what_only_a_recipe_has() -> None:
    from training.validate import check_config

    for extra in ({"data": {"dedup": "exact"}}, {"train": {"init_from": "run:x"}}, {"train": {"export_half": "fp16"}}):
        cfg = build_config({"recipe": "script", "recipe_params": {"command": "python train.py"}, **extra})
        with pytest.raises(ConfigError, match="script mode's command loads, saves and reads its own"):
            check_config(cfg)


def test_near_on_codelm_reads_its_token_windows(store_dir) -> None:
    r = resolve_recipe("codelm")
    params = r.parse_params({"max_bytes": 60_000, "val_every": 3, "vocab_size": 300, "seq_len": 32})
    entry = ensure_shards(open_store(str(store_dir)), r, params, dedup=DataConfig(dedup="near"))
    record = entry.manifest["dedup"]
    assert record["text_array"] == "tokens" and record["mode"] == "near"
    kept = {s: entry.manifest["splits"][s]["tokens"]["shape"][0] for s in ("train", "val")}
    assert {s: kept[s] + sum(record["removed"].get(s, {}).values()) for s in kept} == record["examples_before"]
