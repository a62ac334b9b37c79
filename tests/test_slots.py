"""The training slot: a flow's job holds one slot of the server's 'thrifty-training-jobs' limit, so
`--pool-concurrency N` caps the training jobs even when two workers over-take the pool's own limit."""

from __future__ import annotations

import logging
import threading
import time

from flows.slots import training_slot
from thrifty.protocol import TRAINING_JOBS_LIMIT


def test_a_second_job_waits_for_the_slot_and_starts_when_it_is_freed(prefect_harness, caplog):
    from prefect.client.orchestration import get_client

    log = logging.getLogger("thrifty.test.slots")
    with training_slot(log):  # no limit on this server: at once, nothing held
        pass
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT, 1)
    try:
        entered = threading.Event()

        def second() -> None:
            with training_slot(log):
                entered.set()

        with caplog.at_level(logging.INFO, logger="thrifty.test.slots"):
            with training_slot(log):
                waiting = threading.Thread(target=second)
                waiting.start()
                assert not entered.wait(3), "the limit of 1 is held: the second job must wait"
                freed = time.monotonic()
            assert entered.wait(60), "the slot was freed: the second job starts"
            waiting.join()
        print(f"\n[slots] the waiting job started {time.monotonic() - freed:.1f} s after the slot was freed")
        assert "waiting for a training slot: 1 of 1 training jobs are running" in caplog.text
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT).active_slots == 0
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT)
