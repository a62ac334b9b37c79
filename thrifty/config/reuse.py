"""Reuse instead of recompute, as settings: where a run's weights start (``train.init_from``) and the preprocessing
cache's deduplication (the ``data`` section).

``init_from`` forms (parsed by :func:`parse_init_from`): ``previous`` (the newest finished run of the same
schedule, resolved by the flow), ``run:NAME`` with an optional ``:gold`` (default), ``:best``, ``:latest`` or
``:fp16`` / ``:bf16`` (the run's exported half-precision gold weights), or a store URI or path of a checkpoint
directory, its ``state.pt``, or an exported ``.safetensors`` file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from thrifty.config.base import _Frozen, store_scheme

SELECTORS = ("gold", "best", "latest", "fp16", "bf16")
INIT_FROM_HELP = ("init_from must be 'previous', 'run:NAME' (optionally ':gold', ':best', ':latest', ':fp16' or "
                  "':bf16'), or the store URI of a checkpoint directory, its state.pt or an exported .safetensors "
                  "file (e.g. s3://bucket/runs/NAME/ckpt/step-000000120)")
_RUN = re.compile(r"^run:([A-Za-z0-9][A-Za-z0-9_.\-]{0,62})(?::([a-z0-9]+))?$")
NEAR_NUM_PERM = 128  # MinHash permutations: the estimate's standard error is about 1/sqrt(128) = 0.09 of Jaccard


@dataclass(frozen=True)
class InitSource:
    """A parsed ``train.init_from``."""

    kind: Literal["previous", "run", "uri"]
    run: str | None = None  # kind run
    selector: str = "gold"  # kind run: gold | best | latest | fp16 | bf16
    uri: str | None = None  # kind uri

    def describe(self) -> str:
        if self.kind == "run":
            return f"run:{self.run}:{self.selector}"
        return self.uri or "previous"


def parse_init_from(spec: str) -> InitSource:
    """``train.init_from`` as an :class:`InitSource`; ValueError saying the accepted forms."""
    spec = spec.strip()
    if spec == "previous":
        return InitSource("previous")
    if spec.startswith("run:"):
        m = _RUN.match(spec)
        if not m:
            raise ValueError(f"{INIT_FROM_HELP}; a run name is 1-63 letters, digits, '.', '_' or '-'")
        selector = m.group(2) or "gold"
        if selector not in SELECTORS:
            raise ValueError(f"init_from {spec!r}: ':{selector}' is not one of :{', :'.join(SELECTORS)}")
        return InitSource("run", run=m.group(1), selector=selector)
    looks_like_uri = "://" in spec or "/" in spec or spec.endswith((".pt", ".safetensors"))
    if not looks_like_uri:
        raise ValueError(INIT_FROM_HELP)
    store_scheme(spec)  # a scheme no store speaks, or a slash missing, is said now
    return InitSource("uri", uri=spec.rstrip("/"))


class DataConfig(_Frozen):
    """The preprocessing cache's treatment of the recipe's examples (part of the cache key)."""

    dedup: Literal["off", "exact", "near"] = Field(
        "off", description="Remove duplicate examples before the shards are written. off: keep every example. "
        "exact: remove byte-identical examples within and across splits; a training example also found in an "
        "evaluation split is removed from train first (leakage). near: exact, then near-duplicate text examples "
        "(MinHash over token n-grams, Jaccard at least near_threshold). Curated data may need its duplicates: "
        "leave it off then. The manifest records what was removed and why.")
    near_threshold: float = Field(
        0.8, gt=0.0, le=1.0, description="With dedup near: examples whose estimated Jaccard similarity of token "
        "n-grams is at least this are near-duplicates (fraction).")
    near_ngram: int = Field(5, ge=1, le=64, description="With dedup near: tokens per n-gram (shingle) (tokens).")
    text_array: str | None = Field(
        None, description="With dedup near: the array holding each example's text as token ids, one row per "
        "example; null = the split's only integer array with one sequence per row.")

    @model_validator(mode="after")
    def _near_settings_need_near(self) -> "DataConfig":
        if self.dedup != "near" and self.text_array is not None:
            raise ValueError(f"text_array applies to dedup near only (dedup is {self.dedup}); unset it or set "
                             "dedup: near")
        return self

    def cache_part(self) -> dict[str, Any] | None:
        """What of this section shapes the shards (hashed into the cache key); None when dedup is off, so the key
        of an entry written before the setting existed stays the same."""
        if self.dedup == "off":
            return None
        part: dict[str, Any] = {"dedup": self.dedup}
        if self.dedup == "near":
            part.update(threshold=self.near_threshold, ngram=self.near_ngram, text_array=self.text_array,
                        num_perm=NEAR_NUM_PERM)
        return part
