"""Warm starts (``train.init_from``): a run's weights start from another run's checkpoint or exported weights.

Weights only: the optimizer, LR schedule and step count start fresh, and only when the run has no checkpoint
of its own (a resumed job continues from its own). The source is read whole and checked against its commit
record (a checkpoint's COMMIT, an export's record); ``init_prefixes`` load only the parameters under them. Every
shape is checked first and a mismatch is a ConfigError naming it: the smoke test runs the same check before
anything is rented. The checkpoint's evaluated weights are read: its EMA when it kept one, else its model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from thrifty.archive.gold import pick
from thrifty.config import ConfigError, RunConfig
from thrifty.config.reuse import parse_init_from
from thrifty.runs import checkpoints as layout
from thrifty.runs.lineage import resolve_previous, with_reference
from thrifty.runs.reuse import HalfExport, WarmStart, read_init_record, write_init_record
from thrifty.storage import Archived, NotFound, Store, join_key, open_store
from training.half import load_half
from training.runtime import weights_sha256

log = logging.getLogger("thrifty.train")

_RUN_KEY = re.compile(r"(?:^|/)runs/([^/]+)/ckpt/step-(\d{9})(?:/|$)")
SHOWN = 4  # mismatches named in an error (the rest counted)


@dataclass(frozen=True)
class Source:
    """One object to read weights from, and what it must hash to."""

    store: Store
    key: str
    format: str  # checkpoint | safetensors
    described: str  # train.init_from as resolved
    run: str | None  # a run of the run's own store
    step: int | None
    sha256: str | None  # from the commit or export record: the object must match it
    dtype: str = "fp32"

    @property
    def where(self) -> str:
        return f"{self.store.uri.rstrip('/')}/{self.key}"


def locate(store: Store, cfg: RunConfig) -> Source:
    """The object ``cfg.train.init_from`` names (``previous`` resolved first)."""
    if cfg.train.init_from == "previous":  # by hand: the flow resolves it before a node sees it
        cfg, said = resolve_previous(store, cfg)
        log.info("warm start: %s", said)
        if cfg.train.init_from is None:
            raise _Scratch()
    spec = parse_init_from(cfg.train.init_from)
    if spec.kind == "run":
        picked = pick(store, spec.run, spec.selector)
        if picked.export is not None:
            e = picked.export
            return Source(store, e.key, "safetensors", spec.describe(), spec.run, e.step, e.sha256, e.dtype)
        info = picked.info
        return Source(store, join_key(info.prefix, layout.STATE), "checkpoint", spec.describe(), spec.run, info.step,
                      info.commit.get("sha256"))
    uri = spec.uri
    m = _RUN_KEY.search(uri)
    run, step = (m.group(1), int(m.group(2))) if m else (None, None)
    run = run if _in_store(uri, store) else None  # a run of another store: no savings reference
    if uri.endswith((".safetensors", ".pt")):
        parent, _, name = uri.rpartition("/")
        src_store = open_store(parent or ".")
        fmt = "safetensors" if name.endswith(".safetensors") else "checkpoint"
        sha = _export_sha(src_store, name) if fmt == "safetensors" else _commit_sha(src_store)
        dtype = name.split(".")[-2] if fmt == "safetensors" and name.count(".") >= 2 else "fp32"
        return Source(src_store, name, fmt, uri, run, step, sha, dtype)
    src_store = open_store(uri)  # a checkpoint directory
    return Source(src_store, layout.STATE, "checkpoint", uri, run, step, _commit_sha(src_store, required=True))


def _in_store(uri: str, store: Store) -> bool:
    if store.uri.startswith("file://") and (uri.startswith("file://") or "://" not in uri):
        return Path(uri.removeprefix("file://")).resolve().is_relative_to(Path(store.uri.removeprefix("file://")))
    return uri.startswith(store.uri.rstrip("/") + "/")


class _Scratch(Exception):
    """``init_from: previous`` on a schedule's first run: nothing to start from."""


def _commit_sha(store: Store, required: bool = False) -> str | None:
    try:
        return json.loads(store.get_bytes(layout.COMMIT)).get("sha256")
    except NotFound:
        if required:
            raise ConfigError(f"'train.init_from': {store.uri} holds no complete checkpoint (no {layout.COMMIT} "
                              "record); give a checkpoint directory like .../runs/NAME/ckpt/step-000000120") from None
        return None
    except Archived:
        raise ConfigError(f"'train.init_from': the checkpoint in {store.uri} is archived in cold storage; restore "
                          "it first (`thrifty archive restore RUN --store ...`)") from None


def _export_sha(store: Store, name: str) -> str | None:
    try:
        return HalfExport.model_validate_json(store.get_bytes(name.replace(".safetensors", ".json"))).sha256
    except Exception:  # noqa: BLE001 - a file exported elsewhere has no record: read as it is
        return None


