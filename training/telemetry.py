"""Utilisation on the node: GPU busy %, memory and power (NVML), process CPU %, sampled off the step path.

A daemon thread reads the counters every ``train.utilisation_every_s``; the loop hands over its own measurements
(step time, data wait, checkpoint time) once per metric line, and gets back that window's aggregates. NVML
(``pip install nvidia-ml-py``) is imported lazily: without it, or without a GPU, the GPU fields are absent,
never an error. Process CPU % is CPU time over wall time (100 = one core busy), as ``top`` shows it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger("thrifty.train")

Reading = dict[str, float]  # gpu_busy_pct, gpu_memory_used_gb, gpu_power_w: whichever the device gives


class Nvml:
    """One GPU's counters through NVML; ``read()`` is {} when NVML or the GPU is not there, and after any error."""

    def __init__(self, index: int = 0):
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml  # nvidia-ml-py: optional, and absent on CPU machines

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - no NVML, no driver, no GPU: the GPU fields are simply absent
            log.debug("NVML unavailable (%s: %s): no GPU utilisation fields", type(exc).__name__, exc)

    def read(self) -> Reading:
        if self._nvml is None:
            return {}
        nv, h = self._nvml, self._handle
        out: Reading = {}
        for key, get in (("gpu_busy_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
                         ("gpu_memory_used_gb", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 1e9),
                         ("gpu_power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)):  # mW
            try:
                out[key] = get()
            except Exception:  # noqa: BLE001 - a counter this GPU does not report (power on some cards)
                continue
        return out


class Telemetry:
    """Samples in the background, aggregates per metric window and over the attempt. Thread-safe: the sampler
    thread adds readings, the training thread takes windows."""

    FIELDS = ("gpu_busy_pct", "gpu_memory_used_gb", "gpu_power_w", "cpu_pct")

    def __init__(self, every_s: float | None, read_gpu: Callable[[], Reading] | None = None,
                 clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time,
                 checkpoint_total_s: float = 0.0):
        self.every_s = every_s
        self._read_gpu = read_gpu
        self._clock, self._cpu_clock = clock, cpu_clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window = self._empty()
        self._window_readings = 0  # readings in ``_window``: most windows (a few steps) have none
        self._total = self._empty()
        self._peak_memory: float | None = None
        self._last = (clock(), cpu_clock())
        self.steps = 0
        self.step_s = self.wait_s = self.checkpoint_s = 0.0
        self._checkpoint_total_s = checkpoint_total_s  # the loop's running total (a resume's starts where it was)

    @staticmethod
    def _empty() -> dict[str, list[float]]:
        return {k: [0.0, 0.0] for k in Telemetry.FIELDS}  # field -> [sum, count]

    def start(self) -> "Telemetry":
        if self.every_s is None:
            return self  # off: no thread, no NVML
        if self._read_gpu is None:
            self._read_gpu = Nvml().read
        self._last = (self._clock(), self._cpu_clock())
        self._thread = threading.Thread(target=self._run, daemon=True, name="thrifty-telemetry")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        """One reading: the GPU's counters and the process's CPU share since the last one."""
        now, cpu = self._clock(), self._cpu_clock()
        t0, c0 = self._last
        self._last = (now, cpu)
        reading = dict(self._read_gpu() if self._read_gpu else {})
        if now > t0:
            reading["cpu_pct"] = 100.0 * (cpu - c0) / (now - t0)
        with self._lock:
            for key, value in reading.items():
                for acc in (self._window, self._total):
                    acc[key][0] += value
                    acc[key][1] += 1
            self._window_readings += 1
            if "gpu_memory_used_gb" in reading:
                self._peak_memory = max(self._peak_memory or 0.0, reading["gpu_memory_used_gb"])

    def window(self, steps: int, step_s: float, wait_s: float, checkpoint_total_s: float = 0.0) -> dict[str, float]:
        """This metric window's fields: the sampled means since the last window, and the shares of step time spent
        waiting for data and on checkpoints (``checkpoint_total_s``: the loop's running checkpoint time on the step
        path; this window's is what it grew by)."""
        checkpoint_s = max(0.0, checkpoint_total_s - self._checkpoint_total_s)
        self._checkpoint_total_s = checkpoint_total_s
        self.steps += steps
        self.step_s += step_s
        self.wait_s += wait_s
        self.checkpoint_s += checkpoint_s
        out: dict[str, float] = {}
        if self._window_readings:  # (read without the lock: a reading that lands now is in the next window)
            with self._lock:
                acc, self._window, self._window_readings = self._window, self._empty(), 0
            out = {k: round(s / n, 3) for k, (s, n) in acc.items() if n}
        if step_s > 0:
            out["data_wait_share"] = round(wait_s / step_s, 4)
            out["checkpoint_share"] = round(checkpoint_s / (step_s + checkpoint_s), 4)
        return out

    def averages(self) -> dict[str, float]:
        """The attempt's means (for the run summary), the peak GPU memory, and the step-time shares."""
        with self._lock:
            out: dict[str, float] = {k: round(s / n, 3) for k, (s, n) in self._total.items() if n}
            if self._peak_memory is not None:
                out["gpu_memory_peak_gb"] = round(self._peak_memory, 3)
        if self.step_s > 0:
            out["data_wait_share"] = round(self.wait_s / self.step_s, 4)
            out["checkpoint_share"] = round(self.checkpoint_s / (self.step_s + self.checkpoint_s), 4)
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def summary_record(telemetry: Telemetry, flops_per_example: float | None, examples_per_step: int,
                   device: Any, precision: str) -> dict[str, Any]:
    """The run summary's ``utilisation``: the attempt's averages, and achieved TFLOPS with the MFU where the recipe
    states its FLOPs (per process: ``examples_per_step`` is one rank's)."""
    from thrifty.money.utilisation import model_flops

    name = None
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
    out: dict[str, Any] = {**telemetry.averages(), "device_name": name or "cpu"}
    out.update(model_flops(flops_per_example, telemetry.steps * examples_per_step, telemetry.step_s, name, precision))
    return out
