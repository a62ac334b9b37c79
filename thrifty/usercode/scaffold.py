"""``thrifty new recipe NAME`` and ``thrifty new script NAME``: a working, tested start for your own model.

``recipe`` writes a recipe package (Thrifty's loop trains it); ``script`` writes a plain PyTorch
training script that uses ``thrifty.session`` (your loop, Thrifty's checkpoints, stops and budget).

The files are templates with the name filled in. Nothing is overwritten: a file that exists
stops the command before anything is written, naming it.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path

from thrifty.config import ConfigError
from thrifty.config.echo import shown

RECIPE_MODULE = '''\
"""{name}: your own model on Thrifty. Start from this file; `thrifty smoke --config {name}.yaml` checks it on CPU.

Data: a .npz file with arrays ``x`` (features, float32) and ``y`` (int64 class ids) when
``recipe_params.data_path`` is set, else scikit-learn's digits so the template runs as it is.
Everything ``preprocess`` returns is cached in the store; the cache key hashes the raw data
(``fingerprint_raw``), the source of ``preprocess`` and of the helpers it calls, and the params.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from training.recipes import Dataset, Ratio, Recipe, RecipeParams, StepOutput


class Params(RecipeParams):
    """The recipe's options: `recipe_params` in the run config, checked before anything runs."""

    data_path: str | None = Field(None, description="A .npz file with arrays x and y; null = scikit-learn's digits.")
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of examples held out for validation.")
    hidden: int = Field(128, ge=1, description="Hidden units of the MLP.")
    split_seed: int = Field(0, ge=0, description="Seed of the train/validation split.")


def _raw_bytes(params: Params) -> bytes:
    if params.data_path:
        return Path(params.data_path).read_bytes()
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x.tobytes() + y.tobytes()


def fingerprint_raw(params: Params) -> str:
    """A hash of the raw data's content: new data, new cache entry."""
    return hashlib.sha256(_raw_bytes(params)).hexdigest()


def _load(params: Params) -> tuple[np.ndarray, np.ndarray]:
    if params.data_path:
        with np.load(params.data_path) as data:
            return data["x"], data["y"]
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


def preprocess(params: Params) -> Dataset:
    """Raw data -> named arrays per split. Models compute in float32 and cross_entropy wants int64 labels."""
    x, y = _load(params)
    order = np.random.default_rng(params.split_seed).permutation(len(x))
    n_val = max(1, int(len(x) * params.val_fraction))
    val, train = order[:n_val], order[n_val:]
    return Dataset(
        splits={
            "train": {"x": x[train].astype(np.float32), "y": y[train].astype(np.int64)},
            "val": {"x": x[val].astype(np.float32), "y": y[val].astype(np.int64)},
        },
        meta={"features": int(x.shape[1]), "classes": int(y.max()) + 1},
    )


def build_model(params: Params, meta: dict[str, Any]) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(meta["features"], params.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(params.hidden, meta["classes"]),
    )


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: str) -> StepOutput:
    """One batch: its mean loss (backpropagated when mode is "train"), its size, and metric numerators."""
    logits = model(batch["x"])
    loss = F.cross_entropy(logits.float(), batch["y"])
    correct = (logits.argmax(dim=-1) == batch["y"]).sum().item()
    return StepOutput(loss=loss, count=len(batch["y"]), sums={"correct": float(correct)})


# `-> Recipe` declares this function the recipe `recipe: {name}.recipe:recipe` names: Thrifty reads it before
# importing this module and calls no function that is not declared so.
def recipe() -> Recipe:
    return Recipe(
        name="{name}",
        params_model=Params,
        fingerprint_raw=fingerprint_raw,
        preprocess=preprocess,
        build_model=build_model,
        step=step,
        metrics={"accuracy": Ratio("correct")},  # reported as val_accuracy
        # optimizer=..., scheduler=..., transform=..., eval_splits=("val", "test"): see the README
    )