@contextlib.contextmanager
def _local(src: Source) -> Iterator[Path]:
    """The object as a local file, its hash checked against its record when there is one."""
    path = src.store.local_path(src.key)
    with tempfile.TemporaryDirectory(prefix="thrifty-init-") as tmp:
        try:
            if path is None or not path.is_file():
                if path is not None:
                    src.store.get_bytes(src.key)  # NotFound or Archived, as the object stores say it
                path = Path(tmp) / "weights"
                src.store.get_file(src.key, path)
        except NotFound:
            raise ConfigError(f"'train.init_from': {src.described} names {src.where}, which does not exist") from None
        except Archived:
            raise ConfigError(f"'train.init_from': {src.where} is archived in cold storage; restore it first "
                              f"(`thrifty archive restore {src.run or 'RUN'} --store {src.store.uri}`)") from None
        if src.sha256 is not None and _sha256(path) != src.sha256:
            raise ConfigError(f"'train.init_from': {src.where} does not match the sha256 its record names (damaged or "
                              "changed since); pick another checkpoint")
        yield path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plain_keys(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as the uncompiled, unwrapped model names them (no ``_orig_mod.`` of torch.compile, ``module.`` of DDP)."""
    return {k.replace("_orig_mod.", "").removeprefix("module."): v for k, v in weights.items()}


def evaluated_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint evaluated: its EMA's when it kept one (what scored its metric), else its model's."""
    ema = state.get("ema")
    if ema:
        return plain_keys({k: v for k, v in ema.items() if k.startswith("module.")})
    return plain_keys(state["model"])


def read_state(src: Source) -> dict[str, Any]:
    """A checkpoint's whole state (CPU), checked against its commit record."""
    with _local(src) as path:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - not a checkpoint torch can read
            raise ConfigError(f"'train.init_from': {src.where} is not a checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise ConfigError(f"'train.init_from': {src.where} holds no model weights (no 'model' entry)")
    return state


def read_weights(src: Source) -> dict[str, torch.Tensor]:
    """The source's weights on CPU (an export's in its half precision)."""
    if src.format == "safetensors":
        with _local(src) as path:
            return load_half(path)
    return evaluated_weights(read_state(src))


def choose(weights: dict[str, torch.Tensor], target: dict[str, torch.Tensor], prefixes: list[str],
           source: str) -> dict[str, torch.Tensor]:
    """The tensors to load: every one of the model's (under ``prefixes``), each present with the same shape."""
    under = (lambda k: any(k.startswith(p) for p in prefixes)) if prefixes else (lambda k: True)
    for p in prefixes:
        if not any(k.startswith(p) for k in target):
            tops = sorted({k.split(".")[0] + "." for k in target})
            raise ConfigError(f"'train.init_prefixes': {p!r} matches no parameter of this model; its names start with "
                              f"{', '.join(tops)}")
    wanted = [k for k in target if under(k)]
    problems = [f"{k} is missing there" for k in wanted if k not in weights]
    problems += [f"{k} is {list(weights[k].shape)} there and {list(target[k].shape)} here" for k in wanted
                 if k in weights and weights[k].shape != target[k].shape]
    problems += [f"{k} is there but not in this model" for k in weights if k not in target and under(k)]
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise ConfigError(
            f"'train.init_from': the weights of {source} do not fit this model: {'; '.join(problems[:SHOWN])}{more}. "
            "Use the source's recipe_params, or load only the parts that fit with train.init_prefixes (e.g. "
            "['blocks.'] for a backbone under a new head)")
    return {k: weights[k] for k in wanted}


def load_into(store: Store, cfg: RunConfig, model: torch.nn.Module) -> WarmStart | None:
    """Read ``init_from``'s weights, check every shape against ``model`` and load them (None: nothing to start
    from, a schedule's first run). ConfigError names a mismatch before anything changes."""
    try:
        src = locate(store, cfg)
    except _Scratch:
        return None
    weights = read_weights(src)
    target = getattr(model, "_orig_mod", model)  # a compiled model's own module
    chosen = choose(weights, target.state_dict(), cfg.train.init_prefixes, src.described)
    missing, unexpected = target.load_state_dict(chosen, strict=False)
    assert not unexpected, unexpected  # choose() refused these already
    return WarmStart(source=src.described, read=src.where, run=src.run, step=src.step,
                     weights_sha256=weights_sha256(weights), format=src.format, dtype=src.dtype,
                     prefixes=list(cfg.train.init_prefixes), loaded=len(chosen), left_fresh=len(missing))


def apply(store: Store, cfg: RunConfig, model: torch.nn.Module, ema: Any = None, record: bool = True) -> WarmStart | None:
    """The loop's warm start, for a run with no checkpoint of its own: load the weights (the EMA starts from them
    too) and keep where they came from in ``runs/<run>/init_from.json`` (``record``: rank 0)."""
    warm = load_into(store, cfg, model)
    if warm is None:
        return None
    if ema is not None:
        ema.module.load_state_dict(getattr(model, "_orig_mod", model).state_dict())
    log.info("warm start from %s (%s, step %s, weights %s…): %d tensors loaded, %d left fresh; optimizer and schedule "
             "start fresh", warm.source, warm.read, warm.step, warm.weights_sha256[:12], warm.loaded, warm.left_fresh)
    if record:
        write_init_record(store, cfg.run_name, warm)
    return warm


def summary_record(store: Store, cfg: RunConfig, steps: int, best_value: float | None) -> WarmStart | None:
    """The summary's ``init_from``: the run's warm start with its savings reference (None: it trained from
    scratch)."""
    warm = read_init_record(store, cfg.run_name)
    if warm is None:
        return None
    es = cfg.train.early_stopping
    return with_reference(store, warm, steps, es.metric, es.mode, best_value)
