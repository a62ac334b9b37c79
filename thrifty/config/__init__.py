"""RunConfig: the one contract between the CLI, the flow parameter, a cloud node and every checkpoint.

Frozen, ``extra="forbid"``, every field documented with its unit. :func:`resolve_config` is how
every command finds it (a YAML or JSON file, else ``$THRIFTY_RUN_CONFIG`` on a node, else the
defaults; then ``section.key=value`` overrides); bad input raises :class:`ConfigError` whose
message names the field and says what to change.

``base`` (ConfigError, store URIs, the frozen model base), ``sections`` (train, compute, budget),
``report`` (where the end is reported: MLflow), ``run`` (RunConfig, build_config), ``loading`` (files, ``--set``,
the node's environment).
"""

from __future__ import annotations


from thrifty.config.base import STORE_SCHEMES, ConfigError, StoreUri, store_scheme
from thrifty.config.loading import (ENV_VAR, add_config_args, apply_overrides, config_from_args, config_from_env,
                                    load_config, parse_override, read_config_file, resolve_config, script_config)
from thrifty.config.run import (PATTERN_HELP, RECIPE_PATTERN, RUN_NAME_PATTERN, SWEEP_NAME_PATTERN, RunConfig,
                                build_config, format_validation_error)
from thrifty.config.report import ReportConfig
from thrifty.config.sections import BudgetConfig, ComputeConfig, EarlyStoppingConfig, TrainConfig

__all__ = [
    "ENV_VAR", "PATTERN_HELP", "RECIPE_PATTERN", "RUN_NAME_PATTERN", "SWEEP_NAME_PATTERN", "STORE_SCHEMES",
    "BudgetConfig", "ComputeConfig", "ConfigError", "EarlyStoppingConfig", "ReportConfig", "RunConfig", "StoreUri", "TrainConfig", "add_config_args",
    "apply_overrides", "build_config", "config_from_args", "config_from_env", "format_validation_error",
    "load_config", "parse_override", "read_config_file", "resolve_config", "script_config", "store_scheme",
]
