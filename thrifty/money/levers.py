"""What a lever bought, priced from what the store measured instead of from an assumed factor.

Mixed precision: the store's runs of the same model (:func:`thrifty.money.throughput.model_key`) on the same
accelerator, some in the run's half precision and some in fp32, give the speed-up this run's precision bought there.
Without both on record the savings keep their stated assumption (``FP32_SLOWDOWN_ON_GPU``) and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thrifty.money.ledger import Attempt
from thrifty.money.prices import accelerator_of
from thrifty.money.throughput import measured_speeds
from thrifty.runs import RunSummary
from thrifty.storage import Store


@dataclass(frozen=True)
class MeasuredFactor:
    factor: float  # how many times faster the run's setting trained than the baseline's
    basis: str  # where it was measured, in words


def precision_factor(store: Store, summary: RunSummary | None, metrics: list[dict[str, Any]],
                     attempts: list[Attempt]) -> MeasuredFactor | None:
    """The run's half precision against fp32, measured on the accelerator its last attempt ran on; None when the run
    trained in fp32, on a CPU, or the store has no run of this model in both precisions on that accelerator."""
    if summary is None or summary.device != "cuda" or summary.precision not in ("bf16", "fp16") or not attempts:
        return None
    key = next((m.get("model_key") for m in metrics if m.get("event") == "start" and m.get("model_key")), None)
    accelerator = accelerator_of(attempts[-1].cloud, attempts[-1].instance)
    if key is None or accelerator is None:
        return None
    name = accelerator.partition(":")[0]
    fast = measured_speeds(store, key, field="model_key", precision=summary.precision).get(name)
    slow = measured_speeds(store, key, field="model_key", precision="fp32").get(name)
    if fast is None or slow is None or slow.examples_per_s_per_gpu <= 0:
        return None
    factor = fast.examples_per_s_per_gpu / slow.examples_per_s_per_gpu
    return MeasuredFactor(factor, (
        f"measured: {summary.precision} trained {factor:.2f}x as fast as fp32 on {name} ({fast.examples_per_s_per_gpu:.4g} "
        f"vs {slow.examples_per_s_per_gpu:.4g} examples/s per GPU; runs {', '.join(sorted(set(fast.runs + slow.runs)))})"))
