"""How each attempt of a launched job ended, as the training program itself saw it: ``runs/<run>/exits/<job>/``.

The node writes one :class:`ExitRecord` when the training program ends on its own (any exit code, with
the error's type and first line, and the run's newest checkpoint then). The launchers read them for
two things a process exit code cannot say: the program's own code (torchrun turns every failure into
1), and whether an attempt failed *the same way* as the one before it (:func:`repeated_failure`).

The same way means: the same exit code (a failure: not 0, not the budget cap's 3), the same error
(type and first line of the message, non-empty), and no progress in between (the run's newest
checkpoint is the same step, and no attempt between them ended otherwise). Such a failure is
deterministic (a model that no longer fits its checkpoint, a bug at a fixed step, a missing file):
restarting it bills the same failure again. A preemption writes no failure, a failure at another
step or with another message is not the same, so both are still retried.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.runs.records import run_key
from thrifty.storage import NotFound, Store

EXITS = "exits"
GIVEN_UP = "given-up.json"  # the node's verdict: this job fails for good (SkyPilot saw exit 0, see launchers.notice)
NOT_FAILURES = (0, 3)  # done or interrupted with the work saved; stopped at the budget cap (thrifty.protocol)


class ExitRecord(BaseModel):
    """The training program's own account of how one attempt ended."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    exit_code: int
    error: str = ""  # "Type: first line of the message" for a failure; "" otherwise
    checkpoint_step: int | None = None  # the run's newest complete checkpoint when it ended
    time_unix: float

    def failed(self) -> bool:
        return self.exit_code not in NOT_FAILURES

    def describe(self) -> str:
        saved = f"newest checkpoint step {self.checkpoint_step}" if self.checkpoint_step is not None else "no checkpoint"
        return f"exit {self.exit_code}: {self.error or 'no error message'} ({saved})"


def error_signature(exc: BaseException) -> str:
    """What identifies an error across attempts: its type and the first line of its message, bounded."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()[:400]


def write_exit(store: Store, run_id: str, record: ExitRecord) -> None:
    name = f"{int(record.time_unix * 1000):015d}.json"
    store.put_bytes(run_key(run_id, EXITS, record.job_id, name), record.model_dump_json().encode())


def read_exits(store: Store, run_id: str, job_id: str) -> list[ExitRecord]:
    """The job's exit records, oldest first (a record that does not parse is skipped)."""
    out = []
    for obj in store.list(run_key(run_id, EXITS, job_id) + "/"):
        if obj.key.rsplit("/", 1)[-1][0].isdigit():
            try:
                out.append(ExitRecord.model_validate_json(store.get_bytes(obj.key)))
            except (NotFound, ValidationError):
                continue
    return sorted(out, key=lambda r: r.time_unix)


def same_failure(a: ExitRecord, b: ExitRecord) -> bool:
    return (a.failed() and b.failed() and a.exit_code == b.exit_code and bool(a.error) and a.error == b.error
            and a.checkpoint_step == b.checkpoint_step)


def repeated_failure(records: list[ExitRecord], since_unix: float) -> tuple[ExitRecord, ExitRecord] | None:
    """``(before, now)`` when the newest record, written at or after ``since_unix`` (this attempt), is a failure the
    same as the record just before it; else None."""
    if len(records) < 2 or records[-1].time_unix < since_unix:
        return None
    before, now = records[-2], records[-1]
    return (before, now) if same_failure(before, now) else None


def attempt_exit(records: list[ExitRecord], since_unix: float) -> ExitRecord | None:
    """The record of the attempt that started at ``since_unix``, if the program wrote one."""
    return records[-1] if records and records[-1].time_unix >= since_unix else None


def give_up(store: Store, run_id: str, failure: ExitRecord, message: str) -> None:
    """Mark the job of ``failure`` failed for good, with why (read by the watcher: SkyPilot saw it end well)."""
    verdict = failure.model_copy(update={"error": message, "time_unix": time.time()})
    store.put_bytes(run_key(run_id, EXITS, failure.job_id, GIVEN_UP), verdict.model_dump_json().encode())


def given_up(store: Store, run_id: str, job_id: str) -> str | None:
    """Why ``job_id`` was given up by its node, or None."""
    try:
        return ExitRecord.model_validate_json(store.get_bytes(run_key(run_id, EXITS, job_id, GIVEN_UP))).error
    except (NotFound, ValidationError):
        return None


def repeat_message(now: ExitRecord) -> str:
    return (f"this attempt failed the same way as the one before it ({now.describe()}): a restart would bill the "
            "same failure again, so the job is not retried. Fix the cause and run it again; it resumes from its "
            "checkpoint")
