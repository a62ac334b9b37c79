"""Failures a restart cannot fix, as the launchers decide them: bad input (exit 2), and a failure that repeats the
attempt before it (``thrifty.runs.exits``: same exit code, same error, no checkpoint progress in between).

The local launcher stops restarting such a job; on a SkyPilot node the notice wrapper marks the job given up
and exits 0, since SkyPilot restarts every other non-zero exit (up to ``max_restarts_on_errors``), and the
watcher reads the mark. Preemptions write no failure and a failure at another step or with another error is
not the same one, so both are retried as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

from thrifty.protocol import EXIT_BAD_INPUT
from thrifty.runs.exits import ExitRecord, attempt_exit, give_up, read_exits, repeat_message, repeated_failure
from thrifty.storage import Store

log = logging.getLogger("thrifty.launch")


def program_code(code: int | None, records: list[ExitRecord], since_unix: float) -> int | None:
    """The training program's own exit code for the attempt that started at ``since_unix``: torchrun ends 1 on any
    worker failure (the budget cap's 3 and bad input's 2 among them), the program's record says which."""
    mine = attempt_exit(records, since_unix)
    return mine.exit_code if mine is not None and code not in (0, None) else code


def final_failure(records: list[ExitRecord], since_unix: float, code: int | None) -> str | None:
    """Why the failed attempt that started at ``since_unix`` must not be restarted, or None to restart it."""
    mine = attempt_exit(records, since_unix)
    if program_code(code, records, since_unix) == EXIT_BAD_INPUT:
        return "bad input (exit 2)" + (f": {mine.error}" if mine is not None and mine.error else "")
    repeat = repeated_failure(records, since_unix)
    return repeat_message(repeat[1]) if repeat else None


def node_records(environ: Mapping[str, str]) -> tuple[Store, str, str] | None:
    """``(store, run_id, job_id)`` of the job this node runs, from its environment; None when it cannot tell."""
    try:
        from thrifty.config import config_from_env
        from thrifty.money.meter import node_job_id
        from thrifty.storage import open_store

        cfg, job_id = config_from_env(environ), node_job_id(environ)
        if cfg is None or job_id is None:
            return None
        return open_store(cfg.store), cfg.run_name, job_id
    except Exception as exc:  # no store: the program's exit code decides alone, as before
        log.warning("cannot read this job's exit records: %s", exc)
        return None


def settle_on_node(rc: int, started_unix: float, choose: Callable[[int], int]) -> int:
    """On a SkyPilot node, after the program exited ``rc`` (as torchrun says): the code SkyPilot should see. ``choose``
    maps the program's own code (from its record) to the wrapper's; a failure passed through that must not be
    restarted is marked given up in the store and exits 0 instead, so SkyPilot ends the job and the watcher
    reports it failed."""
    where = node_records(os.environ)
    records: list[ExitRecord] = []
    if where is not None:
        try:
            records = read_exits(where[0], where[1], where[2])
        except Exception as exc:
            log.warning("cannot read this job's exit records: %s", exc)
    own = program_code(rc, records, started_unix)
    code = choose(own)
    if where is None or code == 0 or code != own:  # done, a stop, a preemption: SkyPilot's own rules
        return code
    why = final_failure(records, started_unix, own)
    if why is None:
        return code
    store, run_id, job_id = where
    mine = attempt_exit(records, started_unix) or ExitRecord(job_id=job_id, exit_code=own, time_unix=time.time())
    try:
        give_up(store, run_id, mine, why)
    except Exception as exc:  # without the mark the watcher would call it a success: let SkyPilot retry instead
        log.warning("could not mark job %s given up (%s); leaving it to SkyPilot's restarts", job_id, exc)
        return code
    log.warning("not asking SkyPilot to restart job %s: %s", job_id, why)
    return 0
