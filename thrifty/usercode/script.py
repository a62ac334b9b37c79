"""Script mode (``recipe: script``): the user's own training command under the same pipeline. Torch-free.

``recipe_params`` holds :class:`ScriptParams` (the command, the smoke test's step limit, ...). This
module validates them before anything is rented (an empty command, an executable or a script file
that cannot be found), says how the command is started, and defines what the wrapper
(``training.script``) and the session inside the script (``training.session``) tell each other: a
small status file (:class:`SessionStatus`) whose path is in ``$THRIFTY_SESSION_STATUS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from thrifty.config import ConfigError, RunConfig
from thrifty.storage import atomic_write_bytes
from thrifty.usercode.allow import check_command_allowed, check_recipe_allowed

SCRIPT_RECIPE = "script"  # the built-in recipe name that selects script mode
ENV_STATUS = "THRIFTY_SESSION_STATUS"  # where the session writes its SessionStatus (the wrapper reads it)
ENV_STEP_LIMIT = "THRIFTY_STEP_LIMIT"  # the smoke test's step limit: the session's should_stop() enforces it
PYTHON_NAMES = {"python", "python3", f"python3.{sys.version_info.minor}"}  # run by this interpreter


class ScriptParams(BaseModel):
    """``recipe_params`` of ``recipe: script``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    command: str = Field(description="The training command, shell-split, e.g. 'python train.py --lr 3e-4'. "
                                     "'python' is the interpreter that runs thrifty.")
    smoke_steps: int = Field(3, ge=1, le=1000, description="Steps the CPU smoke test runs the command for (steps).")
    smoke_timeout_s: float = Field(300.0, gt=0.0, description="The smoke test fails a command slower than this (s).")
    total_steps: int | None = Field(None, ge=1, description="The run's optimizer steps, when the script does not "
                                                            "report them (sess.log(step, total_steps=N)) (steps).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the command.")

    @field_validator("command")
    @classmethod
    def _split(cls, v: str) -> str:
        try:
            argv = shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"cannot be split like a shell command ({exc})") from None
        if not argv:
            raise ValueError("is empty; give the command that trains, e.g. 'python train.py'")
        return v

    def argv(self) -> list[str]:
        """The command as started: 'python' becomes this interpreter (the one with thrifty and torch installed)."""
        argv = shlex.split(self.command)
        if argv[0] in PYTHON_NAMES:
            argv[0] = sys.executable
        return argv


def is_script(cfg: RunConfig) -> bool:
    return cfg.recipe == SCRIPT_RECIPE


def script_params(cfg: RunConfig) -> ScriptParams:
    """The script's options, or a ConfigError naming each bad one."""
    try:
        return ScriptParams.model_validate(cfg.recipe_params)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = "recipe_params." + ".".join(str(p) for p in e["loc"])
            if e["type"] == "missing":
                msg = "is required: the command that trains, e.g. 'python train.py --lr 3e-4'"
            elif e["type"] == "extra_forbidden":
                msg = "is not an option of script mode (remove it)"
            else:
                msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"'{loc}' {msg}")
        raise ConfigError("Invalid recipe_params for recipe 'script': " + "; ".join(parts) +
                          f". Options: {', '.join(ScriptParams.model_fields)}.") from None


def check_script(cfg: RunConfig, cwd: Path | None = None) -> ScriptParams:
    """Everything about the command that can be known before it runs: its options, the executable, the script
    file or module, and that a cloud node will find it. Raises ConfigError saying what to change."""
    check_recipe_allowed(SCRIPT_RECIPE)
    params = script_params(cfg)
    check_command_allowed(params.command, params.env)  # a deployed pool's allow-list, before anything of it runs
    cwd = Path.cwd() if cwd is None else cwd
    argv = params.argv()
    exe = argv[0]
    if os.sep in exe:
        path = cwd / exe
        if not path.is_file():
            raise ConfigError(f"'recipe_params.command': {exe!r} does not exist (relative to {cwd}); fix the path")
        if not os.access(path, os.X_OK):
            raise ConfigError(f"'recipe_params.command': {exe!r} is not executable; chmod +x it or start it "
                              f"with its interpreter, e.g. 'bash {exe}'")
    elif shutil.which(exe) is None:
        raise ConfigError(f"'recipe_params.command': the executable {exe!r} is not on PATH; install it or give "
                          "its path")
    if Path(exe).name.startswith("python") or exe == sys.executable:
        _check_python_target(argv[1:], cwd)
    if cfg.compute.num_nodes > 1:
        raise ConfigError("'compute.num_nodes': script mode runs the command on one node; set it to 1 (a "
                          "multi-GPU script can start torchrun itself in its command)")
    if cfg.compute.launcher == "skypilot" and Path(cfg.compute.workdir).resolve() != cwd.resolve():
        raise ConfigError(f"'compute.workdir': script mode runs the command from the synced workdir, so paths in it "
                          f"are relative to it; run thrifty from {cfg.compute.workdir!r} and set compute.workdir to "
                          "'.' (the directory synced to the node)")
    return params


