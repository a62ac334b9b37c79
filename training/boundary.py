"""The local launcher's preemption, at exactly the step asked: what a node does at its step boundary.

``compute.preempt_after_steps`` reaches the node in ``$THRIFTY_PREEMPT_AT_STEP``. The node that is to be hit
(``compute.preempt_node``) finishes that step, stops there, says so in a flag file and waits: the launcher, which
polls for the flag, preempts it as it preempts any job (SIGTERM to the node, grace, SIGKILL; or SIGKILL at once
for ``preempt_mode: kill``). So the notice, or the kill, lands at that step however fast the machine trains: a
notice checkpoints that step, a kill loses the steps since the last checkpoint, as on a cloud. Should its launcher
be gone (its process ended: a killed `thrifty run` leaves its job training on), the node trains on: nobody would
restart a preempted job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from thrifty.procs import process_alive
from thrifty.protocol import ENV_PREEMPT_AT_STEP

if TYPE_CHECKING:
    from training.runtime import StopSignal

log = logging.getLogger("thrifty.train")

ANSWER_S = 600.0  # the most a node waits at its preemption step for a launcher that is still alive
WAIT_POLL_S = 0.005


@dataclass
class StepBoundary:
    preempt_at: int | None = None  # the step this node is preempted after (None: not this node, or done)
    mode: str = "sigterm"  # sigterm (a notice, then grace) | kill
    flag: Path | None = None  # the file that tells the launcher this node waits at its preemption step
    launcher_pid: int | None = None  # the process that will preempt it (None: wait up to ANSWER_S)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "StepBoundary":
        boundary = cls()
        spec = json.loads(env[ENV_PREEMPT_AT_STEP]) if env.get(ENV_PREEMPT_AT_STEP) else None
        if spec and int(env.get("SKYPILOT_NODE_RANK") or 0) == int(spec.get("node") or 0):
            boundary.preempt_at, boundary.mode, boundary.flag = int(spec["step"]), spec["mode"], Path(spec["flag"])
            boundary.launcher_pid = spec.get("launcher_pid")
        return boundary

    def passed(self, step: int, stop: "StopSignal", flush: Callable[[], None] | None = None) -> None:
        """``step`` is done (and saved, if it was due): take the preemption if it is due here. ``flush`` (the metric
        lines) runs first: a kill then ends the attempt with every line up to this step written."""
        if self.preempt_at is None or step < self.preempt_at or stop.signum is not None:
            return
        self.preempt_at = None  # one injected preemption per job
        log.warning("injected preemption (%s): stopping after step %d for the launcher to preempt", self.mode, step)
        if flush is not None:
            flush()
        if self.flag is not None:
            tmp = self.flag.with_name(f"{self.flag.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"step": step, "pid": os.getpid()}))
            os.replace(tmp, self.flag)  # whole or absent: the launcher reads it while we wait
        deadline = time.monotonic() + ANSWER_S
        while stop.signum is None and time.monotonic() < deadline and _alive(self.launcher_pid):
            time.sleep(WAIT_POLL_S)  # a kill ends the process here; a notice sets stop.signum
        if stop.signum is None:
            log.warning("no launcher preempted this node at step %d (it is gone): training on", step)


def _alive(pid: int | None) -> bool:
    return pid is None or process_alive(pid)
