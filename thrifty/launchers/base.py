"""The Launcher protocol (submit, status, cancel, attempts) and what every launcher shares."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol

from thrifty.config import ENV_VAR, ConfigError, RunConfig


class LaunchError(RuntimeError):
    """A job could not be launched or failed for good."""


class JobState(str, Enum):
    """SkyPilot managed-job states, which the local launcher emulates."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class Attempt:
    """One rented instance's life inside a job: a ledger row."""

    job_id: str
    number: int  # 1 for the first attempt, +1 per recovery
    cloud: str
    region: str
    instance: str
    spot: bool
    usd_per_hour: float  # price of one node
    nodes: int
    started_unix: float
    ended_unix: float | None = None
    end_reason: str | None = None  # succeeded | preempted | failed | cancelled; None while running
    exit_code: int | None = None
    task_id: str | None = None  # SkyPilot's SKYPILOT_TASK_ID (stable across a job's recoveries); None locally

    def hours(self, now: float | None = None) -> float:
        end = self.ended_unix if self.ended_unix is not None else (now or time.time())
        return max(0.0, end - self.started_unix) / 3600.0

    def cost_usd(self, now: float | None = None) -> float:
        return self.hours(now) * self.usd_per_hour * self.nodes

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JobStatus:
    job_id: str
    state: JobState
    attempts: list[Attempt] = field(default_factory=list)
    message: str = ""

    @property
    def recoveries(self) -> int:
        return max(0, len(self.attempts) - 1)


class Launcher(Protocol):
    def submit(self, cfg: RunConfig, run_id: str) -> str: ...
    def status(self, job_id: str) -> JobStatus: ...
    def cancel(self, job_id: str) -> None:
        """Graceful: the job gets SIGTERM, checkpoints, and exits."""
        ...
    def attempts(self, job_id: str) -> list[Attempt]: ...


def node_env(cfg: RunConfig, run_id: str) -> dict[str, str]:
    """The environment every training node gets: the RunConfig and the run id it resumes under."""
    return {ENV_VAR: cfg.to_env_json(), "THRIFTY_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}


def make_launcher(cfg: RunConfig) -> Launcher:
    if cfg.compute.launcher == "local":
        from thrifty.launchers.local import LocalLauncher

        return LocalLauncher()
    if cfg.compute.launcher == "skypilot":
        from thrifty.launchers.skypilot import SkyPilotLauncher

        return SkyPilotLauncher(cfg)
    raise ConfigError(f"'compute.launcher': {cfg.compute.launcher!r} is not a launcher; use local or skypilot")
