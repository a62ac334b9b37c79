"""The RunConfig's sections: train (the loop), compute (where it runs), budget (what it may cost)."""

from __future__ import annotations

import re
from typing import Literal, Union

from pydantic import Field, field_validator, model_validator

from thrifty.config.base import AutoChoice, _Frozen
from thrifty.config.reuse import parse_init_from


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
    stop_at_epoch: int | None = Field(
        None, ge=1, description="End this job when this many epochs are trained, with a checkpoint and an "
        "evaluation (a rung of a hyperparameter search); the LR schedule still runs to max_epochs, so a later job "
        "with a larger value continues the same run exactly. null = train to the end (epochs).")
    micro_batch: Union[int, AutoChoice] = Field(
        64, description="Examples per forward/backward pass, per process (examples), or auto = the largest that fits "
        "the node's GPU memory (probed there with real steps, micro_batch_headroom kept free; again after a recovery "
        "onto another GPU), gradient accumulation making up batch_size exactly.")
    batch_size: int | None = Field(
        None, ge=1, description="Examples per optimizer step, per process (examples): required with micro_batch=auto, "
        "which keeps it whatever micro-batch fits (grad_accum_steps = batch_size / micro-batch). null = micro_batch "
        "x grad_accum_steps.")
    micro_batch_headroom: float = Field(
        0.1, ge=0.0, lt=0.9, description="With micro_batch=auto: the share of the GPU's memory left free (fraction).")
    grad_accum_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step (count).")
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate of AdamW (per step).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay (fraction per step).")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW's betas: decay rates of the gradient's first and second moment averages.")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW's epsilon, added to the denominator for stability.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up length (optimizer steps); lr_schedule after.")
    lr_schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="LR after warm-up: cosine or linear decay from lr to lr x min_lr_ratio at the last "
        "step, or constant. A recipe's own scheduler replaces it.")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="The decay's floor as a fraction of lr (fraction).")
    ema_decay: float | None = Field(
        None, gt=0.0, lt=1.0, description="Keep an exponential moving average of the weights with this decay per "
        "step (e.g. 0.999), evaluated and checkpointed beside them; null = off.")
    drop_last: bool = Field(
        True, description="Drop each epoch's last partial optimizer step (true), or train it too, padded with "
        "examples from the start of the epoch's order as torch's DistributedSampler does (false).")
    grad_clip: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm to this (L2 norm); null = off.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Autocast dtype. auto = bf16 on GPUs that have it, fp16 + GradScaler on older GPUs, fp32 on "
        "CPU. Not written here: $THRIFTY_PRECISION on the worker, else auto."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available, else cpu.")
    compile: Literal["off", "on"] = Field(
        "off", description="torch.compile the model for training: on = faster steps after a one-off compilation "
        "(tens of seconds to minutes, measured and logged as compile_s, counted in the budget estimate); "
        "checkpoints load either way. off = eager. Not written here: $THRIFTY_COMPILE on the worker, else off.")
    tf32: bool = Field(
        True, description="With fp32 precision on a GPU of compute capability 8.0 or newer (A100, A10G, L4, H100), "
        "let matmuls and convolutions use TF32 tensor cores (about 10 mantissa bits in the products; several times "
        "faster). Ignored on CPU, older GPUs and under bf16/fp16 autocast. false = full fp32 products.")
    checkpoint_every: Union[int, AutoChoice] = Field(
        "auto",
        description="Optimizer steps between checkpoints, or auto = Young/Daly optimum from the measured save "
        "time and mean_time_between_preemptions_s.",
    )
    mean_time_between_preemptions_s: float = Field(
        7200.0, gt=0.0, description="Expected seconds between spot preemptions, for the auto checkpoint interval (s)."
    )
    keep_last: int = Field(3, ge=1, description="Complete checkpoints kept besides the best one (count).")
    async_checkpoint: bool = Field(
        True, description="Write checkpoints in the background: the step path only copies the state (to pinned CPU "
        "memory on a GPU), one write at a time, COMMIT after the data; the final save and a stop's save wait for "
        "it. false = write on the training thread. A kill during a background write redoes the steps since the "
        "checkpoint before it.")
    activation_checkpointing: Literal["off", "full", "selective"] = Field(
        "off", description="Recompute the activations of the model's blocks in the backward pass instead of keeping "
        "them: far less memory a step (a larger micro_batch, or a cheaper GPU) for about one more forward pass of "
        "compute. full = every block, selective = every activation_checkpointing_every-th block, off = keep them "
        "all. The blocks are the recipe's (Recipe.blocks), else the model's 'blocks' or 'layers' list. The weights "
        "come out the same either way, so it may change at any resume.")
    activation_checkpointing_every: int = Field(
        2, ge=1, description="With activation_checkpointing=selective: recompute every Nth block, from the first (count).")
    eval_every: int | None = Field(
        None, ge=1, description="Optimizer steps between validations; null = once per epoch."
    )
    log_every: int = Field(10, ge=1, description="Optimizer steps between metric lines (steps).")
    early_stopping: EarlyStoppingConfig = Field(
        default_factory=EarlyStoppingConfig, description="Stop when a validation metric stops improving."
    )
    seed: int = Field(0, ge=0, lt=2**32, description="Seed for weights, data order and dropout (integer, 0 to 2^32-1).")
    init_from: str | None = Field(
        None, description="Start the weights from another run when this run has no checkpoint of its own: "
        "'previous' (the newest finished run of the same schedule, e.g. last night's), 'run:NAME' with ':gold' "
        "(default), ':best', ':latest', ':fp16' or ':bf16' (its exported half-precision gold weights), or the store "
        "URI of a checkpoint directory, state.pt or .safetensors file. Weights only: optimizer, LR schedule and "
        "step count start fresh. Shapes are checked before anything is rented. null = from scratch.")
    init_prefixes: list[str] = Field(
        default_factory=list, description="With init_from: load only the parameters whose names start with one of "
        "these (e.g. 'blocks.' for a pretrained backbone under a new head); empty = every parameter.")
    export_half: Literal["fp16", "bf16"] | None = Field(
        None, description="At the end of the run, also write its gold weights as safetensors in this half "
        "precision beside the checkpoint, with size and sha256 recorded, kept only if they evaluate within "
        "export_tolerance of the full weights; null = off.")
    export_tolerance: float = Field(
        0.01, gt=0.0, lt=1.0, description="How far the exported half-precision weights may move the early-stopping "
        "metric, relative to the full weights' value (fraction; 0.01 = 1 %).")
    utilisation_every_s: float | None = Field(
        2.0, gt=0.0, description="Sample GPU busy %, GPU memory and power (NVML, with nvidia-ml-py installed) and "
        "the process's CPU % from a background thread this often, into the metric lines, the summary and the report "
        "(s); null = off.")
    starved_alert_share: float | None = Field(
        0.3, gt=0.0, lt=1.0, description="Alert (event thrifty.gpu.starved, and budget.notify) when the steps spend "
        "more than this share of their time waiting for data for starved_alert_minutes (fraction); null = off.")
    starved_alert_minutes: float = Field(
        10.0, gt=0.0, description="How long the data wait must stay over starved_alert_share before the alert "
        "(minutes).")
    profile_steps: int = Field(
        0, ge=0, description="Profile this many steps once per epoch with torch.profiler: the operators' shares of "
        "step time, priced at the run's $/h, go to runs/<run>/profile.json and the report (steps); 0 = off.")

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"adam_betas must both be in [0, 1), e.g. [0.9, 0.999] (got {list(v)})")
        return v

    @model_validator(mode="after")
    def _stop_within_run(self) -> "TrainConfig":
        if self.stop_at_epoch is not None and self.stop_at_epoch > self.max_epochs:
            raise ValueError(f"stop_at_epoch {self.stop_at_epoch} is past max_epochs {self.max_epochs}; set it to "
                             "at most max_epochs, or null to train to the end")
        return self

    @field_validator("init_from")
    @classmethod
    def _init_from_form(cls, v: str | None) -> str | None:
        if v is not None:
            parse_init_from(v)
        return v

    @model_validator(mode="after")
    def _prefixes_need_a_source(self) -> "TrainConfig":
        if self.init_prefixes and self.init_from is None:
            raise ValueError("init_prefixes choose what init_from loads; set init_from too, or empty init_prefixes")
        return self

    @field_validator("checkpoint_every")
    @classmethod
    def _positive_interval(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("checkpoint_every must be a positive number of steps or 'auto'")
        return v

    @field_validator("micro_batch")
    @classmethod
    def _positive_micro_batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("micro_batch must be a positive number of examples or 'auto'")
        return v

    @model_validator(mode="after")
    def _one_step_batch(self) -> "TrainConfig":
        if self.micro_batch == "auto":
            if self.batch_size is None:
                raise ValueError("micro_batch=auto keeps the examples per optimizer step that batch_size says: set "
                                 "train.batch_size (e.g. 256), or a number for micro_batch")
            if self.grad_accum_steps != 1:
                raise ValueError("micro_batch=auto sets the gradient accumulation itself (batch_size / the micro-batch "
                                 "that fits): leave grad_accum_steps at 1")
        elif self.batch_size is not None and self.batch_size != self.micro_batch * self.grad_accum_steps:
            raise ValueError(f"batch_size {self.batch_size} is not micro_batch x grad_accum_steps "
                             f"({self.micro_batch} x {self.grad_accum_steps}); set one of them to match, batch_size "
                             "to null, or micro_batch to auto")
        return self

    def step_batch(self) -> int:
        """Examples in one optimizer step of one process, whatever micro-batch carries them."""
        if self.micro_batch == "auto":
            assert self.batch_size is not None  # the validator's rule
            return self.batch_size
        return self.micro_batch * self.grad_accum_steps

    def examples_per_step(self, world: int) -> int:
        """Examples in one optimizer step across ``world`` processes."""
        return self.step_batch() * world

    def steps_per_epoch(self, n_train: int, world: int) -> int:
        """Optimizer steps in one pass over ``n_train`` examples (a last partial step is dropped unless drop_last
        is false)."""
        if self.drop_last:
            return n_train // self.examples_per_step(world)
        return -(-n_train // self.examples_per_step(world))

    def total_steps(self, n_train: int, world: int) -> int:
        """Optimizer steps the run takes if it never stops early: the one rule the gate and the loop share."""
        total = self.max_epochs * self.steps_per_epoch(n_train, world)
        return min(total, self.max_steps) if self.max_steps is not None else total

    def job_steps(self, n_train: int, world: int) -> int:
        """The step this job ends at: ``stop_at_epoch``'s boundary (a search's rung), else the run's end."""
        total = self.total_steps(n_train, world)
        if self.stop_at_epoch is None:
            return total
        return min(total, self.stop_at_epoch * self.steps_per_epoch(n_train, world))


class SpotTraceMetadata(_Frozen):
    gap_seconds: float = Field(gt=0.0, description="Seconds between ticks (s).")


class SpotTraceConfig(_Frozen):
    """A spot availability trace, inline, in the public format of the Can't-Be-Late data set."""

    metadata: SpotTraceMetadata = Field(description="The trace's tick length.")
    data: list[int] = Field(min_length=1, description="Per tick: spot instances available (1 = there, 0 = gone).")
    prices: list[float] | None = Field(None, description="Optional: spot USD/hour per tick (ignored when emulating).")

    @field_validator("data")
    @classmethod
    def _counts(cls, v: list[int]) -> list[int]:
        if any(x < 0 for x in v):
            raise ValueError("spot_trace data holds counts of available instances: 0, 1, ... (none below 0)")
        return v


class ComputeConfig(_Frozen):
    launcher: Literal["local", "skypilot"] = Field("local", description="local = emulated spot on this machine.")
    clouds: list[Literal["aws", "gcp", "azure", "kubernetes"]] = Field(
        default_factory=lambda: ["aws", "gcp", "azure"], min_length=1,
        description="Clouds SkyPilot may choose from; 'kubernetes' = the cluster of your kubeconfig's current "
        "context (SkyPilot's Kubernetes infra: no spot market, priced at kubernetes_usd_per_gpu_hour).",
    )
    accelerators: list[str] = Field(
        default_factory=lambda: ["A10G:1", "L4:1"], min_length=1, description="Candidate accelerators, NAME:COUNT."
    )
    use_spot: bool = Field(True, description="Rent spot (preemptible) instances (not applicable to kubernetes).")
    kubernetes_usd_per_gpu_hour: float = Field(
        0.0, ge=0.0,
        description="What one GPU-hour on your Kubernetes cluster costs you (USD per GPU-hour): 0 = a cluster you "
        "already pay for; set your internal rate to rank it against the clouds by run cost and meter it against the budget.",
    )
    on_demand_fallback: bool = Field(True, description="Fall back to on-demand when no spot capacity is found.")
    num_nodes: int = Field(1, ge=1, description="Nodes in the job (count).")
    max_restarts: int = Field(3, ge=0, description="Recoveries after failures (not preemptions) before giving up (count).")
    max_hourly_cost: float | None = Field(
        None, gt=0.0, description="SkyPilot: only instances at or below this price per node (spot price for spot) (USD/hour)."
    )
    deadline_h: float | None = Field(
        None, gt=0.0,
        description="Optional: the run must finish within this many hours of launch, start-up included (hours). "
        "Candidates whose estimated runtime exceeds it are left out; with none left the run is refused. With "
        "use_spot, deadline_policy moves the job between spot and on-demand to finish in time.",
    )
    deadline_policy: Literal["uniform_progress", "greedy", "on_demand"] = Field(
        "uniform_progress",
        description="With deadline_h and use_spot, how the watch loop meets the deadline. uniform_progress: spot "
        "while progress keeps pace with an even spread of the work to the deadline; on-demand when spot capacity is "
        "gone and progress falls behind, or when the slack left is down to a changeover plus the safety margin; back "
        "to spot once ahead by deadline_hysteresis_s. greedy: spot while the slack lasts, then on-demand to the end. "
        "on_demand: on-demand throughout.",
    )
    deadline_changeover_s: float | None = Field(
        None, gt=0.0,
        description="What moving the job between spot and on-demand costs: a stop with a checkpoint, start-up and "
        "resume (s). null = measured on this run's attempts, at least the estimate's start-up.",
    )
    deadline_safety_margin_s: float | None = Field(
        None, ge=0.0,
        description="Slack kept beyond one changeover before the run moves to on-demand for good (s). null = one "
        "changeover.",
    )
    deadline_hysteresis_s: float | None = Field(
        None, ge=0.0,
        description="How far ahead of the even spread of the work (in seconds of work) the run must be to leave "
        "on-demand for spot; doubled after each move to spot that found no capacity (s). null = two changeovers.",
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
    preempt_after_steps: int | None = Field(None, ge=1, description="Local launcher: inject a preemption right after this optimizer step, however fast the run trains (steps).")
    preempt_mode: Literal["sigterm", "kill"] = Field("sigterm", description="Local launcher: notice+grace (sigterm) or hard kill.")
    preempt_grace_s: float = Field(30.0, gt=0.0, description="Local launcher: seconds between SIGTERM and SIGKILL (s).")
    preempt_node: int | None = Field(
        None, ge=0, description="Local launcher, num_nodes > 1: the node (0-based) the injected preemption hits; "
        "null = the last one.")
    spot_trace: Union[str, SpotTraceConfig, None] = Field(
        None, description="Local launcher: spot capacity follows this availability trace from the run's first job: "
        "a JSON file path, or inline, in the public format {metadata: {gap_seconds: N}, data: [1, 1, 0, ...]} (1 = "
        "spot there, 0 = gone; counts for several nodes). The spot job is preempted when it goes and waits, unbilled, "
        "until it is back; after the last tick its value holds. null = spot always there.")

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
    def _trace_is_local(self) -> "ComputeConfig":
        if self.spot_trace is not None and self.launcher != "local":
            raise ValueError("spot_trace emulates spot capacity for the local launcher; remove it with "
                             f"launcher={self.launcher} (the cloud's own capacity decides there)")
        return self

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
    prices: Literal["auto", "live", "table"] = Field(
        "auto",
        description="Where dollars per hour come from. live: the clouds' own sources (EC2 spot price history, Azure's "
        "Retail Prices API, SkyPilot's catalog), cached in the store, the shipped table last; table: the shipped table "
        "only (offline); auto: live on a cloud, the table for the local launcher's emulated instance.",
    )
    spot_price_max_age_s: float = Field(
        3600.0, gt=0.0,
        description="A spot price older than this is read again from its source: before a launch, by the watch loop "
        "and by the node while it trains, which meters each interval at the price then in force (s). On-demand "
        "prices are read again daily.",
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
