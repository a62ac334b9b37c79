"""How fast each accelerator trains a run's model: measured step times from the store first, a shipped table after.

A candidate's run cost is its rate times its runtime, so ranking hardware needs a speed per
accelerator for *this* model. In order of trust:

1. **measured**: the store's runs of the same model (same :func:`speed_key`) on that accelerator. A
   metrics file's ``start`` record says the model and device; the ledger attempt billing at that
   moment says the instance, hence the accelerator; its ``samples_per_s`` lines say the speed.
2. **scaled from a measurement**: another accelerator measured for this model, times the ratio of
   the two accelerators' shipped relative speeds.
3. **assumed**: the smoke test's CPU speed times an assumed speed-up of the reference GPU (A10G)
   over this project's CPU smoke test, times the accelerator's relative speed.
4. **relative only** (``thrifty plan`` with neither): the table's ratios, so candidates rank by
   dollars per unit of work but no runtime is known.

Speeds are examples per second of one GPU; a job's speed is that times its GPUs (linear scaling,
as the budget gate assumes).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections import defaultdict

from pydantic import BaseModel, ConfigDict, Field

from thrifty.config import ConfigError, RunConfig
from thrifty.money.ledger import read_attempts
from thrifty.money.prices import accelerator_of
from thrifty.runs import read_jsonl
from thrifty.storage import Store

REFERENCE = "A10G"
# Assumed: one A10G trains this project's models this many times faster than its CPU smoke test (same code, same
# batch); the ratio the budget gate has always used. A measured run replaces it.
CPU_SPEEDUP_OF_REFERENCE = 16.0

# Relative speed prior per GPU: the geometric mean of the dense bf16/fp16 tensor TFLOPS ratio and the memory
# bandwidth ratio to an A10G (NVIDIA datasheets, no sparsity). TFLOPS alone overstate fast GPUs for the small,
# often memory-bound models people train cheaply; bandwidth alone understates them. A prior, not a benchmark.
# name: (dense bf16/fp16 TFLOPS, memory GB/s, note)
GPU_SPECS: dict[str, tuple[float, float, str]] = {
    "T4": (65.0, 320.0, "Turing, fp16 tensor cores, GDDR6"),
    "L4": (121.0, 300.0, "Ada, bf16, GDDR6 (compute-rich, bandwidth-poor)"),
    "A10G": (70.0, 600.0, "Ampere, AWS's A10 variant: the reference"),
    "A10": (125.0, 600.0, "Ampere, bf16, GDDR6"),
    "V100": (125.0, 900.0, "Volta SXM2, fp16 tensor cores (no bf16), HBM2"),
    "L40S": (362.0, 864.0, "Ada, bf16, GDDR6"),
    "A100": (312.0, 1555.0, "Ampere 40 GB, bf16, HBM2"),
    "A100-80GB": (312.0, 2039.0, "Ampere 80 GB, bf16, HBM2e"),
    "H100": (989.0, 3350.0, "Hopper SXM, bf16, HBM3"),
    "H200": (989.0, 4800.0, "Hopper SXM, bf16, HBM3e"),
}
_REF_TFLOPS, _REF_GBPS, _ = GPU_SPECS[REFERENCE]
RELATIVE_SPEED: dict[str, float] = {
    name: round(math.sqrt(tf / _REF_TFLOPS * bw / _REF_GBPS), 2) for name, (tf, bw, _) in GPU_SPECS.items()}


def relative_speed(name: str) -> float | None:
    """The table's speed of one ``name`` GPU relative to an A10G (None when the table does not know it)."""
    return next((v for k, v in RELATIVE_SPEED.items() if k.lower() == name.lower()), None)


def _table_note(name: str) -> str:
    tf, bw, note = next(v for k, v in GPU_SPECS.items() if k.lower() == name.lower())
    return f"{relative_speed(name):.2f}x an A10G by the table ({tf:g} TFLOPS, {bw:g} GB/s: {note})"


def speed_key(cfg: RunConfig) -> str:
    """What sets examples per second on a given GPU: the model (recipe and its params), the micro-batch, the precision.
    Runs sharing it measure each other's hardware."""
    what = {"recipe": cfg.recipe, "recipe_params": cfg.recipe_params, "micro_batch": cfg.train.micro_batch,
            "precision": cfg.train.precision}
    if cfg.train.compile != "off":  # a compiled model's speed (and compilation) is its own; eager keys stay as they were
        what["compile"] = cfg.train.compile
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def model_key(cfg: RunConfig) -> str:
    """:func:`speed_key` without the precision: runs of one model in fp32 and in bf16 share it, so the store can tell
    what mixed precision bought on an accelerator (the savings' precision lever)."""
    what = {"recipe": cfg.recipe, "recipe_params": cfg.recipe_params, "micro_batch": cfg.train.micro_batch}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


class Measured(BaseModel):
    """One accelerator's measured speed for one model, out of the store's runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    accelerator: str  # NAME
    examples_per_s_per_gpu: float  # the median over logged windows
    windows: int  # metric lines it is the median of
    runs: list[str]
    train_examples: int | None = None  # the data set's size, as the runs saw it


class Speeds(BaseModel):
    """Examples per second of one GPU of each accelerator for a run's model, and how each was known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_gpu: dict[str, float]  # NAME -> examples/s of one GPU (relative units when not ``absolute``)
    how: dict[str, str]
    absolute: bool = True  # False: table ratios only; a ranking per unit of work, no runtime
    measured: list[str] = Field(default_factory=list)  # the names measured in the store

    def of(self, accelerator: str) -> float:
        """Examples/s of one GPU of ``accelerator`` (NAME or NAME:COUNT)."""
        return self.per_gpu[accelerator.partition(":")[0]]

    def explain(self, accelerator: str) -> str:
        return self.how[accelerator.partition(":")[0]]


