"""SweepConfig: a hyperparameter search under hard caps, validated whole before anything runs.

One frozen model is the CLI's input (``thrifty sweep --config sweep.yaml``) and the ``thrifty-sweep`` flow's
parameter (the Prefect UI draws its form from it). Every trial it will run is built and validated here, so a
space that makes any trial invalid fails with exit 2 before a single trial is launched.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from thrifty.config import SWEEP_NAME_PATTERN, ConfigError, RunConfig, build_config, format_validation_error
from thrifty.config.base import _Frozen
from thrifty.config.run import RUN_NAME_FORM
from thrifty.sweep.space import ParamSpec, apply, check_path, check_spec, sample, shapes_model


class TrialBase(RunConfig):
    """A sweep's base RunConfig: a RunConfig whose run_name says what it is in a search (each trial is named after
    the sweep), so the sweep form describes it right."""

    run_name: str = Field(
        "digits-demo", min_length=1, pattern=RUN_NAME_FORM,
        description="Not used by a sweep: each trial trains as its own run, named after the sweep (NAME-t000, "
        "NAME-t001, ...), and resumes under that name. Leave it as it is.")


class SweepConfig(_Frozen):
    """A search over RunConfig fields that cannot spend more than its caps."""

    name: str = Field("digits-sweep", min_length=1, pattern=SWEEP_NAME_PATTERN,
                      description="The sweep id: trials train as runs NAME-t000, NAME-t001, ... and its state lives "
                      "under STORE/sweeps/NAME/; the same name resumes the search. 1-58 letters, digits, '.', '_', '-'.")
    base: TrialBase = Field(default_factory=TrialBase, description="The RunConfig every trial starts from (its "
                            "run_name is replaced by the trial's, its budget by the trial's share of the caps).")
    space: dict[str, ParamSpec] = Field(
        default_factory=lambda: {"train.lr": {"log_uniform": [1e-4, 1e-2]}},  # type: ignore[dict-item]
        description="Dotted RunConfig paths (train.*, recipe_params.*) -> one of {choice: [...]}, {uniform: [lo, hi]}, "
        "{log_uniform: [lo, hi]}, {int: [lo, hi]}. E.g. {\"train.lr\": {\"log_uniform\": [1e-4, 1e-2]}}.")
    seed: int = Field(0, ge=0, description="Seed of the sampler: the same seed draws the same trials.")
    metric: str | None = Field(None, description="The validation metric trials are ranked by at each rung; null = "
                               "the base config's early-stopping metric (e.g. val_loss).")
    mode: Literal["min", "max"] | None = Field(None, description="min: lower is better; max: higher is better; "
                                               "null = the early-stopping mode when metric is its metric.")
    max_trials: int = Field(8, ge=1, le=999, description="Configurations sampled at most (count).")
    min_epochs: int = Field(1, ge=1, description="The first rung: every trial trains this many epochs (epochs).")
    eta: int = Field(3, ge=2, description="Reduction factor: the best 1/eta of a rung go on to eta times the epochs.")
    max_epochs: int | None = Field(None, ge=1, description="The full budget of a trial (epochs); null = "
                                   "base.train.max_epochs. Every trial's LR schedule runs to it.")
    concurrency: int = Field(2, ge=1, le=64, description="Trials training at once (count).")
    max_usd: float = Field(10.0, gt=0.0, description="Hard cap on the whole search's spend (USD): no trial is "
                           "launched that the rest cannot cover, and each runs under its share.")
    max_gpu_hours: float | None = Field(None, gt=0.0, description="Optional cap on the search's GPU time (GPU-hours).")
    max_wall_h: float | None = Field(None, gt=0.0, description="Optional: launch nothing whose estimated end is "
                                     "later than this many hours after the search first started (hours).")
    reserve_factor: float = Field(1.5, ge=1.0, le=10.0, description="Each launch reserves this multiple of its "
                                  "estimated cost to reach its milestone (headroom for a slow machine).")

    @field_validator("base", mode="before")
    @classmethod
    def _any_run_config(cls, v: Any) -> Any:
        """A RunConfig built in Python is a base as it is (TrialBase only describes run_name for the form)."""
        return v.model_dump() if isinstance(v, RunConfig) and not isinstance(v, TrialBase) else v

    @field_validator("space", mode="before")
    @classmethod
    def _one_kind_each(cls, v: Any) -> Any:
        kinds = ("choice", "uniform", "log_uniform", "int")
        for path, spec in (v.items() if isinstance(v, dict) else []):
            if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in kinds:
                raise ValueError(f"space field {path!r} must be one of {{choice: [...]}}, {{uniform: [lo, hi]}}, "
                                 f"{{log_uniform: [lo, hi]}}, {{int: [lo, hi]}} (got {spec!r})")
        return v

    @field_validator("space")
    @classmethod
    def _known_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("space is empty; give at least one field, e.g. train.lr: {log_uniform: [1e-4, 1e-2]}")
        for path, spec in v.items():
            check_path(path)
            check_spec(path, spec)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SweepConfig":
        if self.min_epochs > self.full_epochs:
            raise ValueError(f"min_epochs {self.min_epochs} is more than max_epochs {self.full_epochs}; the first "
                             "rung must fit in the full budget")
        es = self.base.train.early_stopping
        if self.metric is not None and self.metric != es.metric and self.mode is None:
            raise ValueError(f"metric {self.metric!r} is not the early-stopping metric, so its direction is unknown: "
                             "set mode to max (higher is better) or min")
        return self

    # ---- derived

    @property
    def full_epochs(self) -> int:
        return self.max_epochs if self.max_epochs is not None else self.base.train.max_epochs

    @property
    def rank_metric(self) -> str:
        return self.metric or self.base.train.early_stopping.metric

    @property
    def rank_mode(self) -> str:
        return self.mode or self.base.train.early_stopping.mode

    def rungs(self) -> list[int]:
        """The milestones in epochs: min_epochs x eta^k, up to and always ending at the full budget."""
        out, e = [], self.min_epochs
        while e < self.full_epochs:
            out.append(e)
            e *= self.eta
        return out + [self.full_epochs]

    def run_name(self, index: int) -> str:
        return f"{self.name}-t{index:03d}"

    def values(self, index: int) -> dict[str, Any]:
        return sample(self.space, self.seed, index)  # type: ignore[arg-type]

    def trial(self, index: int, stop_at_epoch: int | None = None, max_usd: float | None = None,
              max_gpu_hours: float | None = None) -> RunConfig:
        """Trial ``index`` as a RunConfig: the base, its sampled values, the full budget, this job's rung and caps."""
        data = apply(self.base.model_dump(mode="json"), self.values(index))
        train = {**data["train"], "max_epochs": self.full_epochs, "max_steps": None,
                 "stop_at_epoch": stop_at_epoch if stop_at_epoch != self.full_epochs else None}
        budget = {**data["budget"], **({"max_usd": max_usd} if max_usd is not None else {}),
                  **({"max_gpu_hours": max_gpu_hours} if max_gpu_hours is not None else {})}
        return build_config({**data, "run_name": self.run_name(index), "train": train, "budget": budget},
                            f"sweep {self.name} trial {index} ({self.values(index)})")

    def shape_key(self, index: int) -> str:
        """Trials with the same key have the same model and step time: one smoke test serves them all."""
        shaping = {p: v for p, v in self.values(index).items() if shapes_model(p)}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        """What decides the trials and their ranking: a search resumed under another one is refused."""
        what = self.model_dump(mode="json", include={"base", "space", "seed", "metric", "mode", "min_epochs", "eta",
                                                     "max_epochs"})
        what["base"] = {k: v for k, v in what["base"].items() if k in ("recipe", "recipe_params", "train", "store")}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def check_trials(self) -> None:
        """Build every trial the search may run (ConfigError naming the trial and its values for one that fails)."""
        for i in range(self.max_trials):
            self.trial(i, stop_at_epoch=self.rungs()[0])


def build_sweep(data: dict[str, Any], source: str = "input") -> SweepConfig:
    """A validated SweepConfig with every trial built, or ConfigError saying what to change."""
    try:
        cfg = SweepConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, "sweep config")) from None
    cfg.check_trials()
    return cfg
