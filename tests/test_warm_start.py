"""Warm starts (train.init_from): weights only from another run, prefixes, shapes checked first, the summary's record,
the schedule's previous run, and the savings lever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thrifty.config import ConfigError, RunConfig, build_config
from thrifty.money import savings
from thrifty.runs import checkpoints, read_metrics, read_summary
from thrifty.runs.lineage import previous_run, resolve_previous, template_of
from thrifty.storage import open_store
from training import warm_start
from training.loop import train
from training.recipes import resolve_recipe
from training.runtime import weights_sha256
from training.smoke import smoke_test
from training.validate import SmokeTestFailed

SMALL = {"hidden": 32, "limit": 600}


def config(store: Path, name: str, recipe: str = "digits", params: dict | None = None, **train_cfg) -> RunConfig:
    return build_config({
        "run_name": name, "recipe": recipe, "recipe_params": params or SMALL, "store": str(store),
        "train": {"max_epochs": 3, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 10, "log_every": 5,
                  "lr": 3e-3, "early_stopping": {"patience": 50}, **train_cfg},
    })


def best_state(store: Path, run: str) -> tuple[int, dict]:
    info = checkpoints.best_checkpoint(open_store(str(store)), run)
    return info.step, torch.load(store / info.prefix / "state.pt", weights_only=True)


@pytest.fixture
def source(store_dir: Path) -> Path:
    """A finished digits run 'src' (from scratch) in the store."""
    train(config(store_dir, "src"))
    return store_dir


def test_weights_only_from_gold_with_source_step_and_hash_in_the_summary(source: Path) -> None:
    step, state = best_state(source, "src")
    fresh = resolve_recipe("digits").make_model(resolve_recipe("digits").parse_params(SMALL), {"features": 64,
                                                                                           "classes": 10})
    warm = warm_start.load_into(open_store(str(source)), config(source, "x", init_from="run:src"), fresh)
    assert weights_sha256(fresh.state_dict()) == weights_sha256(state["model"])  # the gold weights, loaded whole

    result = train(config(source, "warm", init_from="run:src:gold"))
    got = result.summary.init_from
    assert (got.source, got.run, got.step, got.format) == ("run:src:gold", "src", step, "checkpoint")
    assert got.weights_sha256 == weights_sha256(state["model"]) == warm.weights_sha256
    assert (got.loaded, got.left_fresh) == (4, 0)
    # weights only: the optimizer and schedule started fresh (their step counts are this run's alone)
    _, mine = best_state(source, "warm")
    last = torch.load(sorted((source / "runs" / "warm" / "ckpt").glob("step-*/state.pt"))[-1], weights_only=True)
    assert int(last["scheduler"]["last_epoch"]) == result.step
    assert int(next(iter(last["optimizer"]["state"].values()))["step"]) == result.step
    # and it started where the source ended: its first evaluation is better than the source's first
    first = lambda run: next(r["val_loss"] for r in read_metrics(open_store(str(source)), run)  # noqa: E731
                             if r.get("event") == "eval")
    assert first("warm") < first("src")


def test_latest_best_and_uri_forms_name_their_checkpoint(source: Path) -> None:
    store = open_store(str(source))
    infos = checkpoints.committed(store, "src")
    best = checkpoints.best_checkpoint(store, "src")
    cfg = lambda spec: config(source, "x", init_from=spec)  # noqa: E731
    assert warm_start.locate(store, cfg("run:src:latest")).step == infos[-1].step
    assert warm_start.locate(store, cfg("run:src:best")).step == best.step
    located = warm_start.locate(store, cfg(str(source / infos[0].prefix)))
    assert (located.run, located.step, located.key) == ("src", infos[0].step, "state.pt")
    # a gold mark on one checkpoint wins over the best
    from thrifty.archive import Policy

    Policy(gold=[infos[0].prefix + "/"]).save(store)
    assert warm_start.locate(store, cfg("run:src:gold")).step == infos[0].step
    assert warm_start.locate(store, cfg("run:src:best")).step == best.step


def test_own_checkpoint_wins_over_init_from(source: Path) -> None:
    """A resumed job continues from its own checkpoint; the source it started from stays in the summary."""
    first = train(config(source, "two-jobs", init_from="run:src", stop_at_epoch=1))
    assert first.status == "rung"
    # were init_from applied again it would fail: the run it names does not exist
    done = train(config(source, "two-jobs", init_from="run:no-such-run"))
    assert done.summary.init_from.run == "src" and done.summary.resumes == 1


def test_prefixes_keep_the_backbone_under_a_new_head(store_dir: Path) -> None:
    """Transfer: digits' backbone under a two-class head for odd-or-even (an own recipe)."""
    train(config(store_dir, "digits-bb", "recipes_custom:backbone", early_stopping={"metric": "val_loss"}))
    _, state = best_state(store_dir, "digits-bb")
    cfg = config(store_dir, "parity", "recipes_custom:parity", init_from="run:digits-bb", max_epochs=1)
    with pytest.raises(ConfigError, match=r"head.weight is \[10, 32\] there and \[2, 32\] here.*init_prefixes"):
        train(cfg)
    with pytest.raises(SmokeTestFailed, match=r"head.weight is \[10, 32\] there and \[2, 32\] here"):
        smoke_test(cfg)  # the same check before anything is rented
    with pytest.raises(ConfigError, match="'neck.' matches no parameter.*backbone., head."):
        train(config(store_dir, "parity", "recipes_custom:parity", init_from="run:digits-bb", init_prefixes=["neck."]))

    model = resolve_recipe("recipes_custom:parity").make_model(
        resolve_recipe("recipes_custom:parity").parse_params(SMALL), {"features": 64, "classes": 2})
    head_before = model.head.weight.detach().clone()
    pcfg = config(store_dir, "parity", "recipes_custom:parity", init_from="run:digits-bb", init_prefixes=["backbone."])
    warm = warm_start.load_into(open_store(str(store_dir)), pcfg, model)
    assert (warm.loaded, warm.left_fresh) == (2, 2)
    assert torch.equal(model.backbone[0].weight, state["model"]["backbone.0.weight"])
    assert torch.equal(model.head.weight, head_before)  # the new head keeps its fresh initialisation
    result = train(pcfg.updated({"train": {**pcfg.train.model_dump(mode="json"), "max_epochs": 2}}))
    assert result.summary.init_from.prefixes == ["backbone."]
    scratch = train(config(store_dir, "parity-scratch", "recipes_custom:parity", max_epochs=2))
    assert result.summary.final_metrics["val_loss"] < scratch.summary.final_metrics["val_loss"]


