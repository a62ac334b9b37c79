"""Smoke test on CPU before any GPU is rented: a failure here ends the flow run before launch."""

from __future__ import annotations

from prefect import get_run_logger, task

from tasks.errors import fails_quietly
from thrifty.config import RunConfig
from thrifty.results import SmokeResult
from training.smoke import smoke_test


@task(name="smoke-test", retries=0)
@fails_quietly
def smoke(config: RunConfig, steps: int = 5) -> SmokeResult:
    """A few real optimizer steps, an autocast forward and a checkpoint round trip of the real model (script mode:
    the command with a small step limit, saved and resumed)."""
    result = smoke_test(config, steps=steps)
    if result.recipe == "script":
        get_run_logger().info("smoke test passed: the command ran %d steps, saved and resumed; loss %s, %.4f s/step "
                              "on CPU", result.steps, result.losses, result.cpu_step_time_s)
        return result
    get_run_logger().info(
        "smoke test passed: %d steps, loss %s, %.4f s/step on CPU, %s autocast checked, %d parameters",
        result.steps, result.losses, result.cpu_step_time_s, result.precision_checked, result.parameters,
    )
    return result