'''

RECIPE_CONFIG = '''\
# `thrifty run --config {name}.yaml` trains it: preprocess (cached), smoke test, launch, report.
run_name: {name}-v1
recipe: {name}.recipe:recipe     # importable from this directory (and on a node, from compute.workdir)
recipe_params:
  hidden: 128
train:
  max_epochs: 10
  micro_batch: 64
  lr: 0.002
  early_stopping: {metric: val_accuracy, mode: max, patience: 3}
compute:
  launcher: local                # skypilot for real spot GPUs (store must then be s3://, gs:// or az://)
budget:
  max_usd: 1.0
'''

RECIPE_TEST = '''\
"""The {name} recipe passes Thrifty's CPU smoke test: run `python -m pytest {test_path}`."""

from pathlib import Path

from thrifty.config import build_config
from training.smoke import smoke_test


def test_{name}_smoke(tmp_path: Path) -> None:
    cfg = build_config({"run_name": "smoke", "recipe": "{name}.recipe:recipe", "store": str(tmp_path / "store"),
                        "train": {"early_stopping": {"metric": "val_accuracy", "mode": "max"}}})
    result = smoke_test(cfg)
    assert "val_accuracy" in result.metrics_checked
    assert result.losses[-1] < result.losses[0] * 1.5  # it trains without blowing up
'''


SCRIPT = '''\
"""{name}: your own PyTorch training loop under Thrifty (script mode). `thrifty smoke --config {name}.yaml` checks it.

Five session calls make it spot-safe: init, load_latest, log, save, should_stop (and sess.stopped after the
loop: a stopped run resumes later, so it skips what needs the trained model). Resume is
bit-exact: the session restores the RNG streams with the checkpoint, and batch_indices is a pure
function of the step. Replace the data and the model with yours; keep the five calls.
"""

import torch
from sklearn.datasets import load_digits

from thrifty import session

EPOCHS, BATCH, LR = 10, 32, 1e-3

x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
n_train = int(0.8 * len(x))
x_train, y_train, x_val, y_val = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
steps_per_epoch = n_train // BATCH

sess = session.init(total_steps=EPOCHS * steps_per_epoch)  # tells the budget gate the run's length
sess.seed()  # train.seed: the same weights and dropout on every attempt
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(model.parameters(), lr=LR)

step = 0
resumed = sess.load_latest()  # the newest complete checkpoint of this run, or None
if resumed is not None:
    step, state = resumed
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])

while step < sess.total_steps:
    idx = torch.from_numpy(sess.batch_indices(step, n_train, BATCH))
    loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    sess.log(step, loss=loss.item())
    if step % steps_per_epoch == 0:  # early stopping watches what you log under train.early_stopping.metric
        with torch.no_grad():
            val_loss = torch.nn.functional.cross_entropy(model(x_val), y_val).item()
        sess.log(step, val_loss=val_loss)
    stop = sess.should_stop()  # a spot notice, the budget cap, early stopping, the smoke test's limit: once a step
    if stop or sess.should_save(step) or step == sess.total_steps:
        sess.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
    if stop:
        break

if sess.stopped:  # a spot notice or the budget cap: the checkpoint is saved and the job resumes from it; end here
    raise SystemExit(0)
# the run is finished (or stopped early): what needs the trained model goes here (a test set, an export)
'''

SCRIPT_CONFIG = '''\
# `thrifty run --config {name}.yaml` runs {name}/train.py under the pipeline: smoke test, budget gate, launch, report.
run_name: {name}-v1
recipe: script
recipe_params:
  command: python {name}/train.py   # run from this directory (on a node: compute.workdir)
train:
  checkpoint_every: 50             # what sess.should_save(step) follows
  early_stopping: {metric: val_loss, mode: min, patience: 3}
compute:
  launcher: local                  # skypilot for real spot GPUs (store must then be s3://, gs:// or az://)
  emulate: aws:g5.xlarge           # the local launcher bills at this instance's spot price
  # rehearse a spot preemption on this machine: SIGTERM at step 100, a checkpoint, the job resumes from it
  # preempt_after_steps: 100
