"""The Launcher protocol (submit, status, cancel, attempts) and what every launcher shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from thrifty.config import ENV_VAR, RunConfig
from thrifty.config.fleet import sources_env
from thrifty.money.meter import Price, prices_env
from thrifty.protocol import ENV_PRICES
from thrifty.money.ledger import Attempt

if TYPE_CHECKING:
    from thrifty.money.estimate import Estimate


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
    def submit(self, cfg: RunConfig, env: dict[str, str] | None = None, estimate: "Estimate | None" = None) -> str:
        """Start a job for ``cfg``; ``env`` adds to the node's environment (e.g. the run's lease token); ``estimate``
        (the budget gate's) carries the speeds that rank where the run costs least."""
        ...
    def status(self, job_id: str) -> JobStatus: ...
    def cancel(self, job_id: str, deadline_s: float | None = None) -> None:
        """Graceful: the job gets SIGTERM, checkpoints, and exits. With ``deadline_s`` (a stop at the budget cap)
        the job is ended for good by then, checkpoint or not: the money stops."""
        ...
    def attempts(self, job_id: str) -> list[Attempt]: ...


def node_env(cfg: RunConfig, prices: list[Price]) -> dict[str, str]:
    """The environment every training node gets: the RunConfig (its run_name, resolved, is the resume key) and the
    prices of the candidates it may land on, so it can enforce the budget cap itself. ``THRIFTY_RUN_ID`` repeats
    the name for shell scripts and logs; the program reads the config's. The config has every setting written, the
    fleet defaults (``$THRIFTY_PRECISION``, ``$THRIFTY_COMPILE``) resolved here included, so the node's own
    environment cannot change them; where they came from goes along for its summary."""
    cfg.require_resolved()
    return {ENV_VAR: cfg.to_env_json(), ENV_PRICES: prices_env(prices), "THRIFTY_RUN_ID": cfg.run_name,
            "PYTHONUNBUFFERED": "1", **sources_env(cfg.setting_sources())}


def skypilot_node_vars(ips: list[str], rank: int) -> dict[str, str]:
    """The variables SkyPilot gives node ``rank`` of a multi-node job (the local launcher gives the same)."""
    return {"SKYPILOT_NODE_IPS": "\n".join(ips), "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(len(ips))}


def torchrun_command(env: dict[str, str], port: int, rdzv_id: str, nproc_per_node: int = 1) -> list[str]:
    """torchrun for one node of a multi-node job, from its SkyPilot variables: c10d rendezvous at the first node's
    address (which hosts the store), one agent per node, the training program as each worker."""
    import sys

    head = env["SKYPILOT_NODE_IPS"].splitlines()[0].strip()
    rank = int(env["SKYPILOT_NODE_RANK"])
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={env['SKYPILOT_NUM_NODES']}",
            f"--nproc-per-node={nproc_per_node}", f"--node-rank={rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={head}:{port}", f"--rdzv-id={rdzv_id}", f"--rdzv-conf=is_host={int(rank == 0)}",
            "--max-restarts=0", "-m", "training"]


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a local multi-node job's rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