def speeds_for(names: list[str], measured: dict[str, Measured], cpu_examples_per_s: float | None = None) -> Speeds:
    """Each accelerator's speed: measured, else scaled from the best-measured one, else the smoke test's CPU speed
    scaled by the table, else the table's ratios alone. ConfigError for one neither measured nor in the table."""
    names = list(dict.fromkeys(n.partition(":")[0] for n in names))
    unknown = [n for n in names if n not in measured and relative_speed(n) is None]
    if unknown:
        raise ConfigError(
            f"'compute.accelerators': no speed is known for {', '.join(unknown)}: the store has no run of this model "
            f"on it and the throughput table (thrifty/money/throughput.py) covers {', '.join(RELATIVE_SPEED)}. Remove it, "
            "or train once on it so the store measures it.")
    ref = max(measured.values(), key=lambda m: m.windows) if measured else None
    if ref is not None and relative_speed(ref.accelerator) is None:  # measured but not in the table: cannot scale
        ref = next((m for m in sorted(measured.values(), key=lambda m: -m.windows)
                    if relative_speed(m.accelerator) is not None), None)
    per_gpu: dict[str, float] = {}
    how: dict[str, str] = {}
    for n in names:
        if n in measured:
            m = measured[n]
            per_gpu[n] = m.examples_per_s_per_gpu
            how[n] = (f"measured: {m.examples_per_s_per_gpu:.4g} examples/s per GPU, the median of {m.windows} "
                      f"logged window(s) of run(s) {', '.join(m.runs)} in the store")
        elif ref is not None:
            ratio = relative_speed(n) / relative_speed(ref.accelerator)
            per_gpu[n] = ref.examples_per_s_per_gpu * ratio
            how[n] = (f"the measured {ref.accelerator} ({ref.examples_per_s_per_gpu:.4g} examples/s per GPU) x {ratio:.2f}, "
                      f"the table's ratio ({n}: {_table_note(n)})")
        elif cpu_examples_per_s is not None:
            per_gpu[n] = cpu_examples_per_s * CPU_SPEEDUP_OF_REFERENCE * relative_speed(n)
            how[n] = (f"the smoke test's CPU step time scaled by an assumed {CPU_SPEEDUP_OF_REFERENCE * relative_speed(n):g}x "
                      f"per {n} ({CPU_SPEEDUP_OF_REFERENCE:g}x for an A10G; {n}: {_table_note(n)})")
        else:
            per_gpu[n] = relative_speed(n)
            how[n] = f"no measurement or smoke test: {_table_note(n)}"
    absolute = ref is not None or cpu_examples_per_s is not None or all(n in measured for n in names)
    return Speeds(per_gpu=per_gpu, how=how, absolute=absolute, measured=sorted(n for n in names if n in measured))


# ---------------------------------------------------------------- reading the store's measurements


def measured_speeds(store: Store, key: str, now: float | None = None, *, field: str = "speed_key",
                    precision: str | None = None) -> dict[str, Measured]:
    """Per accelerator NAME, the measured speed of the model ``key`` (:func:`speed_key`, or :func:`model_key` with
    ``field="model_key"``, then only runs that trained in ``precision``) over every run in the store.

    A metrics file counts when its ``start`` record names this model on a GPU and a ledger attempt of the same run on
    a cloud instance of known accelerator was billing when it started (the local launcher trains on this CPU while it
    meters an emulated instance: never a GPU speed). The first logged window of each file is dropped (warm-up).
    """
    now = time.time() if now is None else now
    metrics_by_run: dict[str, list[str]] = defaultdict(list)
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if len(parts) == 4 and parts[2] == "metrics" and parts[3].endswith(".jsonl"):
            metrics_by_run[parts[1]].append(obj.key)
    rates: dict[str, list[float]] = defaultdict(list)
    runs: dict[str, set[str]] = defaultdict(set)
    examples: dict[str, int] = {}
    for run_id, keys in sorted(metrics_by_run.items()):
        attempts = [a for a in read_attempts(store, run_id, now) if a.region != "local"]
        if not attempts:
            continue
        for k in sorted(keys):
            records = read_jsonl(store, k)
            start = next((r for r in records if r.get("event") == "start"), None)
            if start is None or start.get(field) != key or str(start.get("device", "cpu")).startswith("cpu"):
                continue
            if precision is not None and start.get("precision") != precision:
                continue
            t = float(start.get("time_unix", 0.0))
            attempt = next((a for a in reversed(attempts)
                            if a.started_unix - 60.0 <= t <= (a.ended_unix if a.ended_unix is not None else now)), None)
            accelerator = accelerator_of(attempt.cloud, attempt.instance) if attempt else None
            if accelerator is None:
                continue
            name = accelerator.partition(":")[0]
            gpus = max(1, int(start.get("world_size") or 1))
            window = [float(r["samples_per_s"]) / gpus for r in records
                      if r.get("event") is None and r.get("samples_per_s")][1:]
            if window:
                rates[name].extend(window)
                runs[name].add(run_id)
                if start.get("train_examples"):
                    examples[name] = int(start["train_examples"])
    return {n: Measured(accelerator=n, examples_per_s_per_gpu=statistics.median(v), windows=len(v),
                        runs=sorted(runs[n]), train_examples=examples.get(n)) for n, v in rates.items()}


def measured_train_examples(measured: dict[str, Measured]) -> int | None:
    """The data set's size as measured runs of this model saw it (for a plan that has not preprocessed)."""
    return next((m.train_examples for m in measured.values() if m.train_examples), None)
