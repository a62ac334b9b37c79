"""What each GPU of the price table can do at best: dense peak TFLOPS per precision, and its memory.

Source: NVIDIA's datasheets, dense figures (no 2:4 sparsity), SXM parts where a card comes in several forms;
fp32 is the plain (non-tensor-core) rate, so a run with TF32 matmuls can show an MFU above 1 in fp32. These are
marketing peaks that no real step reaches: an MFU of 0.3-0.5 is good for a transformer (nanoGPT's
``estimate_mfu`` reports against the same kind of figure). The A10G is AWS's A10 variant, at the rate
``thrifty.money.throughput`` uses for it. A GPU without bf16 (T4, V100) has no bf16 peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_tflops: float | None  # None: no bf16 on this GPU
    fp16_tflops: float
    fp32_tflops: float
    memory_gb: float

    def peak_tflops(self, precision: str) -> float | None:
        """The dense peak for ``precision`` (bf16 | fp16 | fp32); None where the GPU lacks it."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}.get(precision)


DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec("T4", None, 65.0, 8.1, 16.0),
    DeviceSpec("L4", 121.0, 121.0, 30.3, 24.0),
    DeviceSpec("A10G", 70.0, 70.0, 31.2, 24.0),
    DeviceSpec("A10", 125.0, 125.0, 31.2, 24.0),
    DeviceSpec("V100", None, 125.0, 15.7, 16.0),
    DeviceSpec("L40S", 362.0, 362.0, 91.6, 48.0),
    DeviceSpec("A100", 312.0, 312.0, 19.5, 40.0),
    DeviceSpec("A100-80GB", 312.0, 312.0, 19.5, 80.0),
    DeviceSpec("H100", 989.0, 989.0, 67.0, 80.0),
    DeviceSpec("H200", 989.0, 989.0, 67.0, 141.0),
)
SOURCE = "NVIDIA datasheets, dense (no sparsity) peaks; fp32 without TF32"


def device_spec(name: str) -> DeviceSpec | None:
    """The spec of a table name ('A10G') or of what CUDA calls the device ('NVIDIA A100-SXM4-80GB', 'Tesla T4');
    None for anything else (a CPU, a GPU the table lacks)."""
    upper = name.upper()
    for spec in sorted(DEVICES, key=lambda s: -len(s.name)):  # A100-80GB before A100, A10G before A10
        base, _, size = spec.name.upper().partition("-")
        # a whole word: 'A10' must not match 'A100' or 'A10G'
        if re.search(rf"(?<![A-Z0-9]){re.escape(base)}(?![A-Z0-9])", upper) and (not size or size in upper):
            return spec
    return None
