"""Fleet defaults: settings an MLOps team sets once, for every run, in the environment of its workers and nodes.

``THRIFTY_PRECISION`` fills ``train.precision`` and ``THRIFTY_COMPILE`` fills ``train.compile`` where the run's
config does not write them; a value written in the config wins. They are read once, where the run is resolved
before anything is rented (the flow, ``thrifty train``): a bad value is a ConfigError naming the variable, and the
node is handed the resolved config with every setting written, so its own environment can never change them. Where
each setting came from ("config", "environment THRIFTY_PRECISION", "default") travels beside the config, in
``$THRIFTY_SETTING_SOURCES``, into the run's summary.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, get_args

from thrifty.config.base import ConfigError, shown
from thrifty.config.sections import TrainConfig

FLEET_VARS = {"precision": "THRIFTY_PRECISION", "compile": "THRIFTY_COMPILE"}  # train field -> its variable
ENV_SOURCES = "THRIFTY_SETTING_SOURCES"  # on a node: JSON {field: where it came from}, from the flow's resolution
CONFIG, DEFAULT = "config", "default"


def allowed(field: str) -> tuple[str, ...]:
    """The values ``train.<field>`` accepts (its Literal's choices)."""
    return get_args(TrainConfig.model_fields[field].annotation)


def fleet_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The fleet variables set in ``environ``, validated: {train field: value}. An empty variable is unset (a
    manifest that templates it to ""); anything else outside the field's choices is a ConfigError."""
    out = {}
    for field, var in FLEET_VARS.items():
        raw = environ.get(var)
        if raw is None or not raw.strip():
            continue
        value = raw.strip().lower()
        if value not in allowed(field):
            raise ConfigError(
                f"${var}={shown(raw)} is not a valid train.{field}: use one of {', '.join(allowed(field))}. It sets "
                f"train.{field} for every run on this worker whose config does not write it; fix or unset the "
                "variable (or write train." + field + " in the config). Nothing was launched.")
        out[field] = value
    return out


def resolve_fleet(written: set[str], environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the train settings to fill from the environment, where each fleet setting comes from) for a train section
    that wrote ``written`` itself. The environment is validated even where the config wins: a bad variable on a
    worker is the worker's error, said before it spoils a run that does not write the setting."""
    values = fleet_values(environ)
    fill, sources = {}, {}
    for field, var in FLEET_VARS.items():
        if field in written:
            sources[field] = CONFIG
        elif field in values:
            fill[field], sources[field] = values[field], f"environment {var}"
        else:
            sources[field] = DEFAULT
    return fill, sources


def sources_env(sources: dict[str, str] | None) -> dict[str, str]:
    """The node's ``$THRIFTY_SETTING_SOURCES`` for ``sources`` (none when unknown)."""
    return {ENV_SOURCES: json.dumps(sources, sort_keys=True)} if sources else {}


def sources_from_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """What the flow's resolution said (``$THRIFTY_SETTING_SOURCES``), or None; a damaged value is None, not a
    failure: it only labels the summary."""
    raw = environ.get(ENV_SOURCES)
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): str(v) for k, v in data.items() if k in FLEET_VARS}
