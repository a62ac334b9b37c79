"""The provider's own alternative: bucket lifecycle rules that move old checkpoint data and shards by age alone."""

from __future__ import annotations

from typing import Any

from thrifty.archive.plan import ArchiveSettings
from thrifty.config import ConfigError, store_scheme
from thrifty.storage import Store

# ------------------------------------------------------------------------------------------- provider lifecycle

LIFECYCLE_CAVEAT = (
    "Provider lifecycle rules see only an object's age (and size or name), not Thrifty's marks: gold weights, "
    "best checkpoints and a live run's latest checkpoint move too once old enough (a run whose newest checkpoint "
    "moved stops with 'restore first'). The weekly-archive deployment applies every rule; prefer it.")
LARGE_OBJECT_BYTES = 1 << 20  # S3 rules move only objects above this: checkpoint data and shards, not metadata
DATA_SUFFIXES = [".pt", ".npy"]  # GCS rules: checkpoint data and shards, not commit records or metadata


def lifecycle_rules(store: Store, settings: ArchiveSettings) -> list[dict[str, Any]]:
    """Bucket lifecycle rules that move old checkpoint data and shards to the target class (S3 and GCS)."""
    days = max(1, round(settings.older_than_days))
    scheme = store_scheme(store.uri)
    root = getattr(store, "root", "")
    prefixes = [f"{root}/{top}/" if root else f"{top}/" for top in ("runs", "cache")]
    if scheme == "s3":
        rid = f"thrifty-{root or 'bucket'}".replace("/", "-")
        rules: list[dict[str, Any]] = [
            {"ID": f"{rid}-{top}-to-{settings.target_class.lower()}", "Status": "Enabled",
             "Filter": {"And": {"Prefix": prefix, "ObjectSizeGreaterThan": LARGE_OBJECT_BYTES}},
             "Transitions": [{"Days": days, "StorageClass": settings.target_class}]}
            for top, prefix in zip(("runs", "cache"), prefixes)]
        rules.append({"ID": f"{rid}-abort-incomplete-uploads", "Status": "Enabled",
                      "Filter": {"Prefix": f"{root}/" if root else ""},
                      "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}})
        return rules
    if scheme == "gs":
        return [{"action": {"type": "SetStorageClass", "storageClass": settings.target_class},
                 "condition": {"age": days, "matchesPrefix": prefixes, "matchesSuffix": DATA_SUFFIXES}}]
    raise ConfigError(f"store {store.uri!r}: lifecycle rules are installed on s3:// and gs:// buckets; for Azure, "
                      "add a lifecycle management policy to the storage account (az storage account "
                      "management-policy create), for a local store use the weekly-archive deployment")


def install_lifecycle(store: Store, rules: list[dict[str, Any]]) -> None:
    """Add ``rules`` to the bucket's lifecycle configuration, replacing earlier Thrifty rules for the same prefixes
    and keeping everyone else's."""
    install = getattr(store, "merge_lifecycle_rules", None)
    if install is None:
        raise ConfigError(f"store {store.uri!r} has no bucket lifecycle rules")
    install(rules)
