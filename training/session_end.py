"""How a script's session ends (``training.session``): the verdict, and the errors that are the script's input.

The verdict turns what the script did into the job's exit: finished, interrupted (a spot notice:
resumed later), at the budget cap (exit 3), or a script that loses work or money (exit 2, never
restarted). A checkpoint that no longer fits the model the script built (a changed ``--n_embd``) is
input too: it would fail the same way on every restart, so it ends with exit 2 naming the mismatch,
before anything trains.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from typing import Any

import torch

from thrifty.protocol import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_FAILED
from thrifty.usercode.script import SessionStatus

INTERRUPTIONS = ("signal", "budget")  # stops that leave the run unfinished (it resumes); the others finish it
# how the node's meter records each verdict's end (anything else: "error")
METER_END = {"interrupted": "signal", "budget": "budget", "completed": "finished", "stopped_early": "finished"}
SHOWN = 4  # mismatches named in a message


def verdict(status: SessionStatus, stop_reason: str | None, step: int, crashed: bool,
            write_error: Exception | None) -> tuple[str, int | None, str]:
    """``(ended, exit code or None for the process's own, message)`` of a session that is closing."""
    if status.exit_code == EXIT_BAD_INPUT:
        return status.ended, EXIT_BAD_INPUT, status.message
    if write_error is not None:
        return "crashed", EXIT_FAILED, (f"a checkpoint write failed ({type(write_error).__name__}: {write_error}); "
                                        "the run resumes from its last complete checkpoint")
    saved = status.last_saved_step if status.last_saved_step is not None else status.loaded_step
    if stop_reason in INTERRUPTIONS and not (crashed and saved != step):
        lost = "" if saved == step else (
            f"; steps {saved or 0}..{step} were not saved: save before stopping when should_stop() is true")
        after = ("; the script went on after the stop and failed (check sess.stopped, or callback.stopped, after "
                 "training and end the script)" if crashed else "")
        if stop_reason == "budget":
            return "budget", EXIT_BUDGET, (f"stopped at the budget cap at step {step}{lost}{after}. Run it again "
                                           "with a larger budget.max_usd to continue")
        return "interrupted", 0, f"stopped on a signal at step {step}{lost}{after}"
    if crashed:
        return "crashed", None, ""
    if saved is None:
        return "no_checkpoint", EXIT_BAD_INPUT, (
            "the script ended without a single sess.save(state, step): a preempted run would restart from "
            "scratch and pay for its steps again. Save every few steps (sess.should_save(step)) and at the end")
    if saved < step:
        return "unsaved", EXIT_BAD_INPUT, (
            f"the script ended at step {step} but its last checkpoint is step {saved}: the final steps and "
            "weights are lost. Call sess.save(state, step) after the last step")
    return ("stopped_early" if stop_reason == "early_stop" else "completed"), 0, ""


def state_mismatch(saved: Any, like: Any, path: str = "") -> list[str]:
    """Where ``saved`` (a checkpoint's state) does not fit ``like`` (the state the script built): a missing or
    unexpected key of a dict of tensors (a module's state_dict), a tensor of another shape. Other values are the
    script's to compare."""
    where = path or "the state"
    if isinstance(like, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return [f"{where}: saved as {type(saved).__name__}, now a tensor"]
        return [] if saved.shape == like.shape else [
            f"{where}: saved {tuple(saved.shape)}, now {tuple(like.shape)}"]
    if isinstance(like, Mapping):
        if not isinstance(saved, Mapping):
            return [f"{where}: saved as {type(saved).__name__}, now a dict"]
        out = []
        if like and all(isinstance(v, torch.Tensor) for v in like.values()):  # a state_dict: its keys are the model
            out += [f"{_join(path, k)}: in the checkpoint, not in the model now" for k in saved if k not in like]
            out += [f"{_join(path, k)}: in the model now, not in the checkpoint" for k in like if k not in saved]
        for k, v in like.items():
            if k in saved:
                out += state_mismatch(saved[k], v, _join(path, k))
        return out
    if isinstance(like, (list, tuple)) and isinstance(saved, (list, tuple)) and len(like) == len(saved):
        return [m for i, (s, v) in enumerate(zip(saved, like)) for m in state_mismatch(s, v, _join(path, i))]
    return []


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def changed_settings(saved_cfg: Mapping[str, Any], now_cfg: Mapping[str, Any]) -> str:
    """The recipe_params (the script's command among them) that differ between a checkpoint's config and this one."""
    then, now = saved_cfg.get("recipe_params") or {}, now_cfg.get("recipe_params") or {}
    diffs = [f"recipe_params.{k} was {json.dumps(then.get(k))}, now {json.dumps(now.get(k))}"
             for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)]
    return "; ".join(diffs)


def mismatch_message(run_id: str, step: int, problems: list[str], changed: str) -> str:
    shown = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
    since = f" Since it was saved: {changed}." if changed else ""
    return (f"run {run_id!r} has a checkpoint (step {step}) that does not fit the model this script built: {shown}."
            f"{since} A restart would fail the same way. Use a new run_name to train this model from scratch, or "
            "restore the settings the checkpoint was saved with")


def load_failure(exc: BaseException) -> str | None:
    """The first line of an error raised while loading a checkpoint into the script's objects (a ``load_state_dict``
    in its traceback), or None."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return None
    # walk_tb, not extract_tb: extract_tb honours sys.tracebacklimit, which a library may leave at 0 (SkyPilot's
    # print_exception_no_traceback does when an exception passes through it)
    if not any(frame.f_code.co_name == "load_state_dict" for frame, _ in traceback.walk_tb(exc.__traceback__)):
        return None
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return " ".join(lines[:3])[:600] or type(exc).__name__