def test_bad_sources_say_what_to_change(source: Path) -> None:
    store = open_store(str(source))
    for spec, message in (("run:nope", "no run 'nope'"), (str(source / "runs" / "src" / "ckpt"), "no complete checkpoint"),
                          ("run:src:fp16", "no readable fp16 export.*thrifty archive gold src --export fp16")):
        with pytest.raises(ConfigError, match=message):
            warm_start.locate(store, config(source, "x", init_from=spec))
    # a checkpoint whose data changed since its commit record is refused, not loaded
    info = checkpoints.best_checkpoint(store, "src")
    state = source / info.prefix / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="does not match the sha256"):
        warm_start.read_weights(warm_start.locate(store, config(source, "x", init_from="run:src:best")))


def test_previous_is_the_newest_finished_run_of_the_schedule(store_dir: Path) -> None:
    store = open_store(str(store_dir))
    for name, status in (("nightly-20261120", "completed"), ("nightly-20261122", "stopped_early"),
                         ("nightly-20261123", None), ("nightly-20261125", "completed"), ("other-20261122", "completed")):
        if status:
            store.put_bytes(f"runs/{name}/summary.json", json.dumps(_summary(name, status)).encode())
        else:
            store.put_bytes(f"runs/{name}/ckpt/step-000000010/COMMIT", b"{}")  # unfinished
    assert previous_run(store, "nightly-{date}", "nightly-20261124") == "nightly-20261122"
    assert previous_run(store, "nightly-{date}", "nightly-20261120") is None
    assert template_of("nightly-20261124") == "nightly-{date}" and template_of("digits-demo") is None

    cfg = config(store_dir, "nightly-{date}", init_from="previous")
    resolved, said = resolve_previous(store, cfg.resolved(__import__("datetime").date(2026, 11, 24)), "nightly-{date}")
    assert resolved.train.init_from == "run:nightly-20261122:gold" and "nightly-20261122" in said
    first, said = resolve_previous(store, config(store_dir, "nightly-20261101", init_from="previous"))
    assert first.train.init_from is None and "from scratch" in said
    with pytest.raises(ConfigError, match="'previous' means .* same schedule"):
        resolve_previous(store, config(store_dir, "digits-demo", init_from="previous"))


