"""Utilisation in dollars, the pure parts: MFU, the GPU-starvation rule, and right-size advice.

The node measures (``training.telemetry``), the watch loop alerts (``tasks.alerts``), the report advises; the
rules they share live here, free of torch, Prefect and clocks (the time is always passed in), so scripted
readings test them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from thrifty.money.devices import SOURCE, device_spec
from thrifty.money.pricing import INSTANCES, parse_accelerator
from thrifty.money.throughput import relative_speed
from thrifty.numbers import money

IDLE_BUSY_PCT = 50.0  # a GPU busy less than this share of the time on average was too big (or starved) for the run
MEMORY_HEADROOM = 1.2  # a smaller GPU must hold the peak memory seen with this margin (allocator caches, spikes)


# ---------------------------------------------------------------- MFU


def model_flops(flops_per_example: float | None, examples: int, seconds: float, device_name: str | None,
                precision: str) -> dict[str, float | str]:
    """Achieved TFLOPS over ``seconds`` of steps, and the fraction of the device's peak in ``precision`` where the
    table knows one (never on a CPU: the fraction is left out, the achieved rate stays)."""
    if not flops_per_example or seconds <= 0 or examples <= 0:
        return {}
    achieved = flops_per_example * examples / seconds / 1e12
    out: dict[str, float | str] = {"achieved_tflops": round(achieved, 6)}
    spec = device_spec(device_name) if device_name else None
    peak = spec.peak_tflops(precision) if spec else None
    if peak:
        out.update(peak_tflops=peak, mfu=round(achieved / peak, 5),
                   mfu_basis=f"{spec.name} {precision} peak {peak:g} TFLOPS ({SOURCE})")
    return out


# ---------------------------------------------------------------- starvation


@dataclass(frozen=True)
class Starvation:
    since_unix: float  # the first reading of the spell over the share
    minutes: float  # how long it has lasted by ``now``
    share: float  # the mean data-wait share over the spell
    usd_per_hour: float  # what the waiting costs: share x the run's $/h

    def message(self, run_id: str) -> str:
        return (f"run {run_id!r}: the GPU has waited on data {self.share:.0%} of its step time for {self.minutes:.0f} "
                f"min; that waiting costs about {money(self.usd_per_hour)}/h. More data-loading workers, a faster disk "
                "or a preprocessing cache hit would turn it into training")


def starving_since(readings: Iterable[tuple[float, float]], share: float) -> tuple[float, float] | None:
    """(start, mean share) of the trailing spell of readings over ``share``; None when the newest is not over it.
    ``readings``: (time_unix, data-wait share) of each metric line, oldest first."""
    spell: list[tuple[float, float]] = []
    for t, s in readings:
        spell = spell + [(t, s)] if s > share else []
    if not spell:
        return None
    return spell[0][0], sum(s for _, s in spell) / len(spell)


class StarvationWatch:
    """Says once per spell when the data-wait share has stayed over ``share`` for ``minutes``; a reading under it
    ends the spell (and re-arms the alert)."""

    def __init__(self, share: float | None, minutes: float):
        self.share, self.minutes = share, minutes
        self._alerted: float | None = None  # the start of the spell already alerted

    def check(self, readings: Iterable[tuple[float, float]], now: float, usd_per_hour: float) -> Starvation | None:
        if self.share is None:
            return None
        spell = starving_since(readings, self.share)
        if spell is None:
            self._alerted = None
            return None
        start, mean = spell
        if start == self._alerted or now - start < self.minutes * 60.0:
            return None
        self._alerted = start
        return Starvation(start, (now - start) / 60.0, mean, mean * usd_per_hour)


def wait_readings(records: Iterable[dict]) -> list[tuple[float, float]]:
    """(time_unix, data_wait_share) of the metric lines that carry one."""
    return [(r["time_unix"], r["data_wait_share"]) for r in records
            if r.get("event") is None and "data_wait_share" in r and "time_unix" in r]


# ---------------------------------------------------------------- right-size advice


@dataclass(frozen=True)
class Advice:
    instance: str
    accelerator: str
    usd: float  # what the run would have cost there
    actual_usd: float
    line: str


def right_size(accelerator: str, busy_pct: float | None, memory_peak_gb: float | None, runtime_h: float,
               actual_usd: float, spot: bool, clouds: Iterable[str]) -> Advice | None:
    """The cheapest instance of the price table that fits the run and would have cost less, when the GPU was mostly
    idle (busy under ``IDLE_BUSY_PCT``); None otherwise.

    Assumption (said in the line): an idle GPU is waiting on something else, so a GPU k times slower stretches the
    run only where it would be busier than the whole step, i.e. by max(1, busy x k); speeds are the table's ratios
    (``thrifty.money.throughput``), scaled from this run's measured runtime."""
    name, count = parse_accelerator(accelerator)
    here = relative_speed(name)
    if busy_pct is None or busy_pct >= IDLE_BUSY_PCT or here is None or runtime_h <= 0:
        return None
    best: Advice | None = None
    for row in INSTANCES:
        cand, n = parse_accelerator(row.accelerator)
        price = row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour
        spec, speed = device_spec(cand), relative_speed(cand)
        if row.cloud not in clouds or n != count or price is None or spec is None or speed is None:
            continue
        if memory_peak_gb is not None and spec.memory_gb < memory_peak_gb * MEMORY_HEADROOM:
            continue
        stretch = max(1.0, busy_pct / 100.0 * here / speed)
        usd = runtime_h * stretch * price
        if usd < actual_usd * 0.95 and (best is None or usd < best.usd):  # under 5 % is noise, not advice
            best = Advice(row.instance, row.accelerator, usd, actual_usd, "")
    if best is None:
        return None
    line = (f"the GPU was busy {busy_pct:.0f} % of the time: on {best.instance} ({best.accelerator}"
            f"{', spot' if spot else ''}) this run would have cost about {money(best.usd)} instead of "
            f"{money(actual_usd)}, assuming a slower GPU only stretches the run where it would be busier than the whole "
            "step (runtime x max(1, busy share x speed ratio), speeds from the table's ratios)")
    return Advice(best.instance, best.accelerator, best.usd, actual_usd, line)
