"""codelm: corpus selection, deterministic preprocessing, the model's shape rules, and that it learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from thrifty.config import ConfigError, RunConfig
from training.data import cache_key
from training.loop import train
from training.recipes import codelm
from training.recipes.base import EmptyDataError, resolve_recipe

# A handful of small stdlib files, a 300-token BPE, a one-block model: preprocessing in ~0.1 s.
TINY = {"max_bytes": 60_000, "val_every": 3, "vocab_size": 300, "seq_len": 32,
        "n_layer": 1, "n_head": 2, "n_embd": 32}


@pytest.fixture(scope="module")
def recipe():
    return resolve_recipe("codelm")


@pytest.fixture(scope="module")
def tiny(recipe):
    params = recipe.parse_params(TINY)
    return params, recipe.preprocess(params)


def test_selection_is_sorted_capped_and_skips_tests(recipe):
    params = recipe.parse_params({"max_bytes": 400_000})
    files = codelm.select_files(params)
    rels = [rel for rel, _ in files]
    assert rels == sorted(rels) and len(rels) >= 3
    assert sum(p.stat().st_size for _, p in files) <= 400_000
    assert all(rel.endswith(".py") for rel in rels)
    excluded = set(codelm.DEFAULT_EXCLUDE)
    assert not any(excluded & set(rel.split("/")[:-1]) for rel in rels)
    assert len(codelm.select_files(recipe.parse_params({"max_bytes": 400_000, "max_files": 2}))) == 2


def test_preprocess_is_deterministic(recipe, tiny):
    params, first = tiny
    second = recipe.preprocess(params)
    for split in ("train", "val"):
        a, b = first.splits[split]["tokens"], second.splits[split]["tokens"]
        assert a.dtype == np.uint16 and a.shape[1] == TINY["seq_len"] + 1 and len(a) > 0
        assert np.array_equal(a, b)
    assert first.meta == second.meta
    assert cache_key(recipe, params) == cache_key(recipe, recipe.parse_params(dict(TINY)))


def test_meta_is_self_describing(tiny):
    params, data = tiny
    meta = data.meta
    json.dumps(meta)  # goes into the manifest as JSON
    tok = codelm.load_tokenizer(meta)
    assert tok.get_vocab_size() == meta["vocab_size"] <= TINY["vocab_size"]
    assert int(data.splits["train"]["tokens"].max()) < meta["vocab_size"]
    # the tokens decode back to Python source from the training files
    text = tok.decode(data.splits["train"]["tokens"][:4].reshape(-1).tolist(), skip_special_tokens=False)
    assert "import" in text or "def " in text or '"""' in text
    assert meta["val_files"] >= 1 and meta["train_files"] >= 2 * meta["val_files"]
    assert 0.0 < meta["unigram_entropy_nats"] < math.log(meta["vocab_size"])


def test_too_few_files_for_a_validation_split_is_explained(recipe):
    with pytest.raises(EmptyDataError, match="val_every"):
        recipe.preprocess(recipe.parse_params({**TINY, "max_files": 2, "val_every": 20}))
    with pytest.raises(EmptyDataError, match="seq_len"):
        recipe.preprocess(recipe.parse_params({**TINY, "max_files": 3, "seq_len": 8000}))


def test_fingerprint_follows_the_selected_files(recipe):
    fp = lambda raw: recipe.fingerprint_raw(recipe.parse_params(raw))  # noqa: E731
    base = {"max_bytes": 60_000, "max_files": 4}
    assert fp(base) == fp(dict(base))
    assert fp(base) == fp({**base, "n_layer": 4, "vocab_size": 512})  # model options select the same files
    assert fp(base) != fp({**base, "max_files": 5})
    assert fp(base) != fp({**base, "max_bytes": 1_000})


def test_model_is_causal_with_tied_embeddings(tiny):
    params, data = tiny
    torch.manual_seed(0)
    model = codelm.build_model(params, data.meta).eval()
    assert model.head.weight is model.tok_emb.weight
    tokens = torch.from_numpy(data.splits["train"]["tokens"][:2].astype(np.int64))
    out = codelm.step(model, {"tokens": tokens})
    assert out.count == 2 * TINY["seq_len"]
    assert abs(float(out.loss.detach()) - math.log(data.meta["vocab_size"])) < 0.5  # near-uniform at init
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % data.meta["vocab_size"]
    with torch.no_grad():
        a, b = model(tokens[:, :-1]), model(changed[:, :-1])
    assert torch.equal(a[:, :10], b[:, :10])  # the future does not leak into earlier positions
    assert not torch.equal(a[:, 10:], b[:, 10:])


def test_tiny_model_learns_below_unigram_entropy(store_dir: Path):
    # ~2-4 s on one thread; over seeds 0-2 this ends 0.85-1.05 nats below the unigram entropy (5.39).
    learner = {**TINY, "max_bytes": 150_000, "vocab_size": 512, "n_head": 4, "n_embd": 64}
    cfg = RunConfig(
        run_name="codelm-tiny",
        recipe="codelm",
        recipe_params=learner,
        store=str(store_dir),
        train={"max_steps": 300, "micro_batch": 16, "lr": 5e-3, "warmup_steps": 5, "eval_every": 100,
               "log_every": 10, "early_stopping": {"enabled": False}},
    )
    result = train(cfg)
    summary = result.summary
    assert result.status == "completed" and summary.steps == 300
    entropy = summary.unigram_entropy_nats
    val_loss = summary.final_metrics["val_loss"]
    assert val_loss < entropy - 0.5, (val_loss, entropy)
    assert 0.0 < summary.final_metrics["val_token_accuracy"] < 1.0
    assert json.loads((store_dir / "runs" / "codelm-tiny" / "summary.json").read_text())["unigram_entropy_nats"] == entropy
    # codelm states its FLOPs: achieved TFLOPS in the summary; on a CPU there is no peak, so no MFU
    assert summary.utilisation["achieved_tflops"] > 0 and "mfu" not in summary.utilisation


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"n_layers": 2}, "n_layers"),  # a typo: not an option
        ({"vocab_size": 100}, "vocab_size"),  # below the byte alphabet
        ({"vocab_size": 70_000}, "vocab_size"),  # does not fit uint16
        ({"seq_len": "long"}, "seq_len"),
        ({"n_head": 3}, "n_embd"),  # 3 does not divide 128
    ],
)
def test_bad_recipe_params_name_the_field(bad, field, store_dir: Path):
    cfg = RunConfig(run_name="codelm-bad", recipe="codelm", recipe_params=bad, store=str(store_dir))
    with pytest.raises(ConfigError) as info:
        train(cfg)
    assert field in str(info.value)
    assert not store_dir.exists()  # rejected before touching the store
