"""Hostile input through the real CLI (issue 21.7): an alias bomb, nesting past any parser's stack, text that is not
UTF-8, stores that cannot be, numbers that overflow, values of megabytes, paths that walk out of the store, names that
cannot be imported, recipe specs naming functions that are not recipes. Every case exits 2 within a bound far below a
hang, with a short message naming what to change and no traceback, and writes nothing (the working directory, and for
the cases run in their own process HOME and TMPDIR too, compared file by file). What could hang, blow up memory or
end the process (a bomb, a parser's stack, os:abort, sys:exit) runs in its own process under a timeout; the rest runs
in this one."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import python_env
from thrifty.cli import main

BOUND_S = 60  # generous for a loaded machine; the alias bomb took 20 s to die of MemoryError, the GCS space 90 s+
MEMORY_CAP_BYTES = 4 << 30  # torch and Prefect import well inside it
MAX_MESSAGE = 2000  # a 100 KB value is echoed in at most this many characters of stderr

BOMB_LEVELS = "".join(f"l{i + 1}: &l{i + 1} [{', '.join([f'*l{i}'] * 9)}]\n" for i in range(9))
ALIAS_BOMB = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + BOMB_LEVELS  # 9^10 strings once expanded; 1 KB as written
SET_BOMB = "train={" + ", ".join(["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]) + "}"
DEEP = 50_000


def files_under(*roots: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for root in roots for p in root.rglob("*")}


def _memory_capped() -> None:
    """A regression (the bomb expanded) dies of MemoryError at 4 GiB instead of taking a shared machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def thrifty(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`thrifty ARGV` in tmp_path/work with a private HOME and TMPDIR; asserts it wrote nothing in any of them."""
    work, home, tmp = (tmp_path / d for d in ("work", "home", "tmp"))
    for d in (work, home, tmp):
        d.mkdir(exist_ok=True)
    before = files_under(work, home, tmp)
    child = {**python_env(), "HOME": str(home), "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "thrifty.cli", *argv], cwd=work, env=child, capture_output=True,
                          text=True, timeout=BOUND_S, preexec_fn=_memory_capped)
    assert files_under(work, home, tmp) == before, f"{argv[:3]} wrote something:\n{proc.stderr[-2000:]}"
    return proc


def assert_refused(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    err = proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert len(err) < MAX_MESSAGE, f"a {len(err)}-character message: {err[:300]}..."
    for fragment in fragments:
        assert fragment in err, err


def refused_here(monkeypatch, capsys, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`thrifty ARGV` in this process, in tmp_path/work; asserts it wrote nothing there and ended within the bound."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    before = files_under(work)
    started = time.monotonic()
    code = main(list(argv))
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert files_under(work) == before, f"{argv[:3]} wrote something:\n{err[-2000:]}"
    assert took < BOUND_S, f"{argv[:3]} took {took:.0f} s"
    return subprocess.CompletedProcess(argv, code, "", err)


CONFIG_FILES = {  # file name, content (bytes), what the message says; read by `thrifty config` in its own process
    "alias bomb": ("bomb.yaml", ALIAS_BOMB.encode(), ["holds more than", "YAML alias"]),
    "deep YAML": ("deep.yaml", ("train: " + "[" * DEEP + "]" * DEEP).encode(), ["nests too deeply"]),
    "deep JSON": ("deep.json", ('{"train": ' + "[" * DEEP + "]" * DEEP + "}").encode(), ["nests too deeply"]),
    "UTF-16": ("utf16.yaml", "run_name: x\n".encode("utf-16"), ["not UTF-8", "UTF-16"]),
    "binary": ("binary.yaml", bytes(range(256)) * 8, ["not UTF-8"]),
    "over 1 MiB": ("big.yaml", b"run_name: " + b"n" * (2 << 20) + b"\n", ["over 1 MiB"]),
    "a 5000-digit integer": ("seed.yaml", b"train: {seed: " + b"9" * 5000 + b"}\n", ["not valid YAML", "4300"]),
    "ten thousand unknown keys": ("typos.yaml", "".join(f"k{i}: 1\n" for i in range(10_000)).encode(),
                                  ["'k0' is not a known setting", "more"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_FILES))
def test_hostile_config_files(tmp_path, case):
    name, content, fragments = CONFIG_FILES[case]
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / name).write_bytes(content)
    assert_refused(thrifty(tmp_path, "config", "--config", name), *fragments)


def test_an_alias_bomb_in_a_set_value(tmp_path):
    assert_refused(thrifty(tmp_path, "config", "--set", SET_BOMB), "holds more than")


@pytest.mark.parametrize("spec", ["sys:exit", "os:abort", "tempfile:mkdtemp"])
def test_a_recipe_spec_that_names_a_function_runs_nothing(tmp_path, spec):
    """Each used to run: os:abort killed the process, sys:exit ended it 0, mkdtemp made a directory in TMPDIR."""
    proc = thrifty(tmp_path, "train", "--set", "store=st", "--set", f"recipe={spec}")
    assert_refused(proc, "'recipe'", f"{spec!r} is not a recipe", "Nothing of it was run", "-> Recipe")


def test_the_run_command_refuses_a_recipe_that_is_not_one(tmp_path):
    """`thrifty run --set recipe=sys:exit` ended 0 in silence: the flow's CLI checks the recipe before Prefect starts."""
    assert_refused(thrifty(tmp_path, "run", "--set", "store=st", "--set", "recipe=sys:exit"), "is not a recipe")


def test_a_gcs_bucket_with_a_space_is_refused_at_once(tmp_path, gcs_standin):
    """It used to hang for 90 s+ against the emulator."""
    proc = thrifty(tmp_path, "report", "--set", "store=gs://bucket with space/x", env=gcs_standin.env())
    assert_refused(proc, "'store'", "GCS bucket names")


def test_a_huge_config_in_the_environment_is_refused_briefly(tmp_path):
    """$THRIFTY_RUN_CONFIG (what a node reads) with a 100 KB value and with nesting past the parser's stack."""
    big = '{"run_name": "' + "n" * 100_000 + '"}'
    assert_refused(thrifty(tmp_path, "config", env={"THRIFTY_RUN_CONFIG": big}), "'run_name'", "100,000 characters")
    deep = '{"recipe_params": ' + "[" * 20_000 + "]" * 20_000 + "}"
    assert_refused(thrifty(tmp_path, "config", env={"THRIFTY_RUN_CONFIG": deep}), "nests too deeply")


LONG = "a" * 300
SETTINGS = {  # what is typed after `thrifty config`, what the message says
    "deep --set": (["--set", "train.lr=" + "[" * 100 + "]" * 100], ["override 'train.lr' nests"]),
    "a 5000-digit --set": (["--set", "train.seed=" + "9" * 5000], ["not valid YAML"]),
    "store part over 255 bytes": (["--set", f"store=st/{LONG}/x"], ["'store'", "255 bytes"]),
    "store with a newline": (["--set", 'store="st\\nx"'], ["'store'", "control character"]),
    "S3 bucket Bad_Bucket!": (["--set", "store=s3://Bad_Bucket!/x"], ["'store'", "S3 bucket names"]),
    "Azure container with capitals": (["--set", "store=az://My_Container/x"], ["'store'", "Azure container names"]),
    "prefix with ..": (["--set", "store=s3://bucket/../x"], ["'store'", "'..'"]),
    "lr 1e300": (["--set", "train.lr=1e300"], ["'train'", "lr = 1e+300 is out of range"]),
    "weight decay 1e300": (["--set", "train.weight_decay=1e300"], ["weight_decay", "out of range"]),
    "adam eps 1e300": (["--set", "train.adam_eps=1e300"], ["adam_eps", "out of range"]),
    "grad clip 1e300": (["--set", "train.grad_clip=1e300"], ["grad_clip", "out of range"]),
    "max_steps 2^60": (["--set", "train.max_steps=1152921504606846976"], ["max_steps", "out of range"]),
    "grace 1e300 s": (["--set", "compute.preempt_grace_s=1e300"], ["preempt_grace_s", "out of range"]),
    "budget 1e300": (["--set", "budget.max_usd=1e300"], ["max_usd", "out of range"]),
    "a 100 KB run_name": (["--set", "run_name=" + "n" * 100_000], ["'run_name'", "100,000 characters"]),
    "a 100 KB unknown key": (["--set", "train." + "k" * 100_000 + "=1"], ["not a known setting"]),
    "nested recipe_params": (["--set", "recipe_params={x: " + "[" * 40 + "]" * 40 + "}"], ["nests deeper than"]),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_hostile_settings(monkeypatch, capsys, tmp_path, case):
    typed, fragments = SETTINGS[case]
    assert_refused(refused_here(monkeypatch, capsys, tmp_path, "config", "--set", "store=st", *typed), *fragments)


STORES = {  # stores that no directory can be: what the message says (`thrifty train` used to end in a traceback)
    "/dev/null": "/dev/null is not a directory",
    "/dev/null/x": "/dev/null is not a directory",
    "/proc/self/x": "inside /proc",
}


@pytest.mark.parametrize("store", sorted(STORES))
@pytest.mark.parametrize("command", ["train", "report"])
def test_stores_that_cannot_be(monkeypatch, capsys, tmp_path, command, store):
    assert_refused(refused_here(monkeypatch, capsys, tmp_path, command, "--set", f"store={store}"), STORES[store],
                   "'store'")


@pytest.mark.parametrize("spec", ["antigravity:main", "shutil:rmtree", "json:loads", "os.path:join"])
def test_recipe_specs_naming_library_functions(monkeypatch, capsys, tmp_path, spec):
    proc = refused_here(monkeypatch, capsys, tmp_path, "smoke", "--set", "store=st", "--set", f"recipe={spec}")
    assert_refused(proc, "'recipe'", spec, "is not a recipe" if spec != "os.path:join" else "cannot import module")
    assert "Nothing of it was run" in proc.stderr or spec == "os.path:join"


ARGUMENTS = [
    (["archive", "--store", "st", "restore", "../../../../../.."], ["is not a run id"]),
    (["archive", "--store", "st", "restore", "a/b"], ["is not a run id"]),
    (["archive", "--store", "st", "gold", "../../etc"], ["is not a key prefix", "runs/"]),
    (["archive", "--store", "st", "pin", "runs/../../etc"], ["is not a key prefix"]),
    (["archive", "--store", "st", "gold", "etc/passwd"], ["is not a key prefix"]),
    (["archive", "--store", "/dev/null"], ["/dev/null is not a directory"]),
    (["new", "recipe", "import"], ["'import' is a Python keyword"]),
    (["new", "recipe", "class"], ["'class' is a Python keyword"]),
    (["new", "script", "json"], ["'json' is a module of Python's standard library"]),
    (["new", "recipe", "numpy"], ["'numpy' is an installed package"]),
    (["new", "recipe", "thrifty"], ["'thrifty' is a package of this project"]),
    (["new", "recipe", "_hidden"], ["starting with a letter"]),
    (["new", "recipe", "x" * 70], ["1-60 lower-case letters"]),
    (["new", "recipe", "my_model", "--dir", "afile"], ["pick a writable --dir"]),
    (["archive", "--store", "st", "--as-of", "0001-01-02"], ["between 1970 and 9000"]),
    (["simulate", "--step-s", "1e300", "--save-s", "1", "--steps", "100"], ["--step-s", "at most 1e+09"]),
    (["simulate", "--step-s", "1", "--save-s", "1", "--steps", str(2**60)], ["--steps must be between"]),
    (["prices", "--accelerator", "A" * 100_000], ["no prices for accelerator", "(100,002 characters)"]),
    (["simulate", "--instance", "aws:p3.2xlarge", "--zone", "z" * 100_000, "--preemptions", "shipped", "--step-s", "1",
      "--save-s", "1", "--steps", "10"], ["in zone", "(100,001 characters)"]),
]


@pytest.mark.parametrize("argv, fragments", ARGUMENTS, ids=[" ".join(a)[:50] for a, _ in ARGUMENTS])
def test_hostile_archive_and_scaffold_arguments(monkeypatch, capsys, tmp_path, argv, fragments):
    work = tmp_path / "work"
    (work / "st" / "runs" / "r1").mkdir(parents=True)  # a store with one run: a restore that walks out of it lists /
    (work / "afile").write_text("")
    assert_refused(refused_here(monkeypatch, capsys, tmp_path, *argv), *fragments)


@pytest.mark.parametrize("typed, fragment", [
    (["--step-s", "1e8", "--save-s", "1", "--steps", "100"], "no interval finishes"),  # a step outlives every life
    (["--step-s", "10", "--save-s", "30", "--steps", "1000000"], "instance lives"),  # 116 days: ~1400 preemptions
    (["--step-s", "1", "--save-s", "1", "--steps", "100", "--restart-s", "1e8"], "no interval finishes"),
    (["--step-s", "1", "--save-s", "1e8", "--steps", "100"], "no interval finishes"),
])
def test_simulations_that_would_never_end_are_refused(tmp_path, typed, fragment):
    """Each of these drew instance lives for hours or forever (a step, a save or a restart far longer than any life;
    a run that meets thousands of preemptions in each of 2000 trials)."""
    assert_refused(thrifty(tmp_path, "simulate", "--mtbp-s", "7200", *typed), fragment)


def test_a_restart_no_life_outlasts_ends_a_trial():
    """Lives drawn from traces' quantiles have a top: a restart longer than it never gets going again."""
    from thrifty.spot.simulate import one_run

    wall, _, restarts = one_run(100.0, 10.0, 1.0, 50.0, lambda: 30.0, max_wall_s=1e5)
    assert wall == float("inf") and restarts > 1
