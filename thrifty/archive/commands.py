"""The ``thrifty archive`` subcommands that act on one store: marks, restore, bucket lifecycle rules (the CLI parses)."""

from __future__ import annotations

import json
import sys
from collections import Counter

from thrifty.archive.lifecycle import LIFECYCLE_CAVEAT, install_lifecycle, lifecycle_rules
from thrifty.archive.plan import POLICY_KEY, ArchiveSettings, Policy, check_run_id, mark_prefix
from thrifty.archive.store import open_checked, restore_run
from thrifty.protocol import EXIT_OK


def mark(settings: ArchiveSettings, action: str, target: str) -> int:
    """`thrifty archive gold|pin|unmark TARGET`: the mark in the store's policy, the target checked first."""
    prefix = mark_prefix(target)  # before the store is touched: a bad target writes nothing
    store = open_checked(settings)
    policy = Policy.load(store)
    if action == "gold":
        policy.gold.append(prefix)
    elif action == "pin":
        policy.pinned.append(prefix)
    else:
        policy.gold = [p for p in policy.gold if p != prefix]
        policy.pinned = [p for p in policy.pinned if p != prefix]
    policy.save(store)
    policy = Policy.load(store)
    print(f"{POLICY_KEY} in {store.uri}: gold {policy.gold or '[]'}, pinned {policy.pinned or '[]'}")
    if action != "unmark" and not store.list(prefix):
        print(f"warning: nothing in the store starts with {prefix} yet (a typo?); the mark applies once it does",
              file=sys.stderr)
    return EXIT_OK


def restore(settings: ArchiveSettings, run_id: str, priority: str, days: int) -> int:
    """`thrifty archive restore RUN_ID`: start (or finish) restoring a run's archived objects; says how long."""
    check_run_id(run_id)  # before the store is touched
    store = open_checked(settings)
    statuses = restore_run(store, run_id, priority=priority, days=days)
    if not statuses:
        print(f"run {run_id}: nothing is archived; it can resume as it is")
        return EXIT_OK
    for st in statuses:
        print(f"{st.state:<12} {st.key}" + (f"  (the provider says {st.eta})" if st.state != "done" else ""))
    counts = Counter(st.state for st in statuses)
    pending = counts["requested"] + counts["in progress"]
    etas = sorted({st.eta for st in statuses if st.state != "done"})
    print(f"\nrun {run_id}: {counts['done']} object(s) back in the hot tier, {pending} restoring"
          + (f"; the provider says: {', '.join(etas)}. Run this command again after that to finish." if pending
             else "; the run can resume."))
    return EXIT_OK


def lifecycle(settings: ArchiveSettings, apply: bool) -> int:
    """`thrifty archive lifecycle [--apply]`: the equivalent S3 / GCS bucket rules, printed or installed."""
    store = open_checked(settings, writable=apply)
    rules = lifecycle_rules(store, settings)
    print(json.dumps(rules, indent=2))
    print(LIFECYCLE_CAVEAT)
    if apply:
        install_lifecycle(store, rules)
        print(f"installed on {store.uri} (other rules of the bucket kept)")
    else:
        print("Not installed: run again with --apply to install these rules.")
    return EXIT_OK
