"""The smoke test of script mode: the user's command on CPU with a small step limit, in a throwaway store.

It runs the command twice: the first run must log and save (and honour the step limit, which the
session enforces); the second must resume from that checkpoint (``load_latest``) and continue after
it. The logged steps give the step time the budget gate prices the run with. A failure raises
``SmokeTestFailed`` with the cause and the end of the command's output; nothing is rented.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from thrifty.config import RunConfig
from thrifty.protocol import ENV_BILLING_START, ENV_JOB_ID, ENV_LEASE_TOKEN, ENV_PRICES
from thrifty.results import SmokeResult
from thrifty.usercode.script import SessionStatus, check_script
from training.script import job_exit_code, run_command
from training.validate import SmokeTestFailed

NOT_FOR_THE_SMOKE = (ENV_PRICES, ENV_BILLING_START, ENV_JOB_ID, ENV_LEASE_TOKEN)  # a smoke run is not the job


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_bytes().decode(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])


def _run(cfg: RunConfig, step_limit: int, log_path: Path, what: str, steps_left: bool = True) -> SessionStatus:
    params = check_script(cfg)
    env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_THE_SMOKE}
    env["CUDA_VISIBLE_DEVICES"] = ""  # on CPU, as the smoke test promises: no GPU is touched here
    with open(log_path, "wb") as out:
        try:
            code, status, _ = run_command(cfg, params, step_limit=step_limit, base_env=env, output=out,
                                          timeout_s=params.smoke_timeout_s)
        except subprocess.TimeoutExpired:
            raise SmokeTestFailed(f"{what}: the command ran past recipe_params.smoke_timeout_s "
                                  f"({params.smoke_timeout_s:g} s) with a step limit of {step_limit}; does it call "
                                  f"sess.should_stop() every step? Its output ended:\n{_tail(log_path)}") from None
    exit_code, message = job_exit_code(code, status, forwarded=False)
    if exit_code != 0 or status is None:
        raise SmokeTestFailed(f"{what}: {message or f'the command exited {code}'}. Its output ended:\n"
                              f"{_tail(log_path)}")
    if not steps_left:  # a run shorter than the step limit: its resume has nothing left to train
        return status
    if not status.logs:
        raise SmokeTestFailed(f"{what}: the script never called sess.log(step, loss=...): progress, the budget "
                              "projection and the step time the budget gate needs all come from it")
    if not status.saves:
        raise SmokeTestFailed(f"{what}: the script never called sess.save(state, step) within {step_limit} "
                              "step(s): save when sess.should_save(step) or sess.should_stop() is true")
    return status


def smoke_script(cfg: RunConfig) -> SmokeResult:
    """Run the command twice on CPU with a small step limit; check log, save and resume; measure the step time."""
    params = check_script(cfg)
    with tempfile.TemporaryDirectory(prefix="thrifty-smoke-") as tmp:
        train = {**cfg.train.model_dump(mode="json"), "device": "cpu"}
        scfg = cfg.updated({"store": str(Path(tmp) / "store"), "train": train})
        first = _run(scfg, params.smoke_steps, Path(tmp) / "first.log", "smoke test, first run")
        left = not (first.total_steps and first.step >= first.total_steps)
        second = _run(scfg, first.step + 1, Path(tmp) / "second.log", "smoke test, resumed run", left)
    if second.loaded_step != first.last_saved_step:
        raise SmokeTestFailed(
            f"smoke test, resumed run: the script did not resume from its checkpoint at step {first.last_saved_step} "
            f"(it loaded {second.loaded_step}): call sess.load_latest() before training and continue from its step; "
            "a preempted run would otherwise pay for its steps again")
    if second.first_logged_step is not None and second.first_logged_step <= (second.loaded_step or 0):
        raise SmokeTestFailed(
            f"smoke test, resumed run: after loading step {second.loaded_step} the script logged step "
            f"{second.first_logged_step} again: continue from the loaded step (the next step is loaded + 1)")
    # each run's first interval pays for its start (imports, compilation, data): the ones after it are the speed
    times = first.step_times_s[1:] + second.step_times_s[1:] or first.step_times_s + second.step_times_s
    return SmokeResult(
        recipe="script",
        steps=first.step + max(0, second.step - (second.loaded_step or 0)),
        losses=first.losses + second.losses,
        cpu_step_time_s=round(statistics.median(times), 5) if times else 0.0,
        examples_per_step=second.examples_per_step or first.examples_per_step,  # what the script said, or None
        parameters=second.parameters or first.parameters,
        precision_checked="none (the script's own)",
        cache_key="",
        total_steps=second.total_steps or first.total_steps,
    )