def _check_python_target(args: list[str], cwd: Path) -> None:
    """``python train.py ...`` needs train.py; ``python -m pkg.mod`` needs the module."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-c":
            return
        if a == "-m":
            if i + 1 >= len(args):
                raise ConfigError("'recipe_params.command': '-m' needs a module name after it")
            module = args[i + 1]
            local = cwd.joinpath(*module.split("."))
            found = local.with_suffix(".py").is_file() or (local / "__main__.py").is_file()
            if not found:
                try:
                    found = importlib.util.find_spec(module) is not None
                except (ImportError, ValueError):
                    found = False
            if not found:
                raise ConfigError(f"'recipe_params.command': module {module!r} cannot be found from {cwd} or the "
                                  "installed packages; fix its name or run thrifty from the directory that holds it")
            return
        if a.startswith("-"):
            i += 2 if a in ("-W", "-X") else 1
            continue
        if not (cwd / a).is_file():
            raise ConfigError(f"'recipe_params.command': the script {a!r} does not exist (relative to {cwd}); fix "
                              "the path or run thrifty from the directory that holds it")
        return
    raise ConfigError("'recipe_params.command': python is given no script to run; add it, e.g. 'python train.py'")


def script_total_steps(cfg: RunConfig, reported: int | None) -> int:
    """The run's total optimizer steps for the budget gate: what the script reported in the smoke test, else
    ``recipe_params.total_steps``, capped by ``train.max_steps`` (which alone also serves); else a ConfigError."""
    params = script_params(cfg)
    known = [n for n in (reported or params.total_steps, cfg.train.max_steps) if n]
    if not known:
        raise ConfigError(
            "script mode cannot price the run: it does not know how many steps the script trains. Report them from "
            "the script (sess.log(step, total_steps=N) or session.init(total_steps=N)), or set "
            "recipe_params.total_steps or train.max_steps.")
    return min(known)


class SessionStatus(BaseModel):
    """What the session in the script tells the wrapper that started it (``$THRIFTY_SESSION_STATUS``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pid: int = 0
    closed: bool = False  # the session ended (normally or not); else the script died under it
    step: int = 0  # the newest step logged or loaded
    first_logged_step: int | None = None
    logs: int = 0
    saves: int = 0
    loaded_step: int | None = None  # the checkpoint load_latest() resumed from
    last_saved_step: int | None = None
    total_steps: int | None = None  # as the script reported it, or the session knew it
    step_times_s: list[float] = Field(default_factory=list)  # recent seconds per step, from the logged steps
    losses: list[float] = Field(default_factory=list)  # the first logged losses
    ended: str = ""  # completed | stopped_early | interrupted | budget | crashed | no_checkpoint | unsaved | diverged
    exit_code: int | None = None  # the exit the session's verdict asks for (None: the process's own)
    message: str = ""
    error: str = ""  # the uncaught error the script crashed with: "Type: first line" (the launchers compare them)
    parameters: int | None = None  # the script's model, as it told (sess.describe; the Lightning callback does)
    examples_per_step: int | None = None  # examples one optimizer step trains on, as it told

    def write(self, path: str | Path) -> None:
        atomic_write_bytes(Path(path), self.model_dump_json().encode())

    def logged(self, step: int, step_time_s: float | None, loss: float | None,
               total_steps: int | None) -> "SessionStatus":
        """This status once ``step`` is logged: the step time when it advanced (the last 50 kept), the first 20
        losses (the smoke test shows them)."""
        times = (list(self.step_times_s) + ([round(step_time_s, 6)] if step_time_s is not None else []))[-50:]
        first = self.first_logged_step if self.first_logged_step is not None else step
        losses = self.losses + ([round(loss, 6)] if loss is not None and len(self.losses) < 20 else [])
        return self.model_copy(update={"logs": self.logs + 1, "step": step, "first_logged_step": first,
                                       "step_times_s": times, "losses": losses, "total_steps": total_steps})

    @classmethod
    def read(cls, path: str | Path) -> "SessionStatus | None":
        try:
            return cls.model_validate(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            return None
