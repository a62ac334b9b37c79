"""RunConfig: the one contract between the CLI, the flow parameter, a cloud node and every checkpoint.

Frozen, ``extra="forbid"``, every field documented with its unit. :func:`resolve_config` is how
every command finds it (a YAML or JSON file, else ``$THRIFTY_RUN_CONFIG`` on a node, else the
defaults; then ``section.key=value`` overrides); bad input raises :class:`ConfigError` whose
message names the field and says what to change.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from thrifty.protocol import ENV_CONFIG as ENV_VAR  # the RunConfig as JSON, in the environment of a training node


class ConfigError(ValueError):
    """A user-fixable problem with the run's configuration (CLI exit code 2)."""


STORE_SCHEMES = ("file", "s3", "gs", "az")


def store_scheme(uri: str) -> str:
    """The scheme of a store URI (a plain path is file); ValueError naming the fix for anything no Store speaks."""
    if not uri.strip():
        raise ValueError("store is empty; give a path (e.g. .thrifty/store), file://, s3://, gs:// or az://")
    if "://" not in uri:
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):/?(?!/)", uri)
        if m and len(m.group(1)) > 1:  # 's3:/bucket/x' or 'gs:bucket': a URI with a slash missing, not a path
            raise ValueError(f"store {uri!r} looks like a URI with a '//' missing; write it as "
                             f"{m.group(1)}://{uri[m.end():].lstrip('/')}")
        return "file"
    scheme, _, rest = uri.partition("://")
    if scheme not in STORE_SCHEMES:
        raise ValueError(f"unsupported scheme {scheme!r} in store {uri!r}; use a path, file://, s3://, gs:// or az://")
    if scheme != "file" and not rest.split("/", 1)[0]:
        what = "container" if scheme == "az" else "bucket"
        raise ValueError(f"store {uri!r} names no {what}; write it as {scheme}://{what}/prefix")
    if scheme == "file" and not rest.strip("/"):
        raise ValueError(f"store {uri!r} names no directory; write it as file:///path/to/store or a plain path")
    return scheme


def _check_store(uri: str) -> str:
    store_scheme(uri)
    return uri


StoreUri = Annotated[str, AfterValidator(_check_store)]  # a store every backend can open: checked where it is read


class _Frozen(BaseModel):
    # no inf or nan anywhere: they pass every bound (inf > 0) and turn into training that diverges, a budget
    # that is never reached, or null on a node (JSON has no inf)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


class EarlyStoppingConfig(_Frozen):
    enabled: bool = Field(True, description="Stop when the validation metric stops improving.")
    metric: str = Field("val_loss", description="Validation metric watched, e.g. val_loss or val_accuracy.")
    mode: Literal["min", "max"] = Field("min", description="min: lower is better; max: higher is better.")
    patience: int = Field(3, ge=0, description="Evaluations without improvement before stopping (count).")
    min_delta: float = Field(0.0, ge=0.0, description="Smallest change that counts as an improvement (metric units).")

    @model_validator(mode="after")
    def _patience_when_enabled(self) -> "EarlyStoppingConfig":
        if self.enabled and self.patience < 1:
            raise ValueError(
                "patience must be >= 1 when early stopping is enabled "
                "(set train.early_stopping.patience to 1 or more, or train.early_stopping.enabled=false)"
            )
        return self


