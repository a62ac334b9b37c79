"""A training slot: the job a flow launches holds one slot of a server-side global concurrency limit.

`thrifty deploy --pool-concurrency N` limits the work pool to N flow runs and sets this limit to N too.
The pool's limit alone is not enough: workers take runs against a snapshot of its free slots, so two
workers polling in the same second can both start runs up to it (on PostgreSQL with two workers, 4 flow
runs ran at once under a limit of 2). A global limit's slots are leased by the server atomically, so the
training jobs, the part that rents machines, stay within N. The lease is renewed while the flow runs and
lapses a minute after the flow process dies. Where no such limit exists (a local run, a pool without a limit) the job
starts at once.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from thrifty.protocol import TRAINING_JOBS_LIMIT

LEASE_S = 60.0  # renewed while the flow lives; a killed flow's slot comes back within this (Prefect's default: 300)


@contextlib.contextmanager
def training_slot(logger: Any) -> Iterator[None]:
    """Hold one slot of ``TRAINING_JOBS_LIMIT`` while the block (launch and watch) runs; wait for one if full."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT)
    except ObjectNotFound:
        yield  # no limit set: nothing to wait for, and no lease to renew
        return
    if limit.active_slots >= limit.limit:
        logger.info("waiting for a training slot: %d of %d training jobs are running (global concurrency limit %r, "
                    "set by `thrifty deploy --pool-concurrency`)", limit.active_slots, limit.limit,
                    TRAINING_JOBS_LIMIT)
    with concurrency(TRAINING_JOBS_LIMIT, occupy=1, strict=False, lease_duration=LEASE_S):
        yield
