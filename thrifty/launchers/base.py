"""The Launcher protocol (submit, status, cancel, attempts) and what every launcher shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from thrifty.config import ENV_VAR, RunConfig
from thrifty.runs import Attempt


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
class JobStatus:
    job_id: str
    state: JobState
    attempts: list[Attempt] = field(default_factory=list)
    message: str = ""

    @property
    def recoveries(self) -> int:
        return max(0, len(self.attempts) - 1)


class Launcher(Protocol):
    def submit(self, cfg: RunConfig) -> str: ...
    def status(self, job_id: str) -> JobStatus: ...
    def cancel(self, job_id: str) -> None:
        """Graceful: the job gets SIGTERM, checkpoints, and exits."""
        ...
    def attempts(self, job_id: str) -> list[Attempt]: ...


def node_env(cfg: RunConfig) -> dict[str, str]:
    """The environment every training node gets: the RunConfig (its run_name, resolved, is the resume key).
    ``THRIFTY_RUN_ID`` repeats the name for shell scripts and logs; the program reads the config's."""
    cfg.require_resolved()
    return {ENV_VAR: cfg.to_env_json(), "THRIFTY_RUN_ID": cfg.run_name, "PYTHONUNBUFFERED": "1"}
