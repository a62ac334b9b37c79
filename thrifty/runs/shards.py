"""Where the preprocessing cache lives in a store and what makes an entry complete. No numpy or torch.

``cache/<key>/`` holds ``.npy`` shards and, written last, ``manifest.json`` (the commit record);
a directory without a manifest is an unfinished write and is never read. Every hit rewrites a
small ``LAST_USED`` object, so the archiver can tell an entry in use from a stale one.
``training.data`` writes and reads the shards on top of this module.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from thrifty.storage import Archived, NotFound, Store, join_key

log = logging.getLogger("thrifty.data")

CACHE_PREFIX = "cache"
MANIFEST = "manifest.json"  # the commit record of an entry: written last
LAST_USED = "LAST_USED"  # rewritten on every hit


def entry_prefix(key: str) -> str:
    return join_key(CACHE_PREFIX, key)


def read_manifest(store: Store, key: str) -> dict[str, Any] | None:
    """The entry's manifest, or None when there is no usable entry (never written, unfinished, archived, damaged)."""
    name = join_key(entry_prefix(key), MANIFEST)
    try:
        manifest = json.loads(store.get_bytes(name))
    except NotFound:
        return None
    except Archived:
        log.warning("preprocess cache entry %s was archived to cold storage; preprocessing again", key)
        return None
    except (ValueError, UnicodeDecodeError) as exc:  # empty, truncated, not JSON
        log.warning("preprocess cache entry %s has a damaged manifest (%s in %s: %s); preprocessing again", key,
                    name, store.uri, exc)
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key or not isinstance(manifest.get("splits"), dict):
        log.warning("preprocess cache entry %s has a manifest that is not one (%s in %s); preprocessing again", key,
                    name, store.uri)
        return None
    return manifest


def mark_used(store: Store, key: str) -> None:
    store.put_bytes(join_key(entry_prefix(key), LAST_USED), json.dumps({"used_unix": time.time()}).encode())
