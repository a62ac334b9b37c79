"""Reused work in words, for the run's report: where its weights started and its half-precision export."""

from __future__ import annotations

from thrifty.numbers import metric
from thrifty.runs.reuse import HalfExport, WarmStart


def warm_start_text(warm: WarmStart) -> str:
    """'run:nightly-20261123:gold (step 450, weights 3f2a…; 12 tensors loaded) — 1,650 steps not trained against
    nightly-20261120 from scratch'."""
    step = f"step {warm.step}, " if warm.step is not None else ""
    what = f"`{warm.source}` ({step}{warm.dtype} weights `{warm.weights_sha256[:12]}…`; {warm.loaded} tensors " \
           f"loaded" + (f", {warm.left_fresh} left fresh" if warm.left_fresh else "") + ")"
    if warm.reference_run is None:
        return what + "; no from-scratch run to compare with in this store"
    reach = (f"needed {warm.reference_steps:,} steps to reach this run's best" if warm.reference_reached else
             f"never reached this run's best in its {warm.reference_steps:,} steps")
    return (f"{what}: {warm.steps_not_trained:,} steps not trained against `{warm.reference_run}`, which trained from "
            f"scratch and {reach}")


def export_text(export: HalfExport) -> str:
    """'fp16: 1.2 MiB (fp32 2.4 MiB, checkpoint 7.1 MiB), val_loss 2.31 vs 2.31 (0.01 % apart)'."""
    mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
    return (f"{export.dtype} `{export.key}`: {mib(export.bytes)} (fp32 {mib(export.fp32_bytes)}, whole checkpoint "
            f"{mib(export.source_bytes)}), sha256 `{export.sha256[:12]}…`; {export.metric} "
            f"{metric(export.half[export.metric])} against {metric(export.full[export.metric])} "
            f"({export.relative_difference:.3%} apart, tolerance {export.tolerance:.2%})")
