"""Stale-artifact archival: old checkpoints and cache entries to a cold tier, gold weights kept hot.

``scan`` reads a store (listing, ledgers, checkpoint commit records, the user's marks in
``archive-policy.json``) and ``plan`` decides object by object, as a pure function of those and a
clock (``as_of``). Never archived: a run's best checkpoint and anything marked gold; the latest
complete checkpoint of a run that is running or was active within the window; cache entries
used within ``older_than_days``; anything pinned; run metadata (ledger, metrics, summary, logs),
which stays readable so every run can still be listed and reported.

A checkpoint or cache entry moves whole, its commit record (``COMMIT``, ``manifest.json``) first:
a reader sees it complete and hot, or archived, never torn. Each move is one storage-class change
of one object, and objects already cold are skipped, so a run killed half-way and started again
finishes the job without moving anything twice.

``plan`` (settings, marks, the pure planner), ``store`` (scan, move, restore), ``commands`` (the CLI's marks,
restore and lifecycle), ``report`` (dollars and markdown), ``lifecycle`` (the providers' age-only bucket rules).
"""

from thrifty.archive.lifecycle import (DATA_SUFFIXES, LARGE_OBJECT_BYTES, LIFECYCLE_CAVEAT, install_lifecycle,
                                       lifecycle_rules)
from thrifty.archive.plan import (COMMIT_NAMES, GIB, POLICY_KEY, TIERS, ArchiveSettings, Item, Plan, Policy, RunFacts,
                                  build_settings, check_run_id, mark_prefix, plan, utcnow)
from thrifty.archive.report import Savings, human_bytes, markdown, monthly_savings, summary
from thrifty.archive.store import Outcome, apply, open_checked, restore_run, run_facts, scan

__all__ = [
    "COMMIT_NAMES", "DATA_SUFFIXES", "GIB", "LARGE_OBJECT_BYTES", "LIFECYCLE_CAVEAT", "POLICY_KEY", "TIERS",
    "ArchiveSettings", "Item", "Outcome", "Plan", "Policy", "RunFacts", "Savings", "apply", "build_settings",
    "check_run_id", "human_bytes", "install_lifecycle", "lifecycle_rules", "mark_prefix", "markdown", "monthly_savings",
    "open_checked", "plan", "restore_run", "run_facts", "scan", "summary", "utcnow",
]
