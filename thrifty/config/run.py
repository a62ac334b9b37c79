"""RunConfig: one training run, and its validation into friendly errors."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from typing import Any, Mapping

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from thrifty.config.base import ConfigError, StoreUri, _Frozen
from thrifty.config.report import ReportConfig, redacted
from thrifty.config.reuse import DataConfig
from thrifty.config.echo import check_plain, cut, shown
from thrifty.config.fleet import CONFIG, DEFAULT, FLEET_VARS, resolve_fleet, sources_from_env
from thrifty.config.sections import BudgetConfig, ComputeConfig, TrainConfig


# Forms checked by pattern; each pattern's user-facing wording for errors. A pattern in the JSON schema is what the
# Prefect server checks when a form (or any client) creates a flow run, so a bad name or recipe is refused at the
# form, before a flow run exists. The server's message quotes the schema's regex, so RUN_NAME_FORM is the plain one a
# user can read; the validator then applies RUN_NAME_PATTERN, the whole rule ('{' and '}' only as '{date}').
RUN_NAME_FORM = r"^[A-Za-z0-9][-A-Za-z0-9._{}]{0,62}$"
RUN_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.\-]|\{date\}){0,62}$"
SWEEP_NAME_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9._]{0,57}$"  # + '-t000' stays within a run_name's 63 characters
RECIPE_PATTERN = r"^([A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
_RUN_NAME_HELP = ("must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit; '{date}' is "
                  "replaced by the run's scheduled date (YYYYMMDD), e.g. 'nightly-{date}'")
PATTERN_HELP = {
    RUN_NAME_FORM: _RUN_NAME_HELP,
    RUN_NAME_PATTERN: _RUN_NAME_HELP,
    SWEEP_NAME_PATTERN: "must be 1-58 letters, digits, '.', '_' or '-', starting with a letter or digit (trial runs "
                        "are NAME-t000, ...)",
    RECIPE_PATTERN: "must be a built-in name (digits, codelm, script) or 'package.module:function'",
}


TAG_KEY, TAG_VALUE, MAX_TAGS = r"[a-z][a-z0-9_-]{0,62}", r"[a-z0-9_-]{0,63}", 32  # GCP's label rules, the strictest
MAX_ERRORS_SHOWN = 20  # a file of ten thousand typos makes one readable message
# train fields that cannot change the final weights (an export of them is written after the end; recomputed
# activations give the same weights) and telemetry (what is measured and alerted on: utilisation sampling, the
# starvation alert, the profiler's cost map)
PAUSE_AND_IO_FIELDS = ("stop_at_epoch", "async_checkpoint", "export_half", "export_tolerance",
                       "activation_checkpointing", "activation_checkpointing_every", "utilisation_every_s",
                       "starved_alert_share", "starved_alert_minutes", "profile_steps")
# train fields added after runs were fingerprinted: left out at these defaults, so the fingerprint of a run finished
# before them, and a resume of its checkpoints, still match
LATER_DEFAULTS: dict[str, Any] = {"init_from": None, "init_prefixes": [], "batch_size": None, "micro_batch_headroom": 0.1,
                                 "compile": "off", "tf32": True}
_ABSENT = object()


def comparable_train(train: dict[str, Any]) -> dict[str, Any]:
    """A train section (as JSON) without what cannot change the weights and the later fields at their defaults: what
    a resume compares and the fingerprint hashes."""
    return {k: v for k, v in train.items() if k not in PAUSE_AND_IO_FIELDS and LATER_DEFAULTS.get(k, _ABSENT) != v}


class RunConfig(_Frozen):
    """One training run: what to train, where to keep it, what to rent, and what it may cost."""

    run_name: str = Field(
        "digits-demo", min_length=1, pattern=RUN_NAME_FORM,  # and RUN_NAME_PATTERN, the whole rule, below
        description="The run id and resume key: checkpoints live under STORE/runs/RUN_NAME/ in the store below; "
        "the same name resumes from there. '{date}' becomes the run's scheduled date (YYYYMMDD), so a nightly "
        "deployment trains a new run each night. 1-63 letters, digits, '.', '_' or '-', starting with a letter or "
        "digit. The flow run is named after it when it starts: this field wins over the form's top 'Run Name'.",
    )
    recipe: str = Field("digits", pattern=RECIPE_PATTERN,
                        description="digits | codelm | script (your own command, recipe_params.command) | "
                        "'package.module:function' returning a Recipe.")
    recipe_params: dict[str, Any] = Field(
        default_factory=dict,
        description="The recipe's own options as JSON, checked before anything is rented; empty = its defaults. "
        "digits: hidden (MLP units, 128), dropout (0.1), val_fraction (0.2), split_seed, limit (first N examples). "
        "codelm: max_files, max_bytes, exclude_dirs, val_every, vocab_size (2048), min_frequency, "
        "tokenizer_max_bytes, seq_len (128), n_layer (3), n_head (4), n_embd (128), dropout. script: command "
        "(required), smoke_steps (3), "
        "smoke_timeout_s, total_steps, env. E.g. {\"hidden\": 256}.",
    )
    store: StoreUri = Field(".thrifty/store", description="Where shards, checkpoints and ledgers go: a path, file://, s3://, gs://, az://.")
    store_retry_s: float = Field(
        300.0, ge=0.0, le=86400.0,
        description="How long the training node and the watch loop keep retrying the store, with backoff, when it "
        "fails in a way that passes (connection refused or reset, a timeout, a 5xx answer, throttling), in seconds. "
        "Training carries on meanwhile; an outage longer than this ends the job as failed, with the store's own "
        "words. 0 = only the storage SDK's own retries.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The training loop: epochs, batch, "
                               "learning rate, precision, checkpoints and early stopping.")
    compute: ComputeConfig = Field(default_factory=ComputeConfig, description="Where it runs: the launcher, clouds, "
                                   "accelerators, spot or on-demand, and the local launcher's emulated instance.")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="What it may cost: the hard cap in USD, "
                                 "alerts and where they go.")
    data: DataConfig = Field(default_factory=DataConfig, description="What the preprocessing cache does to the "
                             "recipe's examples before they are trained on: deduplication.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="Where the run's end is reported besides "
                                 "Prefect: an MLflow tracking server. Not part of what is trained.")
    tags: dict[str, str] = Field(
        default_factory=dict, description="Cost allocation tags, e.g. team: ml, project: search, owner: ana. They go "
        "to the flow run's tags (team:ml), the cloud instance's labels (so the cloud's bill can be split by them), "
        "every ledger row, the summary and the reports (thrifty report --by team). Keys: a lowercase letter, then "
        "up to 62 lowercase letters, digits, '_' or '-'; values: up to 63 of those (the rules of GCP labels, the "
        "strictest cloud). At most 32. Not part of what is trained.")

    @field_validator("tags")
    @classmethod
    def _label_shaped(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_TAGS:
            raise ValueError(f"{len(v)} tags; at most {MAX_TAGS} (clouds limit the labels of an instance)")
        for key, value in v.items():
            if not re.fullmatch(TAG_KEY, key):
                raise ValueError(f"tag key {shown(key)} must start with a lowercase letter and hold up to 63 lowercase "
                                 "letters, digits, '_' or '-' (e.g. team, cost_center)")
            if not re.fullmatch(TAG_VALUE, value):
                raise ValueError(f"tag {key}: value {shown(value)} may hold up to 63 lowercase letters, digits, '_' or "
                                 "'-' (e.g. ml-platform)")
        return v

    @field_validator("recipe_params")
    @classmethod
    def _plain_params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_plain(v, "recipe_params")  # a form's JSON is not a config file: the same limits

    @field_validator("run_name")
    @classmethod
    def _dated_name_fits(cls, v: str) -> str:
        if not re.fullmatch(RUN_NAME_PATTERN, v):
            raise ValueError(f"run_name {PATTERN_HELP[RUN_NAME_PATTERN]}")
        if len(_dated(v, dt.date.today())) > 63:
            raise ValueError(f"run_name {v!r} is {len(_dated(v, dt.date.today()))} characters once '{{date}}' becomes "
                             "YYYYMMDD; the limit is 63, shorten it")
        return v

    # where train.precision and train.compile came from (thrifty.config.fleet), once resolved; not a setting: it
    # is never dumped, and two configs of the same settings are equal whatever it says
    _sources: dict[str, str] | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunConfig):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def resolved(self, when: dt.date, environ: Mapping[str, str] | None = None) -> "RunConfig":
        """This config as a run started now trains it: '{date}' in run_name replaced by ``when`` (YYYYMMDD) and
        the fleet defaults (``$THRIFTY_PRECISION``, ``$THRIFTY_COMPILE``) filled where the train section does not
        write them, validated again like any input. Idempotent: a resolved config keeps its values and sources."""
        out = self
        if self._sources is None:
            fill, sources = resolve_fleet(self.train.model_fields_set, os.environ if environ is None else environ)
            if fill:
                out = self.updated({"train": {**self.train.model_dump(mode="json"), **fill}},
                                   "the fleet defaults in the environment (" +
                                   ", ".join(f"${FLEET_VARS[k]}" for k in fill) + ")")
            if out is self:
                out = self.model_copy()  # (the caller's config stays as it was given)
            out._sources = sources
        if "{date}" in out.run_name:
            out = out.updated({"run_name": _dated(out.run_name, when)}, "run_name with its '{date}' resolved")
        return out

    def updated(self, changes: dict[str, Any], source: str = "an update") -> "RunConfig":
        """A copy with top-level ``changes``, validated (never ``model_copy``, which skips validation); where its
        fleet settings came from stays said."""
        out = build_config({**self.model_dump(mode="json"), **changes}, source)
        out._sources = self._sources
        return out

    def setting_sources(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Where train.precision and train.compile came from: this config's resolution, else (a node, handed the
        resolved config as JSON) what its flow said in ``$THRIFTY_SETTING_SOURCES``, else the fields it writes."""
        if self._sources is not None:
            return dict(self._sources)
        said = sources_from_env(os.environ if environ is None else environ)
        written = self.train.model_fields_set
        return {field: (said or {}).get(field) or (CONFIG if field in written else DEFAULT) for field in FLEET_VARS}

    def require_resolved(self) -> "RunConfig":
        """Raise unless '{date}' was resolved: a node must train under the name its launcher resolved and priced."""
        if "{date}" in self.run_name:
            raise ConfigError(f"'run_name': {self.run_name!r} still holds '{{date}}'; the flow (or `thrifty train`) "
                              "resolves it before training starts, so this config did not come from one of them")
        return self

    def train_settings(self) -> dict[str, Any]:
        """The train section as JSON without what cannot change the weights the run ends with: where a job pauses
        (``stop_at_epoch``: resume is exact) and where the checkpoint write runs (``async_checkpoint``). What a
        resume compares and the fingerprint hashes (so fingerprints of older runs still match)."""
        return comparable_train(self.train.model_dump(mode="json"))

    def to_env_json(self) -> str:
        """The config as compact JSON, for the environment of a training node."""
        return self.model_dump_json()

    def training_fingerprint(self) -> str:
        """A hash of what decides the trained weights (recipe, its params, the train section): a finished run
        with the same fingerprint has nothing left to train, whatever its budget or compute settings."""
        what = {"recipe": self.recipe, "recipe_params": self.recipe_params, "train": self.train_settings()}
        if self.data.cache_part() is not None:  # deduplicated data trains other weights (off: older runs still match)
            what["data"] = self.data.cache_part()
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _dated(run_name: str, when: dt.date) -> str:
    return run_name.replace("{date}", when.strftime("%Y%m%d"))


