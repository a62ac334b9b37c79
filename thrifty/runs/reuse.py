"""What a run records about reused weights: where its weights started (a warm start) and its half-precision export.

A warm start is written once, when it is applied, to ``runs/<run>/init_from.json`` (a resumed job keeps it: the
run's own checkpoints win over ``init_from`` from then on) and copied into the summary at the end, with the
savings reference (the from-scratch run its weights descend from, and the steps that run needed to reach this
run's metric). An export lives beside the checkpoint it was made from: ``ckpt/step-N/weights.fp16.safetensors``
then, written last, its record ``weights.fp16.json``; an export without its record is unfinished and never read.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.storage import NotFound, Store, join_key

INIT_RECORD = "init_from.json"
HALF_DTYPES = ("fp16", "bf16")


def export_file(dtype: str) -> str:
    return f"weights.{dtype}.safetensors"


def export_record_name(dtype: str) -> str:
    return f"weights.{dtype}.json"


EXPORT_RECORD_NAMES = tuple(export_record_name(d) for d in HALF_DTYPES)  # an export's commit record: written last


class WarmStart(BaseModel):
    """Where a run's weights started: ``summary.json``'s ``init_from``."""

    model_config = ConfigDict(frozen=True)

    source: str  # train.init_from as resolved: run:NAME:gold, or a URI
    read: str  # the object the weights were read from (store URI and key)
    run: str | None = None  # the source run, when it is one of this store's
    step: int | None = None  # the source checkpoint's step (an export's: the step it was made from)
    weights_sha256: str  # of the source weights as read (before init_prefixes chose among them)
    format: str  # checkpoint | safetensors
    dtype: str = "fp32"  # fp32, or the export's fp16 / bf16
    prefixes: list[str] = []
    loaded: int  # tensors loaded into the model
    left_fresh: int  # tensors of the model left at their initial values (outside init_prefixes)
    # the savings reference, filled when the run finishes
    reference_run: str | None = None  # the from-scratch run these weights descend from
    reference_steps: int | None = None  # steps it trained to reach this run's best metric (all of them, if never)
    reference_reached: bool | None = None  # False: it never reached it (reference_steps is then a lower bound)
    steps_not_trained: int | None = None  # reference_steps - this run's steps, never below 0


class HalfExport(BaseModel):
    """An export's record (``weights.<dtype>.json``), also ``summary.json``'s ``half_export``."""

    model_config = ConfigDict(frozen=True)

    run: str
    step: int
    dtype: str  # fp16 | bf16
    key: str  # the safetensors object, in the run's store
    bytes: int
    sha256: str
    source_sha256: str  # the checkpoint's state.pt (its COMMIT record's hash)
    source_bytes: int  # the whole checkpoint (optimizer state included)
    fp32_bytes: int  # the same weights in fp32 (what the export halves)
    metric: str  # the metric checked (the run's early-stopping metric)
    full: dict[str, float]  # evaluated with the full weights
    half: dict[str, float]  # evaluated with the exported weights
    relative_difference: float  # |half - full| / |full| of ``metric``
    tolerance: float
    created_unix: float


def write_init_record(store: Store, run_id: str, warm: WarmStart) -> None:
    store.put_bytes(join_key("runs", run_id, INIT_RECORD), warm.model_dump_json(indent=1).encode())


def read_init_record(store: Store, run_id: str) -> WarmStart | None:
    try:
        return WarmStart.model_validate_json(store.get_bytes(join_key("runs", run_id, INIT_RECORD)))
    except (NotFound, ValidationError):
        return None


def read_export(store: Store, ckpt_prefix: str, dtype: str) -> HalfExport | None:
    """The export of one checkpoint in ``dtype``, or None when there is none (or it is unfinished or damaged);
    ``Archived`` when its record is in cold storage."""
    try:
        return HalfExport.model_validate(json.loads(store.get_bytes(join_key(ckpt_prefix, export_record_name(dtype)))))
    except (NotFound, ValidationError, ValueError):
        return None
