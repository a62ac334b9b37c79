"""Allow-lists for a deployed pool: which recipes and which script-mode commands a run may start on a worker.

Anyone who can fill the ``train`` deployment's form (or call the Prefect API) chooses its RunConfig; a worker
started with ``THRIFTY_ALLOWED_RECIPES`` and/or ``THRIFTY_ALLOWED_COMMANDS`` in its environment refuses (exit 2,
``BadInput``) any other recipe or command before anything of it runs. Unset, anything the checks accept runs.
Torch-free: the flow, the smoke test and the node check the same way.
"""

from __future__ import annotations

import os
import re
import shlex
from fnmatch import fnmatchcase
from typing import Mapping

from thrifty.config import ConfigError
from thrifty.config.echo import shown

ENV_ALLOWED_RECIPES = "THRIFTY_ALLOWED_RECIPES"  # recipe specs or patterns, separated by commas or spaces
ENV_ALLOWED_COMMANDS = "THRIFTY_ALLOWED_COMMANDS"  # script-mode commands or patterns, one per line (or ';'-separated)


def _patterns(environ: Mapping[str, str], name: str, separators: str) -> list[str] | None:
    raw = environ.get(name)
    if raw is None:
        return None
    return [p.strip() for p in re.split(separators, raw) if p.strip()]


def _words(command: str) -> str:
    """A command as its words joined by single spaces: how commands and patterns are compared."""
    try:
        return " ".join(shlex.split(command))
    except ValueError:
        return command.strip()


def check_recipe_allowed(spec: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError unless ``$THRIFTY_ALLOWED_RECIPES`` is unset or one of its patterns (shell-style: ``*``
    matches any text) matches the recipe spec as written, e.g. ``digits``, ``script``, ``my_model.recipe:recipe``,
    ``my_model.*``."""
    allowed = _patterns(os.environ if environ is None else environ, ENV_ALLOWED_RECIPES, r"[,\s]+")
    if allowed is not None and not any(fnmatchcase(spec, p) for p in allowed):
        raise ConfigError(f"'recipe': {shown(spec)} is not allowed on this worker (${ENV_ALLOWED_RECIPES} allows "
                          f"{', '.join(allowed) or 'none'}); pick one of those, or ask who runs the pool to add it")


def check_command_allowed(command: str, env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError unless ``$THRIFTY_ALLOWED_COMMANDS`` is unset or one of its patterns matches the script-mode
    command (both compared word by word; ``*`` matches any text, spaces included: ``python train.py *`` allows any
    arguments to train.py). Under an allow-list ``recipe_params.env`` must be empty: a variable such as LD_PRELOAD
    or PYTHONSTARTUP would run other code than the command allowed."""
    allowed = _patterns(os.environ if environ is None else environ, ENV_ALLOWED_COMMANDS, r"[\n;]+")
    if allowed is None:
        return
    if not any(fnmatchcase(_words(command), _words(p)) for p in allowed):
        raise ConfigError(f"'recipe_params.command': {shown(command)} is not allowed on this worker "
                          f"(${ENV_ALLOWED_COMMANDS} allows: {'; '.join(allowed) or 'none'}); use one of those, or ask "
                          "who runs the pool to add it")
    if env:
        raise ConfigError(f"'recipe_params.env': this worker allows only listed commands (${ENV_ALLOWED_COMMANDS}), "
                          f"and environment variables ({', '.join(sorted(env))}) could change what they run; remove "
                          "them and set what the command needs in the worker's environment")
