"""Archival tasks: scan the store into a plan, move the stale objects, publish what happened."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from thrifty import archive
from thrifty.archive import ArchiveSettings, Outcome, Plan

ARTIFACT_KEY = "thrifty-archive"
PROGRESS_EVERY_S = 10.0
ARTIFACT_ROWS = 300  # a store with thousands of checkpoints still makes a readable artifact


@task(name="scan-store", cache_policy=NO_CACHE)
def scan_store(settings: ArchiveSettings, writable: bool) -> Plan:
    """List runs and cache, read ledgers and checkpoint records, and plan the pass (nothing moves).
    ``writable`` (a real pass) checks with a probe write first that the objects can be moved."""
    logger = get_run_logger()
    store = archive.open_checked(settings, writable)
    plan = archive.scan(store, settings)
    s = archive.summary(plan)
    logger.info("%d objects scanned in %s: %d to archive (%s) in %d checkpoints / cache entries, %d already cold",
                len(plan.items), settings.store, s["objects_to_archive"], archive.human_bytes(s["bytes_to_archive"]),
                s["groups_to_archive"], s["already_cold"])
    return plan


@task(name="move-to-cold", cache_policy=NO_CACHE)
def move_to_cold(settings: ArchiveSettings, plan: Plan) -> Outcome:
    """Move the plan's objects; not retried by Prefect: a pass that ends early is finished by the next one."""
    logger = get_run_logger()
    store = archive.open_checked(settings, writable=False)  # the scan checked it with a probe write
    last = [0.0]

    def progress(n: int, total: int, item: archive.Item) -> None:
        if n == 1 or n == total or time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            logger.info("archiving %d/%d: %s -> %s", n, total, item.key, plan.target_class)

    outcome = archive.apply(store, plan, progress)
    logger.info("moved %d objects (%s) to %s; %d left alone, %d failed", len(outcome.moved),
                archive.human_bytes(outcome.bytes_moved), plan.target_class, len(outcome.left_alone),
                len(outcome.failed))
    return outcome


@task(name="archive-report", cache_policy=NO_CACHE)
def publish_report(plan: Plan, outcome: Outcome | None) -> dict[str, Any]:
    """A markdown artifact (key thrifty-archive): bytes, monthly dollars saved, and every decision's reason."""
    create_markdown_artifact(archive.markdown(plan, outcome, max_rows=ARTIFACT_ROWS), key=ARTIFACT_KEY,
                             description=f"Stale-artifact archival of {plan.settings.store}")
    return archive.summary(plan, outcome)
