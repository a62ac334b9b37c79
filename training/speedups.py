"""The loop's in-loop speed levers: torch.compile (``train.compile``), TF32 (``train.tf32``) and the fused AdamW.

Faster steps are cheaper runs. Each lever is decided here, applied here, and said in the run's summary
(``speedups``): what was used, why, and where its setting came from (the config, a fleet variable, the default).
Checkpoints never see a lever: the loop saves the uncompiled module, so a state written with compile on loads with
it off and the other way round (older files holding torch.compile's ``_orig_mod.`` prefix load too).

Nothing here imports ``torch._dynamo`` unless ``train.compile`` is on: an eager run keeps its start-up
(``training.lazy_dynamo``).
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Callable

import torch

from thrifty.config import RunConfig

log = logging.getLogger("thrifty.train")

COMPILED_PREFIX = "_orig_mod."  # what torch.compile's wrapper puts before every key of its module's state_dict
TF32_MIN_CAPABILITY = (8, 0)  # Ampere: the first GPUs with TF32 tensor cores
STEADY_STEPS = 5  # steps after the first whose median is a compiled step's cost without its compilation


def tf32_decision(device_type: str, capability: tuple[int, int] | None, precision: str, setting: bool) -> tuple[bool, str]:
    """Whether TF32 matmuls and convolutions are used, and why: only with fp32 precision (under bf16/fp16 autocast
    the products are half precision already) on a CUDA GPU of compute capability 8.0 or newer (the first with TF32
    tensor cores), and only while ``train.tf32`` allows it. A pure function: testable without a GPU."""
    if not setting:
        return False, "off: train.tf32 is false"
    if device_type != "cuda":
        return False, f"not applicable on {device_type}: TF32 is a GPU tensor-core format"
    if precision != "fp32":
        return False, f"not applicable under {precision} autocast: its products are {precision} already"
    if capability is None or tuple(capability) < TF32_MIN_CAPABILITY:
        cap = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return False, f"not available: compute capability {cap} < 8.0 has no TF32 tensor cores"
    return True, f"on: fp32 on compute capability {capability[0]}.{capability[1]} (train.tf32 is true)"


def fused_optimizer_ok(params: list[torch.nn.Parameter]) -> bool:
    """The default AdamW runs fused (one kernel for every parameter's update) where every parameter is a floating
    point tensor on a CUDA GPU; on CPU the foreach implementation is torch's own best."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def uses_fused(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (the default AdamW, or a recipe's own) runs fused."""
    return bool(optimizer.defaults.get("fused"))


def uncompiled_keys(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with torch.compile's ``_orig_mod.`` removed from its keys: a model's state written by an older
    version from a compiled model loads into the uncompiled module (and so into a compiled one too)."""
    if not any(COMPILED_PREFIX in k for k in state_dict):
        return state_dict
    return {k.replace(COMPILED_PREFIX, ""): v for k, v in state_dict.items()}


class Levers:
    """The levers of one training attempt: decided before the first step, measured during the first steps."""

    def __init__(self, cfg: RunConfig, device: torch.device, precision: str):
        tc = cfg.train
        self.compile = tc.compile
        self.sources = cfg.setting_sources()
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        self.tf32, self.tf32_why = tf32_decision(device.type, capability, precision, tc.tf32)
        if device.type == "cuda":
            # process-wide switches; set both ways, so a process that trains twice never inherits the last run's
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32
        self._first_s: float | None = None
        self._steady: list[float] = []
        self.compile_s: float | None = None  # this attempt's compilation, once measured

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the steps run: ``model`` compiled (train.compile on), else itself. The loop keeps saving the
        uncompiled module, so checkpoints carry no ``_orig_mod.`` keys."""
        if self.compile != "on":
            return model
        log.info("train.compile on (from %s): the first step compiles the model", self.sources.get("compile"))
        return torch.compile(model)

    def stepped(self, step: int, step_s: float, emit: Callable[[dict[str, Any]], None]) -> float:
        """Account one step's time; returns the seconds of compilation measured with it (0 but once). A compiled
        step's compilation is the first step's extra time over the median of the next few."""
        if self.compile != "on" or self.compile_s is not None:
            return 0.0
        if self._first_s is None:
            self._first_s = step_s
            return 0.0
        self._steady.append(step_s)
        if len(self._steady) < STEADY_STEPS:
            return 0.0
        return self._measured(step, emit)

    def finish(self, step: int, emit: Callable[[dict[str, Any]], None]) -> float:
        """At an attempt's end: the compilation measured from what steps there were (a short job)."""
        if self.compile != "on" or self.compile_s is not None or self._first_s is None:
            return 0.0
        return self._measured(step, emit)

    def _measured(self, step: int, emit: Callable[[dict[str, Any]], None]) -> float:
        steady = statistics.median(self._steady) if self._steady else 0.0  # no later step: all of it is counted
        self.compile_s = max(0.0, self._first_s - steady)
        emit({"event": "compile", "step": step, "compile_s": round(self.compile_s, 3),
              "first_step_s": round(self._first_s, 4), "step_s": round(steady, 5)})
        log.info("torch.compile: %.1f s of compilation in the first step (%.3f s; later steps %.4f s)", self.compile_s,
                 self._first_s, steady)
        return self.compile_s

    def summary(self, optimizer: torch.optim.Optimizer, compile_s_total: float) -> dict[str, Any]:
        """The run summary's ``speedups``: what was used, why, and where the fleet settings came from."""
        return {"compile": self.compile, "compile_s": round(compile_s_total, 3), "tf32": self.tf32,
                "tf32_why": self.tf32_why, "fused_optimizer": uses_fused(optimizer), "settings_from": self.sources}
