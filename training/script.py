"""Script mode on the node: ``python -m training`` with ``recipe: script`` runs the user's command as a child.

The child gets the RunConfig (``$THRIFTY_RUN_CONFIG``) and a status file the session inside it
writes (``thrifty.usercode.script.SessionStatus``); a SIGTERM (spot notice) is forwarded to it; its exit
code is the job's, except that the session's verdict decides a clean exit: a script that never
checkpointed, or ended with steps it did not save, exits 2 (never restarted: a restart would
pay for the same steps again), one stopped at the budget cap exits 3.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterator

from thrifty.config import ENV_VAR, RunConfig
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from thrifty.usercode.script import ENV_STATUS, ENV_STEP_LIMIT, ScriptParams, SessionStatus, check_script
from training import signals
from training.attempt_end import record_exit

log = logging.getLogger("thrifty.usercode.script")

# a torchrun worker's variables: the script sees a plain process (a multi-GPU script starts its own torchrun)
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def _die_with_parent() -> None:
    """In the child, before exec: killed when its wrapper dies (Linux), so a script never trains unwatched."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def child_env(cfg: RunConfig, params: ScriptParams, status_path: Path, step_limit: int | None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in TORCHRUN_VARS}
    env.update({ENV_VAR: cfg.to_env_json(), ENV_STATUS: str(status_path), "PYTHONUNBUFFERED": "1", **params.env})
    env.pop(ENV_STEP_LIMIT, None)
    if step_limit is not None:
        env[ENV_STEP_LIMIT] = str(step_limit)
    return env


@contextlib.contextmanager
def _status_file() -> Iterator[Path]:
    fd, name = tempfile.mkstemp(prefix="thrifty-session-", suffix=".json")
    os.close(fd)
    os.unlink(name)  # the session creates it: its absence says the script never called session.init()
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def run_command(cfg: RunConfig, params: ScriptParams, *, step_limit: int | None = None,
                base_env: dict[str, str] | None = None, output: IO[bytes] | None = None,
                timeout_s: float | None = None, forward_signals: bool = False) -> tuple[int, SessionStatus | None, bool]:
    """Run the command once; ``(exit code, the session's status or None, whether a stop signal was forwarded)``."""
    forwarded: list[int] = []
    with _status_file() as status_path:
        env = child_env(cfg, params, status_path, step_limit, base_env)
        proc = subprocess.Popen(params.argv(), env=env, stdout=output, stderr=subprocess.STDOUT if output else None,
                                preexec_fn=_die_with_parent if forward_signals else None)  # (not from threads)
        previous = {}
        if forward_signals:
            def forward(signum: int, _frame: object) -> None:
                forwarded.append(signum)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, forward)
            if signals.EARLY:  # a notice while this wrapper started: pass it on at once
                forward(signals.EARLY[-1], None)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code, SessionStatus.read(status_path), bool(forwarded)


def job_exit_code(code: int, status: SessionStatus | None, forwarded: bool) -> tuple[int, str]:
    """The job's exit from the child's and the session's verdict, with what to tell the user."""
    if status is None:
        if forwarded:
            return EXIT_OK, "stopped by a signal before the script started its session; nothing was trained"
        if code == 0:
            return EXIT_BAD_INPUT, ("the command exited 0 without calling thrifty.session.init(): nothing was "
                                    "checkpointed, so a preempted run would start over. Use the session API "
                                    "(see thrifty/session.py) in the script")
        return (code if code > 0 else EXIT_FAILED), f"the command failed with exit code {code} before its session began"
    if status.exit_code == EXIT_BAD_INPUT:  # the session's verdict: the script loses work; a restart cannot help
        return EXIT_BAD_INPUT, status.message
    if code == 0 and not status.closed:  # os._exit, or a session that never reached its end
        return EXIT_BAD_INPUT, ("the command exited 0 but its session never ended (os._exit?): thrifty cannot tell "
                                "whether the run finished. Let the script return normally, or call sess.close()")
    if code == 0:
        return (status.exit_code or EXIT_OK), status.message
    if status.closed and status.ended in ("interrupted", "budget"):  # stopped with its work saved, then went on and
        return (status.exit_code or EXIT_OK), status.message  # failed: the job ends as the stop says (resumed later)
    if code < 0 and forwarded:
        return EXIT_OK, (f"the script was ended by the signal it was sent at step {status.step}; the steps after "
                         f"its last checkpoint ({status.last_saved_step}) are redone on resume")
    return (code if code > 0 else EXIT_FAILED), f"the command failed with exit code {code} at step {status.step}"


def run_script(cfg: RunConfig) -> int:
    """``python -m training`` for ``recipe: script``: the command, under the node's signals and exit codes."""
    cfg.require_resolved()
    params = check_script(cfg)  # the checks the flow ran before renting this machine
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun: one copy of the command, run by rank 0
        log.info("script mode: rank %s leaves the command to rank 0", os.environ.get("RANK"))
        return EXIT_OK
    log.info("script mode: running %s", params.argv())
    code, status, forwarded = run_command(cfg, params, forward_signals=True)
    exit_code, message = job_exit_code(code, status, forwarded)
    if message:
        print(f"thrifty: {message}", file=sys.stderr)
    record_exit(cfg, exit_code, (status.error if status and status.error else message) if exit_code else "")
    return exit_code