def _summary(name: str, status: str) -> dict:
    return {"run_id": name, "recipe": "digits", "status": status, "steps": 10, "total_steps": 10, "epochs": 1.0,
            "stopped_early": status == "stopped_early", "best_metric": {"name": "val_loss", "value": 1.0, "step": 10,
                                                                       "checkpoint_step": 10},
            "wall_time_s": 1.0, "data_wait_fraction": 0.0, "checkpoint_time_fraction": 0.0, "checkpoints_written": 1,
            "resumes": 0, "precision": "fp32", "device": "cpu", "world_size": 1, "cache_key": "k",
            "weights_sha256": "0" * 64}


def test_nightly_chain_counts_steps_not_trained_against_the_scratch_run(store_dir: Path) -> None:
    """Night 1 from scratch, nights 2 and 3 warm (init_from: previous on the node): the savings reference of each
    warm night is night 1, and the lever prices the steps it did not train."""
    es = {"patience": 2, "min_delta": 0.002}
    night1 = train(config(store_dir, "nightly-20261101", max_epochs=8, eval_every=5, early_stopping=es))
    assert night1.summary.init_from is None
    night2 = train(config(store_dir, "nightly-20261102", max_epochs=8, eval_every=5, early_stopping=es,
                          init_from="previous"))
    night3 = train(config(store_dir, "nightly-20261103", max_epochs=8, eval_every=5, early_stopping=es,
                          init_from="previous"))
    store = open_store(str(store_dir))
    for night, source in ((night2, "nightly-20261101"), (night3, "nightly-20261102")):
        warm = night.summary.init_from
        assert warm.run == source and warm.reference_run == "nightly-20261101"
        assert warm.steps_not_trained == max(0, warm.reference_steps - night.summary.steps)
        reached = [r["step"] for r in read_metrics(store, "nightly-20261101") if r.get("event") == "eval"
                   and r["val_loss"] <= night.summary.best_metric.value]
        assert warm.reference_reached == bool(reached)
        assert warm.reference_steps == (reached[0] if reached else night1.summary.steps)
    warm = night3.summary.init_from
    assert warm.steps_not_trained > 0, "a night warm-started from a trained model needs fewer steps"
    from thrifty.money.ledger import Attempt

    attempt = Attempt(job_id="j", number=1, cloud="aws", region="us-east-1",
                      instance="g5.xlarge", spot=True, usd_per_hour=0.5, nodes=1, started_unix=0.0, ended_unix=3600.0,
                      end_reason="succeeded")
    figures = savings.breakdown("nightly-20261103", [attempt], read_summary(store, "nightly-20261103"), False, 0.0, [])
    per_step = (figures.actual_usd + figures.levers_usd["spot"]) / night3.summary.steps  # on-demand, fp32 on CPU
    assert figures.levers_usd["warm_start"] == pytest.approx(per_step * warm.steps_not_trained, rel=1e-4)


@pytest.mark.slow
def test_init_from_a_checkpoint_and_an_export_of_another_store_on_s3(request, monkeypatch, store_dir: Path) -> None:
    """Store URIs of another store (moto's S3 on loopback): a checkpoint directory and an exported safetensors."""
    from stores import _s3_backend
    from training.export import export_checkpoint

    s3 = _s3_backend(request, monkeypatch)
    train(config(s3.uri, "remote", max_epochs=1))
    remote = open_store(s3.uri)
    best = checkpoints.best_checkpoint(remote, "remote")
    record = export_checkpoint(remote, "remote", best, "fp16", 0.01)
    for uri, fmt in ((f"{s3.uri}/{best.prefix}", "checkpoint"), (f"{s3.uri}/{record.key}", "safetensors")):
        result = train(config(store_dir, f"local-{fmt}", init_from=uri, max_epochs=1))
        warm = result.summary.init_from
        assert (warm.format, warm.step, warm.run, warm.source) == (fmt, best.step, None, uri)
        assert warm.read.endswith(record.key if fmt == "safetensors" else f"{best.prefix}/state.pt")
