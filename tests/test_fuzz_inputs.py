"""Malformed input, as users type it, through the real CLI: every case exits 2 with the setting named and no
traceback, before anything is written or rented (issue 10.5-10.7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.cli import main

# (what is typed after the command, a fragment the message must hold)
BAD_SETTINGS = [
    (["--set", "train.lr=inf"], "train.lr"),
    (["--set", "train.lr=.nan"], "train.lr"),
    (["--set", "train.weight_decay=inf"], "train.weight_decay"),
    (["--set", "budget.max_usd=.inf"], "budget.max_usd"),
    (["--set", "train.mean_time_between_preemptions_s=.inf"], "mean_time_between_preemptions_s"),
    (["--set", "train.seed=100000000000000000000000"], "train.seed"),
    (["--set", "train.seed=-1"], "train.seed"),
    (["--set", "store="], "store is empty"),
    (["--set", "store=s3:/bucket/x"], "'//' missing"),
    (["--set", "store=s3://"], "names no bucket"),
    (["--set", "store=az://"], "names no container"),
    (["--set", "store=ftp://host/x"], "unsupported scheme"),
    (["--set", "store=file://"], "names no directory"),
    (["--set", "run_name=" + "n" * 55 + "-{date}"], "the limit is 63"),
    (["--set", "recipe=9bad"], "built-in name"),
    (["--set", "budget.thresholds=[0.8, 0.5]"], "thresholds"),
    (["--set", "train.micro_batch=0"], "train.micro_batch"),
    (["--set", "train.checkpoint_every=0"], "checkpoint_every"),
    (["--set", "train.precision=fp8"], "train.precision"),
    (["--set", "compute.emulate=aws"], "CLOUD:INSTANCE"),
    (["--set", "compute.accelerators=[A10G:0]"], "NAME:COUNT"),
    (["--set", "train.lr"], "section.key=value"),
    (["--set", "train=5"], "'train'"),
    (["--set", "nosuch.key=1"], "not a known setting"),
]

# they pass the RunConfig but not the recipe or the data: the training program's own checks, run before it trains
BAD_RECIPES = [
    (["--set", "recipe=json:loads"], "'json:loads' is not a recipe"),
    (["--set", "recipe=no.such.module:recipe"], "cannot import module"),
    (["--set", "recipe=os:getcwd"], "'os:getcwd' is not a recipe"),
    (["--set", "recipe_params.nope=1"], "is not an option"),
    (["--set", "recipe_params.limit=-1"], "recipe_params.limit"),
    (["--set", "recipe_params.hidden=inf"], "recipe_params.hidden"),
    (["--set", "train.early_stopping.metric=val_f1"], "reports val_loss, val_accuracy"),
    (["--set", "recipe_params.limit=0"], "produced no train examples"),
    (["--set", "recipe_params.limit=5", "--set", "train.micro_batch=100000"], "one optimizer step needs"),
]


def call(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def assert_refused(code: int, err: str, fragment: str) -> None:
    assert code == 2, err
    assert fragment in err, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("typed, fragment", BAD_SETTINGS, ids=[" ".join(t) for t, _ in BAD_SETTINGS])
def test_bad_settings_exit_2_naming_the_setting(capsys, tmp_path, typed, fragment):
    store = tmp_path / "store"
    code, err = call(capsys, "config", "--set", f"store={store}", *typed)
    assert_refused(code, err, fragment)
    assert not store.exists()


@pytest.mark.parametrize("command", ["train", "smoke"])
@pytest.mark.parametrize("typed, fragment", BAD_RECIPES, ids=[" ".join(t) for t, _ in BAD_RECIPES])
def test_bad_recipes_and_data_exit_2_before_anything_is_written(capsys, tmp_path, command, typed, fragment):
    store = tmp_path / "store"
    code, err = call(capsys, command, "--set", f"store={store}", "--set", "run_name=fuzz", *typed)
    assert_refused(code, err, fragment)
    assert not list(store.glob("cache/*/manifest.json")), "no cache entry for a run that cannot train"
    assert not (store / "runs").exists(), "no run started"


@pytest.mark.parametrize("content, fragment", [
    ("train: [1, 2", "not valid YAML"),
    ("- a\n- b\n", "mapping of settings"),
    ('{"train": {"lr": 1,}}', "not valid JSON"),
])
def test_bad_config_files(capsys, tmp_path, content, fragment):
    path = tmp_path / ("run.json" if content.startswith("{") else "run.yaml")
    path.write_text(content)
    assert_refused(*call(capsys, "train", "--config", str(path)), fragment)
    assert_refused(*call(capsys, "run", "--config", str(tmp_path / "missing.yaml")), "does not exist")


def test_empty_config_files_mean_the_defaults_whatever_their_format(capsys, tmp_path):
    for name in ("empty.yaml", "empty.json"):
        (tmp_path / name).write_text("\n")
        code = main(["config", "--config", str(tmp_path / name)])
        assert code == 0 and json.loads(capsys.readouterr().out)["run_name"] == "digits-demo"


@pytest.mark.parametrize("argv, fragment", [
    (["archive", "--older-than-days", "inf"], "older_than_days"),
    (["archive", "--older-than-days", "0"], "older_than_days"),
    (["archive", "--store", "s3:/bucket"], "'//' missing"),
    (["archive", "--as-of", "next tuesday"], "as_of"),
    (["report", "--set", "store=gs://"], "names no bucket"),
    (["plan", "--set", "compute.accelerators=[Z99:1]"], "Z99"),
    (["prices", "--accelerator", "!!"], "NAME or NAME:COUNT"),
])
def test_other_commands_refuse_bad_input_the_same_way(capsys, argv, fragment):
    assert_refused(*call(capsys, *argv), fragment)


def test_store_errors_are_user_errors_in_every_command(capsys, tmp_path, s3_standin, monkeypatch):
    """A bucket that does not exist: `train`, `smoke`, `report` and `archive --apply` say so, exit 2, no traceback."""
    from stores import apply_env

    apply_env(monkeypatch, s3_standin.env())
    missing = "s3://thrifty-no-such-bucket/x"
    for argv in (["train", "--set", f"store={missing}"], ["smoke", "--set", f"store={missing}"],
                 ["report", "--set", f"store={missing}"], ["archive", "--apply", "--store", missing]):
        code, err = call(capsys, *argv)
        assert_refused(code, err, "thrifty-no-such-bucket")
    assert not Path("s3:").exists()
