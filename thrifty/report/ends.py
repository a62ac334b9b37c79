"""How a run ended, in the one sentence every surface uses: the flow run's state message, the notification, the
report's first line and ``thrifty run``'s last line.

``run digits-demo stopped at its budget cap: spent $0.00360 of its $0.004 budget (90%); its checkpoint at step 120
is kept. Next: ...``: what happened, what it cost (the ledger's figure), and what to do next. A sentence starts with
``run <run_name>``, so a printer never prefixes it again.
"""

from __future__ import annotations

from typing import Literal
from thrifty.numbers import money

Kind = Literal["completed", "stopped_early", "rung", "budget", "bad_input", "failed", "cancelled", "crashed"]

WHAT: dict[str, str] = {
    "completed": "completed",
    "stopped_early": "stopped early",
    "rung": "trained to its milestone",
    "budget": "stopped at its budget cap",
    "bad_input": "refused its input",
    "failed": "failed",
    "cancelled": "was cancelled",
    "crashed": "crashed",
}
# the flow run's final state for each end (Completed for the ends that are no failure)
STATE: dict[str, str] = {"completed": "Completed", "stopped_early": "Completed", "rung": "Completed",
                         "budget": "StoppedAtCap", "bad_input": "BadInput", "failed": "Failed",
                         "cancelled": "Cancelled", "crashed": "Crashed"}
# how tables name a run's state (the savings table, `thrifty report`): the README's words, never a raw record value
STATE_NAMES: dict[str, str] = {**WHAT, "budget": "stopped at its cap", "cancelled": "cancelled",
                               "succeeded": "completed", "running": "still running", "interrupted": "interrupted"}


def state_name(state: str) -> str:
    return STATE_NAMES.get(state, state.replace("_", " "))


KIND_OF_STATE: dict[str, str] = {"Completed": "completed", "StoppedAtCap": "budget", "BadInput": "bad_input",
                                 "Failed": "failed", "Cancelled": "cancelled", "Crashed": "crashed",
                                 "Cancelling": "cancelled"}


def kept(run_name: str, checkpoint_step: int | None) -> str:
    return (f"its checkpoint at step {checkpoint_step} is kept" if checkpoint_step is not None
            else "it wrote no checkpoint")


def next_step(kind: str, run_name: str, checkpoint_step: int | None = None, gold: str | None = None,
              launched: bool = True) -> str:
    """What to do after this end (``launched``: a job was rented; an end before that rented nothing)."""
    resume = f"from its checkpoint at step {checkpoint_step}" if checkpoint_step is not None else "from scratch"
    if not launched and kind in ("failed", "cancelled", "crashed", "bad_input"):
        return "Nothing was rented: change what the message names (if anything) and run it again."
    if kind in ("completed", "stopped_early"):
        return ((f"Its best weights are {gold}. " if gold else "")
                + "Running the same config again launches nothing; change a train setting to continue it, or pick a "
                  "new run_name to train again.")
    if kind == "rung":
        return "A larger train.stop_at_epoch continues it on the same schedule, from its checkpoint."
    if kind == "budget":
        return (f"To go on {resume}: run it again with a larger budget.max_usd (in the Prefect UI: Copy to new run "
                "and raise budget.max_usd; Retry reuses this budget and stops again).")
    if kind == "bad_input":
        return "Nothing more was rented: change what the message names and run it again."
    if kind == "failed":
        return (f"Fix the cause (each attempt's log is under runs/{run_name}/logs/) and run it again with the same "
                f"run_name: it resumes {resume}.")
    if kind == "cancelled":
        return f"Run it again with the same run_name to resume {resume}."
    return (f"Run it again with the same run_name: it resumes {resume} (a job it left training stops by itself at "
            "its cap).")


def sentence(kind: str, run_name: str, spent_usd: float, max_usd: float, detail: str = "",
             checkpoint_step: int | None = None, gold: str | None = None, launched: bool = True) -> str:
    """The end, its spend against the budget, the detail (why, what is kept) and the next step, in one sentence."""
    share = f" ({spent_usd / max_usd:.0%})" if max_usd > 0 else ""
    text = f"run {run_name} {WHAT[kind]}: spent {money(spent_usd)} of its ${max_usd:g} budget{share}"
    if detail:
        text += f"; {detail.rstrip('.')}"
    return f"{text}. Next: {next_step(kind, run_name, checkpoint_step, gold, launched)}"


def says_itself(message: str | None, run_name: str) -> bool:
    """Whether a state message is already one of these sentences (printers then print it as it is)."""
    return bool(message) and message.startswith(f"run {run_name} ")
