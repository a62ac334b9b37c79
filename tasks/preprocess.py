"""Preprocess once: raw data -> binary shards in the store, cached by data content + code + params."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

from tasks.errors import BAD_INPUT, fails_quietly
from thrifty.money.budget import world_size
from thrifty.config import ConfigError, RunConfig
from thrifty.results import PrepResult
from thrifty.storage import StoreError, open_store
from thrifty.runs.shards import read_manifest
from training.data import cache_key, ensure_shards
from training.recipes.base import resolve_recipe
from training.validate import check_config, check_data


@dataclass
class ShardCacheKey(CachePolicy):
    """Prefect's cache key = the shard cache's key (raw-data fingerprint + preprocessing source + params) and store.

    No key (so the task runs) when the store lacks the manifest, e.g. after the store was wiped:
    a Prefect cache record must never stand in for shards that are gone. The task's source is
    folded in here rather than by ``+ TASK_SOURCE``: a compound policy drops a member's None and
    would key on the source alone, so any store's old result would be a hit for a store without shards.
    """

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        cfg: RunConfig = inputs["config"]
        recipe = resolve_recipe(cfg.recipe)
        key = cache_key(recipe, recipe.parse_params(cfg.recipe_params), cfg.data)
        store = open_store(cfg.store)
        if read_manifest(store, key) is None:
            return None
        source = TASK_SOURCE.compute_key(task_ctx, inputs, flow_parameters, **kwargs)
        return hash_objects(store.uri, key, source)


def _retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry store hiccups; never a config or data problem, which a retry cannot fix."""
    if state.name == BAD_INPUT:
        return False
    try:
        state.result()
    except (ConfigError, StoreError):  # EmptyDataError too; a store misconfigured stays misconfigured
        return False
    except Exception:
        return True
    return False


@task(name="preprocess", cache_policy=ShardCacheKey(), persist_result=True,
      retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=_retry_transient)
@fails_quietly
def preprocess(config: RunConfig) -> PrepResult:
    """Ensure the run's shards exist in the store; a hit is one manifest read."""
    recipe, params = check_config(config)
    world = world_size(config)
    # a run that cannot train on this data (e.g. micro_batch larger than it) writes nothing: checked before the shards
    result = ensure_shards(open_store(config.store), recipe, params, lambda sizes: check_data(config, sizes, world),
                           dedup=config.data)
    splits = result.manifest["splits"]
    return PrepResult(
        key=result.key,
        hit=result.hit,
        seconds=round(result.seconds, 3),
        cold_seconds=result.manifest.get("preprocess_seconds", 0.0),
        examples={split: arrays[next(iter(arrays))]["shape"][0] for split, arrays in splits.items()},
        bytes=sum(s["bytes"] for arrays in splits.values() for spec in arrays.values() for s in spec["shards"]),
        dedup=f"{config.data.dedup}: {result.manifest['dedup']['summary']}" if "dedup" in result.manifest else "off",
    )
