"""Stale-artifact archival as a flow: old checkpoints and cache entries to cold storage, gold weights kept hot."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from prefect import flow, get_run_logger

from flows.run_names import archive_run_name, upcoming_named
from tasks.archive import move_to_cold, publish_report, scan_store
from thrifty.archive import build_settings


@flow(name="thrifty-archive", flow_run_name=archive_run_name)
def archive_stale(store: str = ".thrifty/store", older_than_days: float = 90.0, active_window_days: float = 14.0,
                  tier: Literal["archive", "cold"] = "archive", as_of: dt.datetime | None = None,
                  dry_run: bool = True) -> dict[str, Any]:
    """Scan `store` and move what has not been touched for `older_than_days` (before `as_of`, default now)
    to the cold `tier`. Best checkpoints, anything marked gold or pinned, and the latest checkpoint of a run
    active within `active_window_days` stay hot. `dry_run` (the default) only reports what would move.

    Args:
        store: The store to scan: a path, file://, s3://, gs:// or az:// URI.
        older_than_days: Objects untouched this long (days before as_of) move to the cold tier (days).
        active_window_days: A run active this recently keeps its latest checkpoint hot (days).
        tier: archive = the coldest class (S3 DEEP_ARCHIVE, GCS ARCHIVE, Azure Archive); cold = S3 GLACIER,
            GCS COLDLINE, Azure Cold.
        as_of: The moment ages are measured from; empty = now.
        dry_run: Only report what would move (a preview). The weekly schedule turns it off; a manual run keeps it.
    """
    settings = build_settings({"store": store, "older_than_days": older_than_days,
                               "active_window_days": active_window_days, "tier": tier, "as_of": as_of},
                              "the flow's parameters")
    with upcoming_named(get_run_logger()):  # the next Sundays' runs show the names they will run under
        plan = scan_store(settings, writable=not dry_run)
        outcome = None if dry_run else move_to_cold(settings, plan)
        result = publish_report(plan, outcome)
    if outcome is not None and outcome.failed:
        first, why = outcome.failed[0]
        raise RuntimeError(f"{len(outcome.failed)} object(s) could not be archived (first: {first.key}: {why}); "
                           f"{len(outcome.moved)} moved. Fix the cause and run again: moved objects are skipped.")
    return result
