"""RunConfig: loading, overrides, and an actionable one-paragraph error (exit code 2, nothing written) for bad input."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from conftest import PYTHON, python_env
from thrifty.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    build_config,
    config_from_env,
    load_config,
    parse_override,
)

GOOD = {
    "run_name": "cfg-test",
    "recipe": "digits",
    "recipe_params": {"hidden": 16, "dropout": 0.0},
    "train": {
        "max_epochs": 3,
        "micro_batch": 16,
        "lr": 0.002,
        "precision": "fp32",
        "checkpoint_every": 5,
        "early_stopping": {"metric": "val_accuracy", "mode": "max", "patience": 2},
    },
    "budget": {"max_usd": 2.5, "thresholds": [0.25, 0.75, 1.0]},
}


def write(path: Path, data: dict) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(data))
    else:
        path.write_text(yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_load_yaml_and_json(tmp_path, suffix):
    cfg = load_config(write(tmp_path / f"run{suffix}", GOOD))
    assert isinstance(cfg, RunConfig)
    assert cfg.run_name == "cfg-test"
    assert cfg.recipe_params == {"hidden": 16, "dropout": 0.0}
    assert cfg.train.micro_batch == 16 and cfg.train.lr == 0.002 and cfg.train.checkpoint_every == 5
    assert cfg.train.early_stopping.mode == "max" and cfg.train.early_stopping.metric == "val_accuracy"
    assert cfg.budget.thresholds == [0.25, 0.75, 1.0]
    # what was not given keeps its default
    assert cfg.train.grad_accum_steps == 1 and cfg.compute.launcher == "local"


def test_yaml_and_json_give_the_same_config(tmp_path):
    assert load_config(write(tmp_path / "a.yaml", GOOD)) == load_config(write(tmp_path / "a.json", GOOD))


def test_empty_yaml_and_no_file_give_defaults(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml") == RunConfig() == load_config(None)


def test_example_config_loads():
    from conftest import REPO

    cfg = load_config(REPO / "examples" / "digits.yaml")
    assert cfg.recipe == "digits"


def test_overrides_are_typed_via_yaml(tmp_path):
    path = write(tmp_path / "run.yaml", GOOD)
    cfg = load_config(path, [
        "train.micro_batch=32",
        "train.lr=0.0003",
        "train.max_steps=null",
        "train.grad_clip=null",
        "train.early_stopping.enabled=false",
        "train.checkpoint_every=auto",
        "budget.thresholds=[0.5, 1.0]",
        "compute.accelerators=[L4:1]",
        "recipe_params.hidden=64",
        "run_name=other-run",
    ])
    assert cfg.train.micro_batch == 32 and isinstance(cfg.train.micro_batch, int)
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.train.max_steps is None and cfg.train.grad_clip is None
    assert cfg.train.early_stopping.enabled is False
    assert cfg.train.early_stopping.mode == "max"  # siblings of an overridden key are kept
    assert cfg.train.checkpoint_every == "auto"
    assert cfg.budget.thresholds == [0.5, 1.0]
    assert cfg.compute.accelerators == ["L4:1"]
    assert cfg.recipe_params == {"hidden": 64, "dropout": 0.0}
    assert cfg.run_name == "other-run"
    # the file on disk is not touched by overrides
    assert load_config(path).train.micro_batch == 16


def test_override_in_exponent_notation_reaches_the_config_as_a_float():
    cfg = load_config(None, ["train.lr=3e-4"])
    assert cfg.train.lr == pytest.approx(3e-4) and isinstance(cfg.train.lr, float)


def test_later_override_wins_and_creates_missing_sections():
    cfg = load_config(None, ["train.micro_batch=8", "train.micro_batch=4"])
    assert cfg.train.micro_batch == 4


def test_parse_override():
    assert parse_override("train.micro_batch=32") == (["train", "micro_batch"], 32)
    assert parse_override("train.lr=0.0003") == (["train", "lr"], 0.0003)
    assert parse_override("train.grad_clip=null") == (["train", "grad_clip"], None)
    assert parse_override("compute.use_spot=false") == (["compute", "use_spot"], False)
    assert parse_override("budget.notify=[a, b]") == (["budget", "notify"], ["a", "b"])
    assert parse_override("run_name=a=b") == (["run_name"], "a=b")  # split on the first '=' only
    assert parse_override("budget.notify=") == (["budget", "notify"], "")


@pytest.mark.parametrize("bad, words", [
    ("train.lr", ["section.key=value"]),
    ("=3", ["no key"]),
    ("train.lr=[1, 2", ["not valid YAML"]),
])
def test_bad_override_syntax(bad, words):
    with pytest.raises(ConfigError) as exc:
        parse_override(bad)
    for w in words:
        assert w in str(exc.value)


def test_override_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="'lr' is a value, not a section"):
        apply_overrides({"train": {"lr": 0.1}}, ["train.lr.x=1"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path / "bad.json")
    (tmp_path / "bad.yaml").write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


# ---------------------------------------------------------------- the object itself


def test_run_config_is_frozen():
    cfg = build_config(GOOD)
    with pytest.raises(ValidationError):
        cfg.run_name = "changed"
    with pytest.raises(ValidationError):
        cfg.train.lr = 1.0
    with pytest.raises(ValidationError):
        cfg.train.early_stopping.patience = 9
    assert cfg.run_name == "cfg-test" and cfg.train.lr == 0.002


@pytest.mark.parametrize("data", [{}, GOOD, {**GOOD, "train": {**GOOD["train"], "checkpoint_every": "auto", "max_steps": 7,
                                                             "grad_clip": None}}])
def test_json_round_trip(data):
    cfg = build_config(data)
    again = RunConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg
    assert again.model_dump() == cfg.model_dump()
    # the node's environment variable carries the same config
    assert config_from_env({"THRIFTY_RUN_CONFIG": cfg.to_env_json()}) == cfg
    # and a mode="json" dump (what checkpoints and overrides go through) validates back too
    assert build_config(cfg.model_dump(mode="json")) == cfg


# ---------------------------------------------------------------- bad input: the message


def deep_merge(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "recipe_params" \
            else v
    return out


# name -> (changes to GOOD, words the error must contain: the field, and what to do)
BAD_VALIDATION = {
    "unknown_top_level_key": ({"learning_rate": 0.1}, ["'learning_rate'", "not a known setting", "remove it"]),
    "unknown_nested_key": ({"train": {"learning_rate": 0.1}}, ["'train.learning_rate'", "not a known setting",
                                                               "remove it"]),
    "wrong_type": ({"train": {"micro_batch": "big"}}, ["'train.micro_batch'", "must be a whole number or 'auto'", "'big'"]),
    "negative_batch": ({"train": {"micro_batch": -4}}, ["'train.micro_batch'", "a positive number of examples or 'auto'", "-4"]),
    "patience_zero": ({"train": {"early_stopping": {"enabled": True, "patience": 0}}},
                      ["train.early_stopping", "patience", ">= 1", "enabled=false"]),
    "thresholds_out_of_order": ({"budget": {"thresholds": [0.8, 0.5, 1.0]}},
                                ["'budget.thresholds'", "increasing", "[0.5, 0.8, 1.0]"]),
}

# errors only the training program can see (it resolves the recipe and its params)
BAD_AT_TRAIN = {
    "unknown_recipe": ({"recipe": "nosuchrecipe"}, ["'recipe'", "nosuchrecipe", "digits", "module:function"]),
    "recipe_does_not_import": ({"recipe": "no_such_pkg_xyz.recipes:make"},
                               ["'recipe'", "no_such_pkg_xyz.recipes", "installed"]),
    "empty_dataset": ({"recipe_params": {"limit": 0}}, ["digits", "no train examples", "recipe_params", "limit"]),
    "unknown_recipe_param": ({"recipe_params": {"hiden": 8}}, ["'recipe_params.hiden'", "not an option",
                                                               "Known options", "hidden"]),
}


def assert_actionable(message: str, words: list[str]) -> None:
    assert "\n" not in message.strip(), f"not one paragraph: {message!r}"
    assert "Traceback" not in message
    for w in words:
        assert w in message, f"{w!r} missing from: {message}"


@pytest.mark.parametrize("case", sorted(BAD_VALIDATION))
def test_bad_config_error_names_the_field_and_the_fix(tmp_path, case):
    changes, words = BAD_VALIDATION[case]
    path = write(tmp_path / "bad.yaml", deep_merge(GOOD, changes))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert_actionable(str(exc.value), [*words, str(path)])


@pytest.mark.parametrize("case", sorted(BAD_VALIDATION))
def test_bad_value_via_override_gives_the_same_error(case):
    changes, words = BAD_VALIDATION[case]
    overrides = []

    def flatten(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                flatten(f"{prefix}{k}.", v)
            else:
                overrides.append(f"{prefix}{k}={json.dumps(v)}")

    flatten("", changes)
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides)
    assert_actionable(str(exc.value), words)


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as exc:
        build_config({"train": {"micro_batch": 0, "lr": -1}, "colour": "red"})
    assert_actionable(str(exc.value), ["'train.micro_batch'", "'train.lr'", "'colour'"])


@pytest.mark.parametrize("case", sorted(BAD_AT_TRAIN))
def test_bad_recipe_input_raises_config_error_from_train(tmp_path, case):
    from training.loop import train
    from training.recipes.base import EmptyDataError

    changes, words = BAD_AT_TRAIN[case]
    cfg = build_config({**deep_merge(GOOD, changes), "store": str(tmp_path / "store")})
    with pytest.raises((ConfigError, EmptyDataError)) as exc:
        train(cfg)
    assert_actionable(str(exc.value), words)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))


# ---------------------------------------------------------------- bad input through the CLI

CLI_CASES = {**BAD_VALIDATION, **BAD_AT_TRAIN}
OVERRIDE_CASES = {  # name -> (--set arguments on top of GOOD, words)
    "bad_override_value": (["--set", "train.micro_batch=big"], ["'train.micro_batch'", "'big'"]),
    "unknown_override_key": (["--set", "train.learning_rate=0.1"], ["'train.learning_rate'", "not a known setting"]),
    "override_patience_zero": (["--set", "train.early_stopping.patience=0"], ["patience", ">= 1"]),
}
ALL_CLI = sorted(CLI_CASES) + sorted(OVERRIDE_CASES)
# one real `python -m training` process per distinct error path (each costs ~2 s of torch import):
# pydantic validation, an override, recipe resolution, recipe_params validation, preprocessing
SUBPROCESS_CASES = ["unknown_nested_key", "bad_override_value", "recipe_does_not_import", "unknown_recipe_param",
                    "empty_dataset"]


def cli_case(root: Path, name: str) -> tuple[list[str], Path, Path, list[str]]:
    """(argv after `python -m training`, case directory, store directory, expected words)."""
    if name in OVERRIDE_CASES:
        extra, words = OVERRIDE_CASES[name]
        data = GOOD
    else:
        changes, words = CLI_CASES[name]
        data, extra = deep_merge(GOOD, changes), []
    case_dir = root / name
    case_dir.mkdir()
    store = case_dir / "store"
    config = write(case_dir / "bad.yaml", {**data, "store": str(store)})
    return ["--config", str(config), *extra], case_dir, store, words


def assert_exit_2_nothing_written(rc: int, stdout: str, stderr: str, case_dir: Path, store: Path,
                                  words: list[str]) -> None:
    assert rc == 2, f"exit code {rc}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert_actionable(errors[0], words)
    assert "Traceback" not in stderr
    assert stdout.strip() == ""
    # nothing written: no store, no default .thrifty/ in the working directory, no stray files
    assert not store.exists() or not any(store.rglob("*")), sorted(store.rglob("*"))
    assert sorted(p.name for p in case_dir.iterdir() if p.name != "store") == ["bad.yaml"]


@pytest.mark.parametrize("case", ALL_CLI)
def test_cli_main_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys, case):
    """The CLI entry point in-process (cheap): every bad input."""
    from training.cli import main

    argv, case_dir, store, words = cli_case(tmp_path, case)
    monkeypatch.chdir(case_dir)
    monkeypatch.delenv("THRIFTY_RUN_CONFIG", raising=False)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert_exit_2_nothing_written(rc, out, err, case_dir, store, words)


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """`python -m training` as real processes, two at a time."""
    root = tmp_path_factory.mktemp("cli")
    cases = {name: cli_case(root, name) for name in SUBPROCESS_CASES}
    results = {}

    def one(name: str) -> None:
        argv, case_dir, store, words = cases[name]
        proc = subprocess.run([PYTHON, "-m", "training", *argv], cwd=case_dir, env=python_env(),
                              capture_output=True, text=True, timeout=120)
        results[name] = (proc.returncode, proc.stdout, proc.stderr, case_dir, store, words)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, cases))
    return results


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_cli_process_bad_input_exits_2_and_writes_nothing(cli_results, case):
    assert_exit_2_nothing_written(*cli_results[case])