class TrainConfig(_Frozen):
    max_epochs: int = Field(20, ge=1, description="Upper bound on passes over the training set (epochs).")
    max_steps: int | None = Field(None, ge=1, description="Optional cap on optimizer steps; null = max_epochs decides.")
    micro_batch: int = Field(64, ge=1, description="Examples per forward/backward pass, per process (examples).")
    grad_accum_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step (count).")
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate of AdamW (per step).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay (fraction per step).")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up length (optimizer steps); cosine decay after.")
    grad_clip: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm to this (L2 norm); null = off.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Autocast dtype. auto = bf16 on GPUs that have it, fp16 + GradScaler on older GPUs, fp32 on CPU."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    checkpoint_every: Union[int, Literal["auto"]] = Field(
        "auto",
        description="Optimizer steps between checkpoints, or auto = Young/Daly optimum from the measured save "
        "time and mean_time_between_preemptions_s.",
    )
    mean_time_between_preemptions_s: float = Field(
        7200.0, gt=0.0, description="Expected seconds between spot preemptions, for the auto checkpoint interval (s)."
    )
    keep_last: int = Field(3, ge=1, description="Complete checkpoints kept besides the best one (count).")
    eval_every: int | None = Field(
        None, ge=1, description="Optimizer steps between validations; null = once per epoch."
    )
    log_every: int = Field(10, ge=1, description="Optimizer steps between metric lines (steps).")
    early_stopping: EarlyStoppingConfig = Field(default_factory=EarlyStoppingConfig)
    seed: int = Field(0, ge=0, lt=2**32, description="Seed for weights, data order and dropout (integer, 0 to 2^32-1).")

    @field_validator("checkpoint_every")
    @classmethod
    def _positive_interval(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("checkpoint_every must be a positive number of steps or 'auto'")
        return v

    def examples_per_step(self, world: int) -> int:
        """Examples in one optimizer step across ``world`` processes."""
        return self.micro_batch * self.grad_accum_steps * world

    def steps_per_epoch(self, n_train: int, world: int) -> int:
        """Optimizer steps in one pass over ``n_train`` examples (a last partial step is dropped)."""
        return n_train // self.examples_per_step(world)

    def total_steps(self, n_train: int, world: int) -> int:
        """Optimizer steps the run takes if it never stops early: the one rule the gate and the loop share."""
        total = self.max_epochs * self.steps_per_epoch(n_train, world)
        return min(total, self.max_steps) if self.max_steps is not None else total


class ComputeConfig(_Frozen):
    launcher: Literal["local", "skypilot"] = Field("local", description="local = emulated spot on this machine.")
    clouds: list[Literal["aws", "gcp", "azure"]] = Field(
        default_factory=lambda: ["aws", "gcp", "azure"], min_length=1, description="Clouds SkyPilot may choose from."
    )
    accelerators: list[str] = Field(
        default_factory=lambda: ["A10G:1", "L4:1"], min_length=1, description="Candidate accelerators, NAME:COUNT."
    )
    use_spot: bool = Field(True, description="Rent spot (preemptible) instances.")
    on_demand_fallback: bool = Field(True, description="Fall back to on-demand when no spot capacity is found.")
    num_nodes: int = Field(1, ge=1, description="Nodes in the job (count).")
    max_restarts: int = Field(3, ge=0, description="Recoveries after failures (not preemptions) before giving up (count).")
    max_hourly_cost: float | None = Field(
        None, gt=0.0, description="SkyPilot: only instances at or below this price per node (spot price for spot) (USD/hour)."
    )
    job_recovery_strategy: Literal["EAGER_NEXT_REGION", "FAILOVER"] = Field(
        "EAGER_NEXT_REGION", description="SkyPilot: after a preemption, try another region at once, or retry the same region first."
    )
    regions: list[str] = Field(
        default_factory=list,
        description="SkyPilot: restrict a cloud to these regions, as 'cloud/region' (e.g. 'aws/us-east-1'); clouds not named stay unrestricted.",
    )
    disk_size_gb: int | None = Field(None, ge=10, description="SkyPilot: OS disk per node; null = SkyPilot's default (GB).")
    store_access: Literal["sdk", "mount_cached"] = Field(
        "sdk",
        description="SkyPilot: the node reads and writes the store through the cloud SDK (atomic checkpoints), or "
        "through a MOUNT_CACHED bucket mount (asynchronous uploads).",
    )
    workdir: str = Field(".", description="SkyPilot: the project directory synced to the node and installed by setup.")
    stop_checkpoint_timeout_s: float = Field(
        180.0, gt=0.0, description="SkyPilot: a cancel waits this long for the node to checkpoint before tearing it down (s)."
    )
    emulate: str = Field("aws:g5.xlarge", description="Local launcher: CLOUD:INSTANCE whose spot price is metered.")
    preempt_after_s: float | None = Field(None, gt=0.0, description="Local launcher: inject a preemption after this many seconds (s).")
    preempt_after_steps: int | None = Field(None, ge=1, description="Local launcher: inject a preemption after this step (steps).")
    preempt_mode: Literal["sigterm", "kill"] = Field("sigterm", description="Local launcher: notice+grace (sigterm) or hard kill.")
    preempt_grace_s: float = Field(30.0, gt=0.0, description="Local launcher: seconds between SIGTERM and SIGKILL (s).")

    @field_validator("accelerators")
    @classmethod
    def _accelerator_form(cls, v: list[str]) -> list[str]:
        for acc in v:
            if not re.fullmatch(r"[A-Za-z0-9\-]+(:[1-9][0-9]*)?", acc):
                raise ValueError(f"accelerator {acc!r} must look like NAME or NAME:COUNT, e.g. 'A10G:1'")
        return v

    @field_validator("emulate")
    @classmethod
    def _emulate_form(cls, v: str) -> str:
        if not re.fullmatch(r"(aws|gcp|azure):[A-Za-z0-9_.+\-]+", v):  # GCP rows look like n1-standard-4+T4
            raise ValueError(f"emulate {v!r} must look like CLOUD:INSTANCE, e.g. 'aws:g5.xlarge'")
        return v

    @field_validator("regions")
    @classmethod
    def _region_form(cls, v: list[str]) -> list[str]:
        for r in v:
            if not re.fullmatch(r"(aws|gcp|azure)/[a-z0-9\-]+", r):
                raise ValueError(f"region {r!r} must look like CLOUD/REGION, e.g. 'aws/us-east-1' or 'gcp/us-central1'")
        return v

    @model_validator(mode="after")
    def _regions_in_clouds(self) -> "ComputeConfig":
        stray = sorted({r.split("/")[0] for r in self.regions} - set(self.clouds))
        if stray:
            raise ValueError(f"regions name cloud(s) {stray} that are not in clouds {self.clouds}; add them to clouds or drop those regions")
        return self


class BudgetConfig(_Frozen):
    max_usd: float = Field(10.0, gt=0.0, description="Hard cap on the run's spend: the job is stopped (with a checkpoint) here (USD).")
    max_gpu_hours: float | None = Field(None, gt=0.0, description="Optional cap on GPU time, summed over attempts and nodes (GPU-hours).")
    burn_rate_alert_usd_per_hour: float | None = Field(5.0, gt=0.0, description="Alert while the run burns more than this (USD/hour); null = off.")
    burn_rate_alert_every_s: float = Field(1800.0, gt=0.0, description="A burn-rate alert repeats at most this often (s).")
    thresholds: list[float] = Field(
        default_factory=lambda: [0.5, 0.8, 1.0], min_length=1,
        description="Alert once each when spend reaches these fractions of max_usd (fractions, increasing).",
    )
    notify: list[str] = Field(
        default_factory=list,
        description="Prefect notification blocks to alert, as 'block-type/block-name', e.g. 'slack-webhook/ml-alerts'.",
    )
    stop_margin_s: float | None = Field(
        None, ge=0.0,
        description="The longest a stop at the cap may take: the job is told to checkpoint this long (plus one poll "
        "interval) of burn before the cap, and is killed if it has not stopped by then (s). null = the launcher's "
        "default: 30 s locally, 240 s on SkyPilot (a checkpoint upload, then the VMs torn down).",
    )
    allow_over_budget: bool = Field(
        False, description="Launch even when the pre-launch estimate exceeds max_usd (the hard cap still applies)."
    )

    @field_validator("thresholds")
    @classmethod
    def _ordered(cls, v: list[float]) -> list[float]:
        if any(t <= 0 or t > 1 for t in v) or v != sorted(set(v)):
            raise ValueError("thresholds must be strictly increasing fractions in (0, 1], e.g. [0.5, 0.8, 1.0]")
        return v

    @field_validator("notify")
    @classmethod
    def _block_refs(cls, v: list[str]) -> list[str]:
        for ref in v:
            if not re.fullmatch(r"[a-z0-9][a-z0-9\-]*/[A-Za-z0-9][\w\-]*", ref):
                raise ValueError(f"notify entry {ref!r} must be 'block-type/block-name', e.g. 'custom-webhook/ops'")
        return v


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
# Forms checked by pattern, so they are in the JSON schema and the Prefect UI form enforces them too;
# each pattern's user-facing wording for errors:
RUN_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.\-]|\{date\}){0,62}$"
RECIPE_PATTERN = r"^([A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
PATTERN_HELP = {
    RUN_NAME_PATTERN: "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit; "
                      "'{date}' is replaced by the run's scheduled date (YYYYMMDD), e.g. 'nightly-{date}'",
    RECIPE_PATTERN: "must be a built-in name (digits, codelm) or 'package.module:function'",
}


