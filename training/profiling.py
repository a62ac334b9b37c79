"""The cost map: torch.profiler over ``train.profile_steps`` steps once per epoch, operators by share of step time.

Each epoch's profile skips the epoch's first step (it builds the data order), warms up one, records N, and is
closed: between windows no profiler exists, so its cost is those N + 2 steps per epoch. The operators' self times
(device time on a GPU, CPU time otherwise), summed over every window, over the profiled steps' wall time give
each one's share of a step; priced at the run's $/h and projected over the run's steps they go to
``runs/<run>/profile.json``, which the report shows. ``train.profile_steps = 0`` builds nothing at all.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from typing import Any

import torch

from thrifty.runs import run_key
from thrifty.storage import Store

log = logging.getLogger("thrifty.train")
TOP = 15  # operators kept in profile.json


class CostMap:
    def __init__(self, steps: int, store: Store, run_id: str, total_steps: int, usd_per_hour: float | None,
                 device: torch.device):
        self.steps, self.store, self.run_id = steps, store, run_id
        self.total_steps, self.usd_per_hour = total_steps, usd_per_hour
        self.cuda = device.type == "cuda"
        self._prof: Any = None
        self._epoch_done = -1  # the last epoch a window was opened in
        self._seen = 0  # steps the open window has stepped through
        self._t0 = 0.0
        self._active_s = 0.0  # wall time of recorded steps, all windows
        self._recorded = 0  # recorded steps, all windows
        self._self_us: dict[str, float] = defaultdict(float)
        self._calls: dict[str, int] = defaultdict(int)
        self.windows = 0

    @classmethod
    def maybe(cls, steps: int, *args: Any) -> "CostMap | None":
        """None when off: the loop then never touches torch.profiler."""
        return cls(steps, *args) if steps > 0 else None

    def begin(self, epoch: int) -> None:
        """Before a step: open this epoch's window if none was yet."""
        if self._prof is None and epoch != self._epoch_done:
            self._epoch_done = epoch
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(
                activities=activities, record_shapes=False, on_trace_ready=self._collect,
                schedule=torch.profiler.schedule(wait=1, warmup=1, active=self.steps, repeat=1))
            self._prof.__enter__()
            self._seen = 0
        if self._prof is not None and self._seen >= 2:  # a recorded step: its wall time is the share's denominator
            self._t0 = time.perf_counter()

    def end(self) -> None:
        """After a step (the device synchronised by the loss's .item())."""
        if self._prof is None:
            return
        if self._seen >= 2:
            self._active_s += time.perf_counter() - self._t0
            self._recorded += 1
        self._seen += 1
        self._prof.step()  # the last recorded step hands the window to _collect
        if self._seen >= self.steps + 2:
            self._prof.__exit__(None, None, None)
            self._prof = None
            self.windows += 1
            self.write()

    def close(self) -> None:
        """A run that ends inside a window: drop it (a partial window's shares would mislead)."""
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None

    def _collect(self, prof: Any) -> None:
        # summed by hand, as key_averages() would: it takes ~20x longer (0.4 s a window for a small GPT on a CPU)
        cpu = torch.autograd.DeviceType.CPU
        for ev in prof.events():
            if getattr(ev, "device_type", cpu) != cpu:  # a kernel's time is counted in its operator's self time
                continue
            if ev.key.startswith("ProfilerStep"):  # the profiler's own span from one step() to the next, not an
                continue  # operator: its self time is the loop between steps (more than a step on a loaded machine)
            us = (getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0.0)
                  if self.cuda else ev.self_cpu_time_total)
            if us > 0:
                self._self_us[ev.key] += float(us)
                self._calls[ev.key] += 1

    def report(self) -> dict[str, Any]:
        """What profile.json holds: the top operators, each with its share of a step and its projected dollars."""
        n = max(self._recorded, 1)
        step_s = self._active_s / n
        run_h = self.total_steps * step_s / 3600.0
        ops = []
        for name, us in sorted(self._self_us.items(), key=lambda kv: -kv[1])[:TOP]:
            share = us / 1e6 / self._active_s if self._active_s > 0 else 0.0
            ops.append({"name": name, "share": round(share, 5), "ms_per_step": round(us / 1e3 / n, 4),
                        "calls_per_step": round(self._calls[name] / n, 2),
                        **({"projected_usd": round(share * run_h * self.usd_per_hour, 6)}
                           if self.usd_per_hour else {})})
        return {"run_id": self.run_id, "windows": self.windows, "steps_profiled": self._recorded,
                "profiled_step_time_s": round(step_s, 6), "time_basis": "device" if self.cuda else "cpu",
                "run_steps": self.total_steps, "usd_per_hour": self.usd_per_hour, "ops": ops}

    def write(self) -> None:
        try:
            self.store.put_bytes(run_key(self.run_id, "profile.json"), json.dumps(self.report(), indent=1).encode())
        except Exception as exc:  # noqa: BLE001 - a map that could not be written never stops training
            log.warning("could not write the cost map (runs/%s/profile.json): %s", self.run_id, exc)
