"""Weights in half precision as safetensors: cast (each shared storage once, aliases in the metadata) and read back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def to_half(weights: dict[str, torch.Tensor], dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Floating tensors in ``dtype`` (others as they are), each distinct tensor once: (tensors, alias -> name
    written). Tensors equal in dtype, shape and every byte (tied embeddings: a checkpoint's copy no longer shares
    their storage) are one entry, the others named as its aliases: lossless, as they are equal."""
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        ident = (t.dtype, tuple(t.shape), hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).digest())
        if ident in seen:
            aliases[name] = seen[ident]
            continue
        seen[ident] = name
        out[name] = (t.to(TORCH_DTYPES[dtype]) if t.is_floating_point() else t).clone()
    return out, aliases


def load_half(path: str | Path) -> dict[str, torch.Tensor]:
    """An export's tensors by every name the model has (aliases restored), in the export's precision."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata() or {}
    for alias, name in json.loads(meta.get("aliases", "{}")).items():
        tensors[alias] = tensors[name]
    return tensors
