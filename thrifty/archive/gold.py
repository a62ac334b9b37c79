"""A run's gold weights, found by name: ``run:NAME:gold|best|latest|fp16|bf16`` (``train.init_from``) and the
checkpoint ``thrifty archive gold --export`` exports. No torch: it names objects; training reads them.

gold = a checkpoint of the run marked gold itself (``thrifty archive gold runs/NAME/ckpt/step-N``; the newest
such), else its best checkpoint (``thrifty.runs.checkpoints.best_checkpoint``: what retention and archival keep
as its gold weights); best = the best checkpoint; latest = the newest complete one; fp16 / bf16 = an export of the
gold checkpoint in that precision, else the newest export in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.archive.plan import Policy
from thrifty.config import ConfigError
from thrifty.runs import checkpoints, run_key
from thrifty.runs.checkpoints import CheckpointInfo
from thrifty.runs.reuse import HALF_DTYPES, HalfExport, read_export
from thrifty.storage import Archived, Store


@dataclass(frozen=True)
class Picked:
    info: CheckpointInfo
    export: HalfExport | None = None  # selector fp16 / bf16: the export to read instead of state.pt


def _no_run(store: Store, run_id: str) -> ConfigError:
    return ConfigError(f"no run {run_id!r} with a complete checkpoint in {store.uri}; check the name (`thrifty report "
                       "--store ...` lists the runs that spent money), or give a store URI")


def gold_checkpoint(store: Store, run_id: str, infos: list[CheckpointInfo] | None = None) -> CheckpointInfo | None:
    """The run's gold weights: its newest checkpoint marked gold on its own, else its best checkpoint."""
    infos = checkpoints.committed(store, run_id) if infos is None else infos
    marks = set(Policy.load(store).gold)
    marked = [c for c in infos if c.prefix + "/" in marks]
    return marked[-1] if marked else checkpoints.best_checkpoint(store, run_id)


def pick(store: Store, run_id: str, selector: str) -> Picked:
    """The checkpoint (or export) ``run:run_id:selector`` names; ConfigError saying what exists instead."""
    infos = checkpoints.committed(store, run_id)
    if not infos:
        raise _no_run(store, run_id)
    if selector == "latest":
        info = infos[-1]
    elif selector in ("gold", "best"):
        info = gold_checkpoint(store, run_id, infos) if selector == "gold" else checkpoints.best_checkpoint(store, run_id)
        if info is None:
            raise ConfigError(f"run {run_id!r} has no checkpoint with a validation metric, so no {selector} weights; "
                              f"use init_from: run:{run_id}:latest")
    elif selector in HALF_DTYPES:
        gold = gold_checkpoint(store, run_id, infos)
        order = ([gold] if gold else []) + [c for c in reversed(infos) if c is not gold]
        cold = sum(1 for c in infos if c.archived)
        for c in order:
            try:
                export = None if c.archived else read_export(store, c.prefix, selector)
            except Archived:
                cold += 1
                continue
            if export is not None:
                return Picked(c, export)
        restore = (f" ({cold} of its checkpoints or exports are archived in cold storage: `thrifty archive restore "
                   f"{run_id} --store {store.uri}` brings them back)" if cold else "")
        raise ConfigError(f"run {run_id!r} has no readable {selector} export{restore}; make one with `thrifty archive "
                          f"gold {run_id} --export {selector} --store {store.uri}`, or use init_from: run:{run_id}:gold")
    else:
        raise ConfigError(f"unknown selector {selector!r}; use gold, best, latest, fp16 or bf16")
    if info.archived:
        raise checkpoints.archived_error(store, run_id, info)
    return Picked(info)


def target_checkpoint(store: Store, target: str) -> tuple[str, CheckpointInfo]:
    """``thrifty archive gold TARGET --export``: a RUN_ID means its gold checkpoint, a ``runs/R/ckpt/step-N`` prefix
    that checkpoint. Returns (run id, checkpoint)."""
    target = target.strip().strip("/")
    if "/" not in target:
        picked = pick(store, target, "gold")
        return target, picked.info
    parsed = checkpoints.parse_key(target + "/")
    if parsed is None:
        raise ConfigError(f"--export needs a run id or a checkpoint (runs/RUN/ckpt/step-000000120), not {target!r}")
    run_id, step, _ = parsed
    found = [c for c in checkpoints.committed(store, run_id) if c.step == step]
    if not found:
        raise ConfigError(f"no complete checkpoint {target} in {store.uri} (the run's checkpoints are under "
                          f"{run_key(run_id, 'ckpt')}/)")
    if found[0].archived:
        raise checkpoints.archived_error(store, run_id, found[0])
    return run_id, found[0]