_UNION_MEMBER = re.compile(r"^(int|float|str|bool|none|[a-z-]+\[.*\])$")  # pydantic's tag of a union's member
_MEMBER_WORDS = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false",
                 "none": "null"}


def _merge_union_members(errors: list[Any]) -> list[Any]:
    """Errors of a value that fits no member of a union, read as a person would. pydantic reports the value once per
    member, under a tag (``int``, ``literal['auto']``, ``function-after[...]``). When the value had a member's shape
    but failed inside it (a dict for a model, with a bad field), those inner errors are what to fix: shown without
    the tags. Otherwise one error for the field, naming what it may be ("must be a whole number or 'auto'")."""
    groups: dict[tuple, list[Any]] = {}
    out: list[Any] = []
    for e in errors:
        loc = e["loc"]
        first_tag = next((i for i, p in enumerate(loc) if isinstance(p, str) and _UNION_MEMBER.match(p)), None)
        if first_tag is None:
            out.append(e)
            continue
        field = tuple(loc[:first_tag])
        if field not in groups:
            groups[field] = []
            out.append(field)  # the group's place among the errors
        groups[field].append(e)
    merged: list[Any] = []
    for item in out:
        if not isinstance(item, tuple):
            merged.append(item)
            continue
        group = groups[item]
        untagged = lambda e: tuple(p for p in e["loc"] if not (isinstance(p, str) and _UNION_MEMBER.match(p)))  # noqa: E731
        inner = [e for e in group if len(untagged(e)) > len(item)]
        if inner:
            merged += [{**e, "loc": untagged(e)} for e in inner]
            continue
        words = []
        for e in group:
            tag = e["loc"][len(item)]
            word = (_MEMBER_WORDS.get(tag) or (e.get("ctx") or {}).get("expected")
                    or ("a mapping of settings" if e["type"] in ("model_type", "dict_type") else e["msg"]))
            if word not in words:
                words.append(word)
        merged.append({**group[0], "loc": item, "type": "union", "msg": "must be " + " or ".join(words)})
    return merged


def format_validation_error(err: ValidationError, source: str, what: str = "run config") -> str:
    parts = []
    errors = _merge_union_members(err.errors())
    for e in errors[:MAX_ERRORS_SHOWN]:
        loc = cut(".".join(str(p) for p in e["loc"])) or "(top level)"
        if e["type"] == "extra_forbidden":
            parts.append(f"'{loc}' is not a known setting (remove it or check its spelling)")
        elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] in PATTERN_HELP:
            parts.append(f"'{loc}' {PATTERN_HELP[e['ctx']['pattern']]} (got {shown(e['input'])})")
        else:
            msg = cut(e["msg"].removeprefix("Value error, "), 600)
            given = e.get("input")
            if isinstance(given, str):
                given = redacted(given)  # a URL's user:password@ is never echoed (the message reaches logs and the UI)
            echo = "" if isinstance(given, (dict, list)) or given is None else f" (got {shown(given)})"
            parts.append(f"'{loc}': {msg}{echo}")
    if len(errors) > MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - MAX_ERRORS_SHOWN} more")
    return f"Invalid {what} from {cut(source)}: " + "; ".join(parts) + ". Fix these settings and run again."


def build_config(data: dict[str, Any], source: str = "input") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