class RunConfig(_Frozen):
    """One training run: what to train, where to keep it, what to rent, and what it may cost."""

    run_name: str = Field(
        "digits-demo", pattern=RUN_NAME_PATTERN,
        description="The run id and resume key: checkpoints live under <store>/runs/<run_name>/. "
        "'{date}' becomes the run's scheduled date, so a nightly deployment trains a new run each night.",
    )
    recipe: str = Field("digits", pattern=RECIPE_PATTERN,
                        description="digits | codelm | 'package.module:function' returning a Recipe.")
    recipe_params: dict[str, Any] = Field(default_factory=dict, description="Recipe options (validated by the recipe).")
    store: StoreUri = Field(".thrifty/store", description="Where shards, checkpoints and ledgers go: a path, file://, s3://, gs://, az://.")
    train: TrainConfig = Field(default_factory=TrainConfig)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)

    @field_validator("run_name")
    @classmethod
    def _dated_name_fits(cls, v: str) -> str:
        if len(_dated(v, dt.date.today())) > 63:
            raise ValueError(f"run_name {v!r} is {len(_dated(v, dt.date.today()))} characters once '{{date}}' becomes "
                             "YYYYMMDD; the limit is 63, shorten it")
        return v

    def resolved(self, when: dt.date) -> "RunConfig":
        """This config with '{date}' in run_name replaced by ``when`` (YYYYMMDD), validated again like any input."""
        if "{date}" not in self.run_name:
            return self
        return self.updated({"run_name": _dated(self.run_name, when)}, "run_name with its '{date}' resolved")

    def updated(self, changes: dict[str, Any], source: str = "an update") -> "RunConfig":
        """A copy with top-level ``changes``, validated (never ``model_copy``, which skips validation)."""
        return build_config({**self.model_dump(mode="json"), **changes}, source)

    def require_resolved(self) -> "RunConfig":
        """Raise unless '{date}' was resolved: a node must train under the name its launcher resolved and priced."""
        if "{date}" in self.run_name:
            raise ConfigError(f"'run_name': {self.run_name!r} still holds '{{date}}'; the flow (or `thrifty train`) "
                              "resolves it before training starts, so this config did not come from one of them")
        return self

    def to_env_json(self) -> str:
        """The config as compact JSON, for the environment of a training node."""
        return self.model_dump_json()

    def training_fingerprint(self) -> str:
        """A hash of what decides the trained weights (recipe, its params, the train section): a finished run
        with the same fingerprint has nothing left to train, whatever its budget or compute settings."""
        what = {"recipe": self.recipe, "recipe_params": self.recipe_params, "train": self.train.model_dump(mode="json")}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _dated(run_name: str, when: dt.date) -> str:
    return run_name.replace("{date}", when.strftime("%Y%m%d"))


