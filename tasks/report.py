"""Publish the run's Prefect artifacts: summary, attempts, savings by lever, loss-and-spend chart, cross-run table."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from thrifty import savings
from thrifty.estimate import Estimate
from thrifty.config import RunConfig
from thrifty.results import JobOutcome, PrepResult, SmokeResult
from thrifty.savings import SavingsReport
from thrifty.ledger import Attempt, read_attempts
from thrifty.runs import read_metrics
from thrifty.storage import open_store

SAVINGS_TABLE_KEY = "thrifty-savings"  # the cross-run table every run updates
_BARS = "▁▂▃▄▅▆▇█"


def artifact_key(run_id: str, kind: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"thrifty-{kind}-{run_id}".lower()).strip("-")


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return "".join(_BARS[int((v - lo) / (hi - lo) * (len(_BARS) - 1)) if hi > lo else 0] for v in values)


def spend_at(attempts: list[Attempt], t: float) -> float:
    return sum(max(0.0, min(t, a.ended_unix or t) - a.started_unix) / 3600 * a.usd_per_hour * a.nodes
               for a in attempts if a.started_unix <= t)


def loss_and_spend_chart(metrics: list[dict[str, Any]], attempts: list[Attempt], points: int = 12) -> str:
    """A markdown chart: loss and cumulative spend over wall time, sampled at up to ``points`` rows."""
    rows = [m for m in metrics if m.get("event") is None and "loss" in m]
    if not rows or not attempts:
        return "_no training metrics recorded_\n"
    picked = [rows[round(i * (len(rows) - 1) / max(1, points - 1))] for i in range(min(points, len(rows)))]
    t0 = min(a.started_unix for a in attempts)
    losses = [r["loss"] for r in picked]
    spends = [spend_at(attempts, r["time_unix"]) for r in picked]
    lines = [f"loss  `{sparkline(losses)}` {losses[0]:.3f} -> {losses[-1]:.3f}",
             "", f"spend `{sparkline(spends)}` ${spends[0]:.5f} -> ${spends[-1]:.5f}", "",
             "| minute | step | loss | spend $ |", "|---:|---:|---:|---:|"]
    lines += [f"| {(r['time_unix'] - t0) / 60:.2f} | {r['step']} | {r['loss']:.4f} | {s:.5f} |"
              for r, s in zip(picked, spends)]
    return "\n".join(lines) + "\n"


def render_summary(run_id: str, prep: PrepResult, smoke: SmokeResult, estimate: Estimate, job: JobOutcome,
                   figures: SavingsReport) -> str:
    summary = job.summary
    best = summary.best_metric if summary else None
    final = summary.final_metrics if summary else {}
    lev = figures.levers_usd
    lines = [
        f"# Run `{run_id}`",
        "",
        "| | |",
        "|---|---|",
        f"| preprocessing cache | {'hit' if prep.hit else 'miss'} (key `{prep.key}`, {prep.seconds} s) |" if not prep.note
        else f"| preprocessing cache | none ({prep.note}) |",
        f"| smoke test | passed: {smoke.steps} steps on CPU, {smoke.precision_checked} autocast, "
        f"{smoke.cpu_step_time_s} s/step |" if prep.note == "" else
        f"| smoke test | passed: {smoke.steps} steps on CPU, saved and resumed, {smoke.cpu_step_time_s} s/step |",
        f"| estimate before launch | ${estimate.usd:.5f} ({estimate.assumption}) |",
        f"| job | `{job.job_id}` {job.state}: {job.message} |",
        f"| attempts | {len(job.attempts)} ({job.preemptions} preemption(s) survived) |",
        f"| steps | {summary.steps if summary else None} of {summary.total_steps if summary else None} "
        f"({summary.epochs if summary else None} epochs) |",
        f"| early stop | {'yes' if summary and summary.stopped_early else 'no'} |",
        f"| best {best.name if best else None} | {best.value if best else None} at step {best.step if best else None} |",
        *[f"| final {k} | {v:.4f} |" for k, v in final.items()],
        f"| checkpoints written / resumes | {summary.checkpoints_written if summary else None} / "
        f"{summary.resumes if summary else None} |",
        f"| data-wait fraction | {summary.data_wait_fraction if summary else None} |",
        f"| cost | ${figures.actual_usd:.5f} (on-demand: ${figures.on_demand_usd:.5f}) |",
        f"| weights sha256 | `{summary.weights_sha256 if summary else None}` |",
        "",
        "## Savings",
        "",
        f"Actual **${figures.actual_usd:.5f}** against **${figures.naive_usd:.5f}** the naive way: "
        f"saved ${figures.saved_usd:.5f} ({figures.saved_fraction:.0%}).",
        "",
        "| lever | saved $ |",
        "|---|---:|",
        *[f"| {k.replace('_', ' ')} | {v:.5f} |" for k, v in lev.items()],
        f"| preemption waste ({figures.preemption_waste.steps} steps recomputed) | "
        f"-{figures.preemption_waste.usd:.5f} |",
        "",
        *[f"- {a}" for a in figures.assumptions],
        "",
    ]
    return "\n".join(lines) + "\n"


@task(name="report", retries=0)
def report(config: RunConfig, prep: PrepResult, smoke: SmokeResult, estimate: Estimate,
           job: JobOutcome) -> SavingsReport:
    """Artifacts for the run and the cross-run savings table; returns the savings figures."""
    run_id = config.run_name
    store = open_store(config.store)
    metrics = read_metrics(store, run_id)
    attempts = read_attempts(store, run_id)  # every job of this run: a resumed run's earlier spend counts
    state = job.summary.status if job.end == "succeeded" and job.summary else job.end
    figures = savings.breakdown(run_id, attempts, job.summary, prep.hit, prep.cold_seconds, metrics, state)
    savings.write(store, figures)

    chart = loss_and_spend_chart(metrics, attempts)
    markdown = render_summary(run_id, prep, smoke, estimate, job, figures) + "## Loss and spend\n\n" + chart
    create_markdown_artifact(markdown, key=artifact_key(run_id, "summary"), description=f"Thrifty run {run_id}")
    rows = [{"attempt": a.number, "job": a.job_id, "cloud": a.cloud, "region": a.region, "instance": a.instance,
             "spot": a.spot, "usd_per_hour": a.usd_per_hour, "nodes": a.nodes, "minutes": round(a.hours() * 60, 2),
             "usd": round(a.cost_usd(), 6), "end": a.end_reason, "exit_code": a.exit_code}
            for a in attempts]
    create_table_artifact(rows, key=artifact_key(run_id, "attempts"), description=f"Attempts of run {run_id}")
    create_table_artifact(savings.table(savings.read_all(store)), key=SAVINGS_TABLE_KEY,
                          description=f"Savings of every Thrifty run in {store.uri}")
    return figures
