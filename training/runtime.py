"""Process-level plumbing for the loop: distributed setup, device and precision, RNG state, signals."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import signal
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

log = logging.getLogger("thrifty.train")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Dist":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.enabled and not torch_dist.is_initialized():
            torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank (so all ranks stop at the same step)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.enabled and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def pick_device(requested: str, dist: Dist) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            from thrifty.config import ConfigError

            raise ConfigError("'train.device': cuda was asked for but no CUDA GPU is visible; use auto or cpu")
        torch.cuda.set_device(dist.local_rank)
        return torch.device("cuda", dist.local_rank)
    return torch.device("cpu")


def auto_precision(capability: tuple[int, int]) -> str:
    """What ``precision: auto`` picks on a CUDA GPU of this compute capability: bf16 from Ampere (8.0) on, fp16 with
    a GradScaler before it. ``torch.cuda.is_bf16_supported()`` is True on T4 and V100 too, where bf16 is emulated
    and slow, so it cannot decide this."""
    return "bf16" if capability[0] >= 8 else "fp16"


def pick_precision(requested: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if requested == "auto":
        if device.type != "cuda":
            return None  # auto on CPU: bf16 autocast works there but is slower than fp32 for small models
        requested = auto_precision(torch.cuda.get_device_capability(device))
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[requested]


def precision_name(dtype: torch.dtype | None) -> str:
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so ``torch.load(weights_only=True)`` accepts them."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]) + [random.getstate()[0]],
        "python_gauss": random.getstate()[2],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[-1], tuple(py[:-1]), state["python_gauss"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def weights_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """A hash of every tensor's name, dtype, shape and bytes: equal hashes mean bit-identical weights."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_sha256(state: Any) -> str:
    """A hash of the weights a checkpoint holds: its 'model' (or 'state_dict') entry, else every tensor in it."""
    if isinstance(state, dict):
        for key in ("model", "state_dict"):
            if isinstance(state.get(key), dict) and all(isinstance(v, torch.Tensor) for v in state[key].values()):
                return weights_sha256(state[key])
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            tensors[path] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}.{i}")

    walk(state, "")
    return weights_sha256(tensors) if tensors else hashlib.sha256(b"").hexdigest()


class StopSignal:
    """SIGTERM (a spot notice) or SIGINT asks the loop to checkpoint at the next step boundary and exit."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> "StopSignal":
        from training.signals import EARLY

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        if EARLY:  # a notice that came while the program started
            self._handle(EARLY[-1], None)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            log.warning("received %s: saving a checkpoint at the next step boundary, then exiting",
                        signal.Signals(signum).name)
        self.signum = signum