# ---------------------------------------------------------------- loading


def format_validation_error(err: ValidationError, source: str, what: str = "run config") -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            parts.append(f"'{loc}' is not a known setting (remove it or check its spelling)")
        elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] in PATTERN_HELP:
            parts.append(f"'{loc}' {PATTERN_HELP[e['ctx']['pattern']]} (got {e['input']!r})")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            given = e.get("input")
            shown = "" if isinstance(given, (dict, list)) or given is None else f" (got {given!r})"
            parts.append(f"'{loc}': {msg}{shown}")
    return f"Invalid {what} from {source}: " + "; ".join(parts) + ". Fix these settings and run again."


def parse_override(item: str) -> tuple[list[str], Any]:
    """``train.lr=3e-4`` -> (['train', 'lr'], 0.0003); the value is read as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.lr=0.0003")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has no key before '='")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
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
                raise ConfigError(f"override {item!r}: '{p}' is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass --config with a YAML or JSON RunConfig")
    try:
        text = p.read_text()
        if not text.strip():
            data = None
        else:
            data = yaml.safe_load(text) if p.suffix in (".yaml", ".yml") else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid {'YAML' if p.suffix != '.json' else 'JSON'}: {exc}") from exc
    if data is None:  # an empty file, YAML or JSON alike, means every default (a local run: nothing is rented)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of settings at the top level")
    return data


def build_config(data: dict[str, Any], source: str = "input") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a RunConfig from a YAML/JSON file (or defaults) and apply ``section.key=value`` overrides."""
    data = read_config_file(path) if path else {}
    data = apply_overrides(data, overrides or [])
    return build_config(data, source=str(path) if path else "defaults")


def config_from_env(environ: dict[str, str]) -> RunConfig | None:
    raw = environ.get(ENV_VAR)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"${ENV_VAR} is not valid JSON: {exc}") from exc
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
