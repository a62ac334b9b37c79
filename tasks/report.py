"""Publish the run's Prefect artifacts: a markdown summary and a table of attempts."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from thrifty.launchers.base import Attempt
from thrifty.pricing import PricingError, find_instance


def artifact_key(run_id: str, kind: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"thrifty-{kind}-{run_id}".lower()).strip("-")


def attempt_costs(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(actual $, what the same instance-hours would have cost on-demand)."""
    attempts = [Attempt(**r) for r in rows]
    actual = sum(a.cost_usd() for a in attempts)
    on_demand = 0.0
    for a in attempts:
        try:
            on_demand += a.hours() * find_instance(a.cloud, a.instance).on_demand_usd_per_hour * a.nodes
        except PricingError:  # not in the table: count it at what was paid
            on_demand += a.cost_usd()
    return actual, on_demand


def render_summary(run_id: str, prep: dict[str, Any], smoke: dict[str, Any], job: dict[str, Any]) -> str:
    summary = job.get("summary") or {}
    actual, on_demand = attempt_costs(job["attempts"])
    best = summary.get("best_metric") or {}
    final = summary.get("final_metrics") or {}
    lines = [
        f"# Run `{run_id}`",
        "",
        "| | |",
        "|---|---|",
        f"| preprocessing cache | {'hit' if prep['hit'] else 'miss'} (key `{prep['key']}`, {prep['seconds']} s) |",
        f"| smoke test | passed: {smoke['steps']} steps on CPU, {smoke['precision_checked']} autocast, "
        f"{smoke['cpu_step_time_s']} s/step |",
        f"| job | `{job['job_id']}` {job['state']} |",
        f"| attempts | {len(job['attempts'])} ({job['preemptions']} preemption(s) survived) |",
        f"| steps | {summary.get('steps')} of {summary.get('total_steps')} ({summary.get('epochs')} epochs) |",
        f"| early stop | {'yes' if summary.get('stopped_early') else 'no'} |",
        f"| best {best.get('name')} | {best.get('value')} at step {best.get('step')} |",
        *[f"| final {k} | {v:.4f} |" for k, v in final.items()],
        f"| checkpoints written / resumes | {summary.get('checkpoints_written')} / {summary.get('resumes')} |",
        f"| data-wait fraction | {summary.get('data_wait_fraction')} |",
        f"| cost | ${actual:.4f} (on-demand: ${on_demand:.4f}, saved ${on_demand - actual:.4f}) |",
        f"| weights sha256 | `{summary.get('weights_sha256')}` |",
    ]
    return "\n".join(lines) + "\n"


@task(name="report", retries=0)
def report(run_id: str, prep: dict[str, Any], smoke: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """Markdown summary + attempts table as Prefect artifacts; returns the figures shown."""
    markdown = render_summary(run_id, prep, smoke, job)
    create_markdown_artifact(markdown, key=artifact_key(run_id, "summary"), description=f"Thrifty run {run_id}")
    rows = [
        {"attempt": a["number"], "cloud": a["cloud"], "region": a["region"], "instance": a["instance"],
         "spot": a["spot"], "usd_per_hour": a["usd_per_hour"], "nodes": a["nodes"],
         "minutes": round(Attempt(**a).hours() * 60, 2),
         "end": a["end_reason"], "exit_code": a["exit_code"]}
        for a in job["attempts"]
    ]
    create_table_artifact(rows, key=artifact_key(run_id, "attempts"), description=f"Attempts of run {run_id}")
    actual, on_demand = attempt_costs(job["attempts"])
    return {"markdown": markdown, "cost_usd": actual, "on_demand_usd": on_demand}
