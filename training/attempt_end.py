"""The node's own record of how this attempt of a launched job ended (``thrifty.runs.exits``).

Written once by the training program's rank 0 as it exits, in a job a launcher started (a run by hand
has no job and no restarts). The launchers read it to see the program's own exit code and to stop
restarting a failure that repeats itself; a record that cannot be written never changes the exit.
"""

from __future__ import annotations

import logging
import os
import time

from thrifty.config import RunConfig
from thrifty.money.meter import node_job_id
from thrifty.runs import checkpoints
from thrifty.runs.exits import ExitRecord, error_signature, write_exit
from thrifty.storage import open_store

log = logging.getLogger("thrifty.train")


def record_exit(cfg: RunConfig, exit_code: int, error: str | BaseException = "") -> None:
    """Say how this attempt ended: its exit code, the error's type and first line, the run's newest checkpoint."""
    job_id = node_job_id(os.environ)
    if job_id is None or os.environ.get("RANK", "0") != "0":
        return
    try:
        store = open_store(cfg.store)
        saved = checkpoints.committed(store, cfg.run_name)
        if isinstance(error, BaseException):
            text = error_signature(error)
        else:
            lines = error.strip().splitlines()
            text = lines[0][:400] if lines else ""
        write_exit(store, cfg.run_name, ExitRecord(job_id=job_id, exit_code=exit_code, error=text,
                                                   checkpoint_step=saved[-1].step if saved else None,
                                                   time_unix=time.time()))
    except Exception as exc:  # the record helps the launcher decide; it must never change how the job ends
        log.warning("could not record how this attempt ended: %s", exc)
