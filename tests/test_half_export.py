"""Half-precision gold weights: `thrifty archive gold --export fp16|bf16`, train.export_half, and reading them back
(init_from, archive and restore)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import torch

from thrifty.archive import ArchiveSettings, Policy, scan
from thrifty.archive.store import restore_run
from thrifty.cli import main
from thrifty.config import ConfigError, build_config
from thrifty.runs import checkpoints
from thrifty.runs.reuse import read_export
from thrifty.storage import Archived, open_store
from training import warm_start
from training.export import ExportOutOfTolerance, export_checkpoint
from training.half import load_half, to_half
from training.loop import train

CODELM = {"max_bytes": 60_000, "val_every": 3, "seq_len": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 300}


def config(store: Path, name: str, recipe: str = "digits", params: dict | None = None, **train_cfg):
    return build_config({
        "run_name": name, "recipe": recipe, "recipe_params": params or {"hidden": 32, "limit": 600},
        "store": str(store), "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 10,
                                       "log_every": 5, "lr": 3e-3, "early_stopping": {"patience": 50}, **train_cfg}})


def test_cli_exports_gold_weights_beside_the_checkpoint(store_dir: Path, capsys) -> None:
    train(config(store_dir, "src"))
    store = open_store(str(store_dir))
    gold = checkpoints.best_checkpoint(store, "src")
    assert main(["archive", "gold", "src", "--export", "fp16", "--store", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "init_from: run:src:fp16" in out
    assert Policy.load(store).gold == ["runs/src/"]  # marked gold as before
    record = read_export(store, gold.prefix, "fp16")
    data = (store_dir / record.key).read_bytes()
    assert record.key == f"{gold.prefix}/weights.fp16.safetensors"
    assert (record.bytes, record.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert record.step == gold.step and record.source_sha256 == gold.commit["sha256"]
    assert record.bytes < 0.6 * record.fp32_bytes and record.fp32_bytes < record.source_bytes
    assert record.relative_difference <= record.tolerance == 0.01
    assert abs(record.half["val_loss"] - record.full["val_loss"]) <= 0.01 * record.full["val_loss"]
    tensors = load_half(store_dir / record.key)
    assert {t.dtype for t in tensors.values()} == {torch.float16}

    # init_from reads it (hash checked) and a run trains from it
    located = warm_start.locate(store, config(store_dir, "x", init_from="run:src:fp16"))
    assert (located.format, located.dtype, located.step) == ("safetensors", "fp16", gold.step)
    result = train(config(store_dir, "from-half", init_from="run:src:fp16", max_epochs=1))
    assert (result.summary.init_from.format, result.summary.init_from.dtype) == ("safetensors", "fp16")
    by_uri = warm_start.locate(store, config(store_dir, "x", init_from=str(store_dir / record.key)))
    assert by_uri.sha256 == record.sha256 and by_uri.run == "src"

    # a target that is not a run or checkpoint says so
    assert main(["archive", "gold", "runs/src/ckpt", "--export", "bf16", "--store", str(store_dir)]) == 2
    assert "run id or a checkpoint" in capsys.readouterr().err


def test_out_of_tolerance_writes_nothing(store_dir: Path) -> None:
    train(config(store_dir, "src", max_epochs=1))
    store = open_store(str(store_dir))
    gold = checkpoints.best_checkpoint(store, "src")
    with pytest.raises(ExportOutOfTolerance, match=r"bf16 weights .* over the 0\.000%.*fp16 instead"):
        export_checkpoint(store, "src", gold, "bf16", 1e-9)
    assert not list((store_dir / gold.prefix).glob("weights.*"))


def test_tied_weights_are_written_once(store_dir: Path) -> None:
    """codelm ties its output head to the token embedding: one tensor in the file (a checkpoint's copy holds two
    equal ones), both names back on load."""
    emb = torch.randn(8, 4)
    tensors, aliases = to_half({"tok_emb.weight": emb, "head.weight": emb, "steps": torch.tensor(3)}, "bf16")
    assert aliases == {"tok_emb.weight": "head.weight"} and set(tensors) == {"head.weight", "steps"}
    _, none = to_half({"a": emb, "b": emb.clone() + 1}, "fp16")
    assert none == {}  # equal shapes, other values: both written
    assert tensors["head.weight"].dtype == torch.bfloat16 and tensors["steps"].dtype == torch.int64


@pytest.mark.slow
def test_export_at_the_end_of_a_codelm_run_and_its_archive_round_trip(store_dir: Path) -> None:
    result = train(config(store_dir, "lm", "codelm", CODELM, micro_batch=16, max_epochs=1, export_half="bf16",
                          export_tolerance=0.02))
    half = result.summary.half_export
    assert half is not None and half.dtype == "bf16" and half.metric == "val_loss"
    assert half.relative_difference <= 0.02
    store = open_store(str(store_dir))
    tensors = load_half(store_dir / half.key)
    assert tensors["head.weight"] is tensors["tok_emb.weight"]  # tied: stored once
    assert half.bytes < 0.6 * half.fp32_bytes

    # archived with its checkpoint (its record moves first, like COMMIT), restored (record last), readable again
    gold_prefix = half.key.rpartition("/")[0]
    plan = scan(store, ArchiveSettings(store=str(store_dir), older_than_days=1, as_of="2100-01-01"))
    group = [i for i in plan.items if i.key.startswith(gold_prefix + "/")]
    assert {i.action for i in group} == {"keep"}  # the best checkpoint and its export are the run's gold weights
    moved = type(plan)(plan.settings, plan.as_of, [dataclasses.replace(i, action="archive") for i in group], {})
    names = [i.key.rpartition("/")[2] for i in moved.to_archive]
    assert set(names[:2]) == {"COMMIT", "weights.bf16.json"} and len(names) == 4
    for item in moved.to_archive:
        store.set_storage_class(item.key, "ARCHIVE")
    with pytest.raises(Archived):
        read_export(store, gold_prefix, "bf16")  # archived: never read in place
    with pytest.raises(ConfigError, match="archived in cold storage: `thrifty archive restore lm"):
        warm_start.locate(store, config(store_dir, "x", "codelm", CODELM, init_from="run:lm:bf16"))
    restored = restore_run(store, "lm")
    assert {s.key.rpartition("/")[2] for s in restored[-2:]} == {"COMMIT", "weights.bf16.json"}
    assert read_export(store, gold_prefix, "bf16") == half
    warm = warm_start.locate(store, config(store_dir, "x", "codelm", CODELM, init_from="run:lm:bf16"))
    assert warm.sha256 == half.sha256 and len(warm_start.read_weights(warm)) == len(tensors)