budget:
  max_usd: 1.0
'''

SCRIPT_TEST = '''\
"""{name}/train.py passes Thrifty's CPU smoke test (it logs, saves and resumes): `python -m pytest {test_path}`."""

from pathlib import Path

from thrifty.config import build_config
from training.smoke import smoke_test


def test_{name}_smoke(tmp_path: Path) -> None:
    cfg = build_config({"run_name": "smoke", "recipe": "script", "store": str(tmp_path / "store"),
                        "recipe_params": {"command": "python {name}/train.py"}})
    result = smoke_test(cfg)
    assert result.total_steps and result.cpu_step_time_s > 0
'''


def new_script(name: str, where: Path) -> list[Path]:
    """Write ``<where>/<name>/train.py``, ``<where>/<name>.yaml`` and ``<where>/tests/test_<name>.py``."""
    _check_name(name, where)
    test_path = Path("tests") / f"test_{name}.py"
    return _write(where, {
        Path(name) / "train.py": _fill(SCRIPT, name=name),
        Path(f"{name}.yaml"): _fill(SCRIPT_CONFIG, name=name),
        test_path: _fill(SCRIPT_TEST, name=name, test_path=test_path.as_posix()),
    })


OURS = {"thrifty", "training", "tasks", "flows", "deployments", "tests", "examples", "bench"}  # this project's own


def _installed_elsewhere(name: str, where: Path) -> bool:
    """A module ``name`` is importable from somewhere else than ``where`` (where a package of that name is the user's
    own, which the existing-file check covers)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    places = [Path(p) for p in (spec.submodule_search_locations or [])] or [Path(spec.origin or "")]
    return not all(p.resolve().is_relative_to(where.resolve()) for p in places)


def _check_name(name: str, where: Path) -> None:
    """A name that makes an importable package of its own (and a valid run_name, ``NAME-v1``), or a ConfigError."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,59}", name):
        raise ConfigError(f"name {shown(name)} must be a Python package name: 1-60 lower-case letters, digits and "
                          "'_', starting with a letter (e.g. 'my_model')")
    why = ("a Python keyword" if keyword.iskeyword(name) else
           "a module of Python's standard library" if name in sys.stdlib_module_names else
           "a package of this project" if name in OURS else
           "an installed package" if _installed_elsewhere(name, where) else None)
    if why:
        raise ConfigError(f"name {name!r} is {why}: a package of that name could not be imported as yours (or would "
                          f"hide it); pick another, e.g. 'my_{name}'")


def new_recipe(name: str, where: Path) -> list[Path]:
    """Write the package ``<where>/<name>/``, ``<where>/<name>.yaml`` and ``<where>/tests/test_<name>.py``."""
    _check_name(name, where)
    test_path = Path("tests") / f"test_{name}.py"
    files = {
        Path(name) / "__init__.py": f'"""{name}: a Thrifty recipe package."""\n',
        Path(name) / "recipe.py": _fill(RECIPE_MODULE, name=name),
        Path(f"{name}.yaml"): _fill(RECIPE_CONFIG, name=name),
        test_path: _fill(RECIPE_TEST, name=name, test_path=test_path.as_posix()),
    }
    return _write(where, files)


def _fill(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _write(where: Path, files: dict[Path, str]) -> list[Path]:
    existing = [str(where / p) for p in files if (where / p).exists()]
    if existing:
        raise ConfigError(f"not writing over existing file(s): {', '.join(existing)}; pick another name or directory")
    written: list[Path] = []
    try:
        for rel, text in files.items():
            path = where / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    except OSError as exc:  # a --dir that is a file or read-only: take back what was written, say why
        for path in written:
            path.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {shown(str(where / rel))} ({exc.strerror}); pick a writable --dir") from None
    return written
