"""A recipe spec runs nothing but a recipe factory (issue 21.5): what a RunConfig names is checked in the module's
source before the module is imported, and the function object before it is called; a worker's allow-lists refuse
other recipes and script commands before anything of them runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from thrifty.config import ConfigError, build_config
from thrifty.usercode.allow import ENV_ALLOWED_COMMANDS, ENV_ALLOWED_RECIPES
from training.recipes import Recipe, resolve_recipe
from training.validate import check_config

SIDE_EFFECT = "import pathlib, os; pathlib.Path(os.environ['THRIFTY_TEST_TOUCHED']).joinpath('{what}').touch()\n"


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """Write a package of the user's under tmp_path (importable); ``touched`` lists the side effects that ran."""
    root = tmp_path / "code"
    touched = tmp_path / "touched"
    touched.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("THRIFTY_TEST_TOUCHED", str(touched))

    def write(name: str, files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    write.touched = lambda: sorted(p.name for p in touched.iterdir())  # type: ignore[attr-defined]
    return write


DIGITS = ("from __future__ import annotations\nfrom training.recipes import Recipe\n"
          "from training.recipes.digits import recipe as digits\n")


def test_a_declared_factory_works_directly_and_re_exported(pkg):
    pkg("mine", {"__init__.py": "from .impl import recipe as exported\n",
                 "impl.py": DIGITS + "\ndef recipe() -> Recipe:\n    return digits()\n",
                 "quoted.py": "import training.recipes\nfrom training.recipes.digits import recipe as digits\n"
                              "\ndef make() -> 'training.recipes.Recipe':\n    return digits()\n"})
    for spec in ("mine.impl:recipe", "mine:exported", "mine.quoted:make"):
        assert isinstance(resolve_recipe(spec), Recipe), spec


@pytest.mark.parametrize("body, why", [
    ("def recipe():\n    return digits()\n", "does not declare that it returns a Recipe"),
    ("def recipe() -> object:\n    return digits()\n", "does not declare that it returns a Recipe"),
    ("recipe = digits\n", "defines no function 'recipe'"),
    ("class recipe:\n    pass\n", "defines no function 'recipe'"),
])
def test_undeclared_specs_are_refused_without_importing_their_module(pkg, body, why):
    pkg("undeclared", {"__init__.py": "", "m.py": DIGITS + SIDE_EFFECT.format(what="imported") + body})
    with pytest.raises(ConfigError, match=why) as exc:
        resolve_recipe("undeclared.m:recipe")
    assert "def recipe() -> Recipe" in str(exc.value), "the error says how to declare one"
    assert pkg.touched() == [], "the module was imported"


@pytest.mark.parametrize("body, why", [
    # the source says `-> Recipe`, but the name is another class: imported, never called
    ("class Recipe:\n    pass\n\ndef recipe() -> Recipe:\n" + "    " + SIDE_EFFECT.format(what="called"),
     "not a recipe once imported"),
    # declared, then the name is rebound to a library function
    (DIGITS + "import shutil\n\ndef recipe() -> Recipe:\n    return digits()\n\nrecipe = shutil.rmtree\n",
     "not a recipe once imported"),
    # a factory that needs arguments cannot be one
    (DIGITS + "\ndef recipe(path) -> Recipe:\n" + "    " + SIDE_EFFECT.format(what="called"),
     "not a recipe once imported"),
])
def test_a_factory_is_checked_again_once_imported_before_it_is_called(pkg, body, why):
    pkg("looks", {"__init__.py": "", "m.py": body})
    with pytest.raises(ConfigError, match=why):
        resolve_recipe("looks.m:recipe")
    assert "called" not in pkg.touched()


def test_a_module_that_exits_on_import_is_a_config_error(pkg):
    pkg("exits", {"__init__.py": "", "m.py": DIGITS + "import sys\nsys.exit(0)\n\ndef recipe() -> Recipe:\n"
                                                      "    return digits()\n"})
    with pytest.raises(ConfigError, match="importing module 'exits.m'.*SystemExit"):
        resolve_recipe("exits.m:recipe")


def test_the_scaffolds_recipe_is_declared(tmp_path, monkeypatch):
    from thrifty.usercode.scaffold import new_recipe

    new_recipe("my_model", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_recipe("my_model.recipe:recipe").name == "my_model"


# ---------------------------------------------------------------------------------------- a deployed pool's lists


def cfg(tmp_path: Path, **changes):
    return build_config({"run_name": "allow", "store": str(tmp_path / "store"), **changes})


def test_allowed_recipes(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_ALLOWED_RECIPES, "digits, training.recipes.*")
    check_config(cfg(tmp_path))
    check_config(cfg(tmp_path, recipe="training.recipes.synthetic:recipe"))
    for recipe in ("codelm", "script", "tests_pkg.m:recipe"):
        with pytest.raises(ConfigError, match=f"{ENV_ALLOWED_RECIPES} allows digits, training.recipes"):
            check_config(cfg(tmp_path, recipe=recipe, recipe_params={"command": "python train.py"}
                             if recipe == "script" else {}))
    monkeypatch.setenv(ENV_ALLOWED_RECIPES, "")
    with pytest.raises(ConfigError, match="allows none"):
        check_config(cfg(tmp_path))


def test_allowed_commands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "other.py").write_text("print('hi')\n")
    script = {"recipe": "script", "recipe_params": {"command": "python train.py --lr 3e-4"}}
    monkeypatch.setenv(ENV_ALLOWED_COMMANDS, "python train.py *\nbash run.sh")
    check_config(cfg(tmp_path, **script))
    for command in ("python other.py", "python -c 'import os; os.abort()'", "python train.py.evil"):
        with pytest.raises(ConfigError, match="'recipe_params.command'.*is not allowed on this worker"):
            check_config(cfg(tmp_path, recipe="script", recipe_params={"command": command}))
    with pytest.raises(ConfigError, match="'recipe_params.env'.*LD_PRELOAD"):
        check_config(cfg(tmp_path, recipe="script", recipe_params={**script["recipe_params"],
                                                                   "env": {"LD_PRELOAD": "/tmp/x.so"}}))
    monkeypatch.delenv(ENV_ALLOWED_COMMANDS)
    check_config(cfg(tmp_path, recipe="script", recipe_params={"command": "python other.py"}))


def test_a_form_that_names_a_library_function_ends_bad_input_and_runs_it_not(prefect_harness, tmp_path, monkeypatch):
    """Through the flow (what the deployment's form starts): `tempfile:mkdtemp` made a directory before it was
    refused; now the run ends BadInput and TMPDIR stays empty."""
    import tempfile

    from flows.train_pipeline import train_pipeline

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    state = train_pipeline(cfg(tmp_path, recipe="tempfile:mkdtemp"), return_state=True)
    assert state.is_failed() and state.name == "BadInput", state
    assert "'tempfile:mkdtemp' is not a recipe" in state.message
    assert os.listdir(tmp) == []
