"""`thrifty new recipe|script NAME`: the templates a new user starts from work as written; nothing is overwritten."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, python_env
import pytest

from thrifty.cli import main


@pytest.mark.parametrize("kind,files", [
    ("recipe", {"acme/__init__.py", "acme/recipe.py", "acme.yaml", "tests/test_acme.py"}),
    ("script", {"acme/train.py", "acme.yaml", "tests/test_acme.py"}),
])
def test_new_template_passes_its_own_smoke_test(tmp_path: Path, capsys, kind: str, files: set[str]) -> None:
    assert main(["new", kind, "acme", "--dir", str(tmp_path)]) == 0
    assert "python -m pytest tests/test_acme.py" in capsys.readouterr().out
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()} == files
    # the user's own pytest run, from their project directory: the package imports because thrifty adds the cwd
    # (recipe), the command runs from there (script)
    done = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_acme.py"],
                          cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_new_recipe_never_overwrites_and_wants_a_package_name(tmp_path: Path, capsys) -> None:
    (tmp_path / "acme.yaml").write_text("mine\n")
    assert main(["new", "recipe", "acme", "--dir", str(tmp_path)]) == 2
    assert "not writing over existing file(s)" in capsys.readouterr().err
    assert (tmp_path / "acme.yaml").read_text() == "mine\n" and not (tmp_path / "acme").exists()
    assert main(["new", "recipe", "My-Model", "--dir", str(tmp_path)]) == 2
    assert "must be a Python package name" in capsys.readouterr().err


def test_new_script_shows_how_to_rehearse_a_preemption_and_how_to_end_after_a_stop(tmp_path: Path, capsys) -> None:
    from thrifty.config import load_config

    assert main(["new", "script", "acme", "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "acme.yaml").read_text()
    assert "# preempt_after_steps: 100" in text and "emulate: aws:g5.xlarge" in text
    rehearsal = tmp_path / "rehearse.yaml"
    rehearsal.write_text(text.replace("# preempt_after_steps: 100", "preempt_after_steps: 100"))
    cfg = load_config(rehearsal)  # uncommented, it is a valid setting of the local launcher
    assert cfg.compute.preempt_after_steps == 100 and cfg.compute.emulate == "aws:g5.xlarge"
    assert "if sess.stopped:" in (tmp_path / "acme" / "train.py").read_text()
