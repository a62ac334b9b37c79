"""Where a RunConfig comes from: a YAML or JSON file, ``$THRIFTY_RUN_CONFIG`` on a node, ``--set`` overrides."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from thrifty.config.base import ConfigError
from thrifty.config.echo import MAX_CONFIG_BYTES, check_plain, cut, shown
from thrifty.config.run import RunConfig, build_config
from thrifty.protocol import ENV_CONFIG as ENV_VAR  # the RunConfig as JSON, in the environment of a training node

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # YAML 1.1 reads 3e-4 as a string


def parse_override(item: str) -> tuple[list[str], Any]:
    """``train.lr=3e-4`` -> (['train', 'lr'], 0.0003); the value is read as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {shown(item)} must look like section.key=value, e.g. train.lr=0.0003")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {shown(item)} has no key before '='")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        raise ConfigError(f"override {shown(item)}: value is not valid YAML ({cut(str(exc), 300)})") from None
    except RecursionError:
        raise ConfigError(f"override {shown(key.strip())}: its value nests too deeply; give a plain value") from None
    check_plain(value, f"override {shown(key.strip())}")
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 3e-4 as a string
    elif not isinstance(value, (str, int, float, bool, list, dict, type(None))):
        value = raw  # dates and other YAML types: keep the text as given (run_name=2024-06-01)
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for p in path[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {shown(item)}: {shown(p)} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    name = shown(str(p))
    try:
        if not p.is_file():
            raise ConfigError(f"config file {name} does not exist; pass --config with a YAML or JSON RunConfig")
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {name} cannot be read ({exc.strerror}); check the path") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {name} is over {MAX_CONFIG_BYTES >> 20} MiB; a RunConfig is a few KB of "
                          "settings: check that --config names the right file")
    kind = "YAML" if p.suffix != ".json" else "JSON"
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (some Windows editors write one) is not part of it
    except UnicodeDecodeError:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise ConfigError(f"config file {name} is not UTF-8 text" + (" (it is UTF-16)" if utf16 else "") +
                          f"; save it as UTF-8 {kind}") from None
    try:
        if not text.strip():
            data = None
        else:
            data = yaml.safe_load(text) if p.suffix in (".yaml", ".yml") else json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: JSON's own, or an integer of more than 4300 digits
        raise ConfigError(f"config file {name} is not valid {kind}: {cut(str(exc), 400)}") from None
    except RecursionError:
        raise ConfigError(f"config file {name} nests too deeply to read; a config is a few levels of settings") from None
    check_plain(data, f"config file {name}")
    if data is None:  # an empty file, YAML or JSON alike, means every default (a local run: nothing is rented)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {name} must hold a mapping of settings at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a RunConfig from a YAML/JSON file (or defaults) and apply ``section.key=value`` overrides."""
    data = read_config_file(path) if path else {}
    data = apply_overrides(data, overrides or [])
    return build_config(data, source=str(path) if path else "defaults")


def config_from_env(environ: Mapping[str, str]) -> RunConfig | None:
    """``$THRIFTY_RUN_CONFIG``: the RunConfig as JSON (what a launcher gives a node) or, for running a script by
    hand, the path of a YAML or JSON config file."""
    raw = environ.get(ENV_VAR)
    if not raw:
        return None
    if not raw.lstrip().startswith("{"):
        try:
            is_file = Path(raw).is_file()
        except (OSError, ValueError):  # a name too long for a path, a NUL in it
            is_file = False
        if is_file:
            return load_config(raw)
        raise ConfigError(f"${ENV_VAR} is neither a RunConfig as JSON nor the path of a config file: {shown(raw)}")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"${ENV_VAR} is not valid JSON: {cut(str(exc), 400)}") from None
    except RecursionError:
        raise ConfigError(f"${ENV_VAR} nests too deeply to read") from None
    check_plain(data, f"${ENV_VAR}")
    return build_config(data, source=f"${ENV_VAR}")


def resolve_config(path: str | Path | None, overrides: list[str], environ: dict[str, str]) -> RunConfig:
    """What every command trains: the file given, else ``$THRIFTY_RUN_CONFIG`` (a node), else the defaults;
    then the ``section.key=value`` overrides, validated together."""
    if path:
        return load_config(path, overrides)
    from_env = config_from_env(environ)
    if from_env is None:
        return load_config(None, overrides)
    if not overrides:
        return from_env
    return build_config(apply_overrides(from_env.model_dump(mode="json"), overrides), f"${ENV_VAR} with overrides")


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.key=value``: how every command takes a RunConfig."""
    parser.add_argument("--config", "-c", help=f"RunConfig file (YAML or JSON); default: ${ENV_VAR} or defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting, e.g. --set train.lr=3e-4 (repeatable)")


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> RunConfig:
    return resolve_config(args.config, args.overrides, environ)


def script_config(config: "str | Path | RunConfig | None", environ: Mapping[str, str] | None = None,
                  argv: list[str] | None = None) -> RunConfig:
    """The RunConfig a script's ``thrifty.session.init(config)`` runs under: ``config`` itself (a RunConfig or a
    file's path), else ``$THRIFTY_RUN_CONFIG`` (JSON on a node, or a file's path), else ``--config FILE`` on the
    script's command line."""
    if isinstance(config, RunConfig):
        return config
    if config is not None:
        return load_config(config)
    from_env = config_from_env(os.environ if environ is None else environ)
    if from_env is not None:
        return from_env
    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            return load_config(argv[i + 1])
        if arg.startswith("--config="):
            return load_config(arg.split("=", 1)[1])
    raise ConfigError("thrifty.session.init() found no RunConfig: run the script through `thrifty run` / `thrifty "
                      "train` (they set $THRIFTY_RUN_CONFIG), set THRIFTY_RUN_CONFIG=run.yaml, pass --config FILE, "
                      "or call init('run.yaml')")
