"""Publish the run's Prefect artifacts: summary, attempts, savings by lever, loss-and-spend chart, cross-run table."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from thrifty.report import chart
from thrifty.money import savings
from thrifty.money.estimate import Estimate
from thrifty.config import RunConfig
from thrifty.results import JobOutcome, PrepResult, SmokeResult
from thrifty.money.savings import SavingsReport
from thrifty.money.ledger import Attempt, read_attempts
from thrifty.runs import read_metrics
from thrifty.spot.deadline_run import deadline_moves, describe, market_split, read_record
from thrifty.storage import open_store

SAVINGS_TABLE_KEY = "thrifty-savings"  # the cross-run table every run updates
CHART_ROWS = 12  # rows of the loss-and-spend table under the chart


def artifact_key(run_id: str, kind: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"thrifty-{kind}-{run_id}".lower()).strip("-")


def usd(v: float) -> str:
    """Dollars to 5 decimals, never '-0.00000'."""
    text = f"{v:.5f}"
    return text.lstrip("-") if float(text) == 0 else text


def loss_and_spend_chart(metrics: list[dict[str, Any]], attempts: list[Attempt], max_usd: float | None = None,
                         points: int = CHART_ROWS) -> str:
    """Markdown: the chart (an SVG image) and a table of loss and cumulative spend at up to ``points`` steps."""
    curve = chart.series(metrics, attempts)
    if not curve or not attempts:
        return "_no training metrics recorded_\n"
    resumed = [m["step"] for m in metrics if m.get("event") == "start" and m.get("step", 0) > 0]
    t0 = curve[0].time_unix
    lines = [chart.markdown_image(chart.svg(curve, max_usd, resumed), "loss and spend over time"), "",
             f"Loss {curve[0].loss:.3f} → {curve[-1].loss:.3f} over {curve[-1].step} steps; "
             f"spend ${usd(curve[-1].spend_usd)}" + (f" of the ${max_usd:g} budget" if max_usd else "") + ".", "",
             "| minute | step | loss | spend $ |", "|---:|---:|---:|---:|"]
    lines += [f"| {(p.time_unix - t0) / 60:.2f} | {p.step} | {p.loss:.4f} | {usd(p.spend_usd)} |"
              for p in chart.sample(curve, points)]
    return "\n".join(lines) + "\n"


def _metric(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def render_summary(run_id: str, prep: PrepResult, smoke: SmokeResult, estimate: Estimate, job: JobOutcome,
                   figures: SavingsReport, attempts: list[Attempt], extra: list[tuple[str, str]] = ()) -> str:
    """The run's summary, savings and assumptions; ``attempts`` are the whole run's (every job, resumes included);
    ``extra`` rows follow the attempts (the deadline's)."""
    summary = job.summary
    best = summary.best_metric if summary else None
    final = summary.final_metrics if summary else {}
    preemptions = sum(1 for a in attempts if a.end_reason == "preempted")
    jobs = len(dict.fromkeys(a.job_id for a in attempts))
    rows = [
        ("preprocessing cache", f"none ({prep.note})" if prep.note else
         f"{'hit' if prep.hit else 'miss'} ({prep.seconds:.1f} s, key `{prep.key[:12]}`)"),
        ("smoke test", f"passed: {smoke.steps} steps on CPU, "
                       + ("saved and resumed" if prep.note else smoke.precision_checked)
                       + f", {smoke.cpu_step_time_s:.4f} s/step"),
        ("estimate before launch", f"${usd(estimate.usd)} (see the assumptions below)"),
        *([("hardware", estimate.choice)] if estimate.choice else []),
        ("job", f"`{job.job_id}` {job.state.lower()}: {job.message}"),
        ("attempts", f"{len(attempts)} in {jobs} job(s), {preemptions} preemption(s) survived"
                     + (f", {summary.resumes} resume(s)" if summary else "")),
        *extra,
    ]
    if summary:
        rows += [
            ("steps", f"{summary.steps} of {summary.total_steps} ({summary.epochs:g} epochs)"),
            ("early stop", "yes" if summary.stopped_early else "no"),
            *([(f"best {best.name}", f"{_metric(best.value)} at step {best.step}")] if best else []),
            *[(f"final {k}", _metric(v)) for k, v in final.items()],
            ("checkpoints written", str(summary.checkpoints_written)),
            ("data-wait fraction", f"{summary.data_wait_fraction:.1%}" if summary.data_wait_fraction is not None
             else "-"),
            ("weights sha256", f"`{summary.weights_sha256[:16]}…`" if summary.weights_sha256 else "-"),
        ]
    rows.append(("cost", f"${usd(figures.actual_usd)} (on-demand: ${usd(figures.on_demand_usd)})"))
    lines = [
        f"# Run `{run_id}`",
        "",
        "| item | value |",  # a header row with words: an empty one draws a blank bar in the UI
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "## Savings",
        "",
        f"Actual **${usd(figures.actual_usd)}** against **${usd(figures.naive_usd)}** the naive way: "
        f"saved ${usd(figures.saved_usd)} ({figures.saved_fraction:.0%}).",
        "",
        "| lever | saved $ |",
        "|---|---:|",
        *[f"| {k.replace('_', ' ')} | {usd(v)} |" for k, v in figures.levers_usd.items()],
        f"| preemption waste ({figures.preemption_waste.steps} steps recomputed) | "
        f"{usd(-figures.preemption_waste.usd)} |",
        "",
        "Assumptions:",
        "",
        f"- estimate before launch: {estimate.assumption}",
        *[f"- {a}" for a in figures.assumptions],
        "",
    ]
    return "\n".join(lines) + "\n"


def deadline_rows(config: RunConfig, attempts: list[Attempt]) -> list[tuple[str, str]]:
    """Time and dollars on each market; with a deadline, whether it was met and the moves that met it."""
    split = market_split(attempts)
    rows = [("markets", "; ".join(f"{name.replace('_', '-')} {h * 60:.1f} min ${usd(d)}" for name, (h, d) in split.items()
                                  if h > 0) or "-")]
    record = read_record(open_store(config.store), config.run_name) if deadline_moves(config) else None
    if record is not None:
        done = [a.ended_unix for a in attempts if a.end_reason == "succeeded" and a.ended_unix is not None]
        rows.append(("deadline", describe(record, max(done) if done else None)))
    return rows


def attempt_rows(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """The attempts table: few, short columns, so it fits the UI without scrolling sideways."""
    return [{"attempt": a.number, "instance": f"{a.cloud} {a.instance}" + (f" x{a.nodes}" if a.nodes > 1 else ""),
             "spot": "spot" if a.spot else "on-demand", "$/h": round(a.usd_per_hour, 4),
             "minutes": round(a.hours() * 60, 2), "usd": round(a.cost_usd(), 5),
             "end": a.end_reason or "running", "exit": a.exit_code} for a in attempts]


def savings_rows(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """The cross-run table, narrow enough for the UI: the levers are in each run's summary."""
    return [{"run": f.run_id, "state": f.state, "spent $": round(f.actual_usd, 5), "naive $": round(f.naive_usd, 5),
             "saved": f"{f.saved_fraction:.0%}", "attempts": f.attempts} for f in all_figures]


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

    curve = loss_and_spend_chart(metrics, attempts, config.budget.max_usd)
    markdown = (render_summary(run_id, prep, smoke, estimate, job, figures, attempts, deadline_rows(config, attempts))
                + "## Loss and spend\n\n" + curve)
    create_markdown_artifact(markdown, key=artifact_key(run_id, "summary"), description=f"Thrifty run {run_id}")
    create_table_artifact(attempt_rows(attempts), key=artifact_key(run_id, "attempts"),
                          description=f"Attempts of run {run_id}: every job's, resumes included")
    create_table_artifact(savings_rows(savings.read_all(store)), key=SAVINGS_TABLE_KEY,
                          description=f"Savings of every Thrifty run in {store.uri}")
    return figures
