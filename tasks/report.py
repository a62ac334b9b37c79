"""Publish the run's Prefect artifacts: summary, attempts, savings by lever, loss-and-spend chart, cross-run table;
and log the run to MLflow when a tracking server is set (``report.mlflow_tracking_uri`` or $MLFLOW_TRACKING_URI)."""

from __future__ import annotations

import logging
import re
import time
import warnings
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import MarkdownArtifact, TableArtifact, create_markdown_artifact, create_table_artifact

from tasks.links import run_flow_runs_link
from thrifty.numbers import amount, metric, money, rounded
from thrifty.report import chart
from thrifty.report import mlflow
from thrifty.report import ends
from thrifty.report import figures as figures_text
from thrifty.report import team
from thrifty.report import utilisation
from thrifty.report.reuse import export_text, warm_start_text
from thrifty.money.budget import spend_usd
from thrifty.money import savings
from thrifty.money.estimate import Estimate
from thrifty.config import ConfigError, RunConfig
from thrifty.config.report import tracking_uri
from thrifty.results import JobOutcome, PrepResult, SmokeResult
from thrifty.money.savings import SavingsReport
from thrifty.money.ledger import Attempt, read_attempts
from thrifty.money.levers import precision_factor
from thrifty.runs import checkpoints, read_metrics
from thrifty.runs.names import run_tag
from thrifty.spot.deadline_run import deadline_moves, describe, market_split, read_record
from thrifty.storage import open_store

SAVINGS_TABLE_KEY = "thrifty-savings"  # the cross-run table every run updates
TEAM_KEY = "thrifty-team"  # this month's spend and savings by tag and by lever, every run's end refreshes it
CHART_ROWS = 12  # rows of the loss-and-spend table under the chart


def artifact_key(run_id: str, kind: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"thrifty-{kind}-{run_id}".lower()).strip("-")


def loss_and_spend_chart(metrics: list[dict[str, Any]], attempts: list[Attempt], max_usd: float | None = None,
                         points: int = CHART_ROWS) -> str:
    """Markdown: the chart (an SVG image) and a table of loss and cumulative spend at up to ``points`` steps."""
    curve = chart.series(metrics, attempts)
    if not curve or not attempts:
        return "_no training metrics recorded_\n"
    resumed = [m["step"] for m in metrics if m.get("event") == "start" and m.get("step", 0) > 0]
    t0 = curve[0].time_unix
    eval_name, evals = chart.eval_curve(metrics)
    lines = [chart.markdown_image(chart.svg(curve, max_usd, resumed, evals, eval_name), "loss and spend over time"), "",
             f"Loss {metric(curve[0].loss)} → {metric(curve[-1].loss)} over {curve[-1].step} steps; "
             f"spend {money(curve[-1].spend_usd)}" + (f" of the ${max_usd:g} budget" if max_usd else "") + ".", "",
             "| minute | step | loss | spend $ |", "|---:|---:|---:|---:|"]
    lines += [f"| {(p.time_unix - t0) / 60:.2f} | {p.step} | {metric(p.loss)} | {amount(p.spend_usd)} |"
              for p in chart.sample(curve, points)]
    return "\n".join(lines) + "\n"


def heading(run_id: str) -> str:
    """The summary's title and the link that lists every flow run of the run (the UI's tags are not links)."""
    return (f"# Run `{run_id}`\n\n[Every flow run of {run_id}]({run_flow_runs_link(run_id)}) (tagged "
            f"`{run_tag(run_id)}`: its first try, its resumes, its reports)\n")


def render_summary(run_id: str, prep: PrepResult | None, smoke: SmokeResult | None, estimate: Estimate | None,
                   job: JobOutcome | None, figures: SavingsReport, attempts: list[Attempt], end: str = "",
                   extra: list[tuple[str, str]] = ()) -> str:
    """The run's end, summary, savings and assumptions; ``attempts`` are the whole run's (every job, resumes
    included); ``extra`` rows follow the attempts (the deadline's). The steps it did not reach (an end before the
    launch) are left out."""
    summary = job.summary if job else None
    best = summary.best_metric if summary else None
    final = summary.final_metrics if summary else {}
    preemptions = sum(1 for a in attempts if a.end_reason == "preempted")
    jobs = len(dict.fromkeys(a.job_id for a in attempts))
    rows = []
    if prep is not None:
        rows.append(("preprocessing cache", f"none ({prep.note})" if prep.note else
                     f"{'hit' if prep.hit else 'miss'} ({prep.seconds:.1f} s, key `{prep.key[:12]}`)"))
        if prep.dedup:
            rows.append(("deduplication", prep.dedup))
    if summary and summary.init_from:
        rows.append(("weights from", warm_start_text(summary.init_from)))
    if summary and summary.half_export:
        rows.append(("half-precision export", export_text(summary.half_export)))
    if smoke is not None:
        rows.append(("smoke test", f"passed: {smoke.steps} steps on CPU, "
                     + ("saved and resumed" if prep is not None and prep.note else smoke.precision_checked)
                     + f", {smoke.cpu_step_time_s:.4f} s/step"))
    if estimate is not None:
        rows.append(("estimate before launch", f"{money(estimate.usd)} (range {money(estimate.low_usd)}-"
                     f"{money(estimate.high_usd)}; see the assumptions below)"))
        if estimate.choice:
            rows.append(("hardware", estimate.choice))
    if job is not None:
        rows.append(("job", f"`{job.job_id}` {job.state.lower()}"))
    rows.append(("attempts", f"{len(attempts)} in {jobs} job(s), {preemptions} preemption(s) survived"
                 + (f", {summary.resumes} resume(s)" if summary else "")))
    rows += list(extra)
    if summary:
        rows += [
            ("steps", f"{summary.steps} of {summary.total_steps} ({summary.epochs:g} epochs)"),
            ("early stop", "yes" if summary.stopped_early else "no"),
            *([(f"best {best.name}", f"{metric(best.value)} at step {best.step}")] if best else []),
            *[(f"final {k}", metric(v)) for k, v in final.items()],
            ("checkpoints written", str(summary.checkpoints_written)),
            ("data-wait fraction", f"{summary.data_wait_fraction:.1%}" if summary.data_wait_fraction is not None
             else "-"),
            ("weights sha256", f"`{summary.weights_sha256[:16]}…`" if summary.weights_sha256 else "-"),
        ]
    rows.append(("cost", f"{money(figures.actual_usd)} (on-demand: {money(figures.on_demand_usd)})"))
    early = figures_text.early_stop_line(figures)
    lines = [
        heading(run_id),
        *([end, ""] if end else []),
        "| item | value |",  # a header row with words: an empty one draws a blank bar in the UI
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "## Savings",
        "",
        f"Actual **{money(figures.actual_usd)}** against **{money(figures.naive_usd)}** for {figures_text.NAIVE}: "
        f"saved {money(figures.saved_usd)} ({figures.saved_fraction:.0%}).",
        "",
        "| lever | saved $ | priced |",
        "|---|---:|---|",
        *[f"| {k.replace('_', ' ')} | {amount(v)} | {basis.partition(':')[0]} |"
          for k, v, basis in figures_text.lever_rows(figures)],
        f"| preemption waste ({figures.preemption_waste.steps} steps) | {amount(-figures.preemption_waste.usd)} "
        "| measured |",
        "",
        "How each lever was priced (the table's cells stay short, so it fits the page):",
        "",
        *[f"- {k.replace('_', ' ')}: {basis}" for k, _, basis in figures_text.lever_rows(figures)],
        "- preemption waste: measured: the steps trained twice (recomputed after a resume), at the run's rate",
        "",
        *([f"Early stopping (not in the figures above): {early}.", ""] if early else []),
        "Assumptions:",
        "",
        *([f"- estimate before launch: {estimate.summary()}"] if estimate is not None else []),
        *[f"- {a}" for a in figures.assumptions],
        "",
    ]
    return "\n".join(lines) + "\n"


def deadline_rows(config: RunConfig, attempts: list[Attempt]) -> list[tuple[str, str]]:
    """Time and dollars on each market; with a deadline, whether it was met and the moves that met it."""
    split = market_split(attempts)
    rows = [("markets", "; ".join(f"{name.replace('_', '-')} {h * 60:.1f} min {money(d)}" for name, (h, d) in split.items()
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


def team_view(all_figures: list[SavingsReport], now_unix: float) -> str:
    """A team lead's page, refreshed at every end: this month's runs by each cost allocation tag they carry, and
    what each lever saved (the sums of the runs' own figures; thrifty.report.team)."""
    month = team.month_of(now_unix)
    runs = team.in_month(all_figures, month)
    total = savings.totals(runs)
    parts = [f"## {month}: {total.runs} run(s) spent {money(total.actual_usd)}, saved {money(total.saved_usd)} "
             f"({total.saved_fraction:.0%}) against {figures_text.NAIVE}", ""]
    for key in sorted({k for f in runs for k in f.tags}):
        parts.append(team.markdown(f"By {key}", team.by_tag(runs, key)))
    parts.append(team.markdown("By lever", team.levers(runs)))
    return "\n".join(parts)


def savings_rows(all_figures: list[SavingsReport]) -> list[dict[str, Any]]:
    """The cross-run table, narrow enough for the UI (the levers are in each run's summary), one row per run whatever
    its end, states named as the README names them, and a total row: the sums of the rows above it."""
    rows = [{"run": f.run_id, "state": ends.state_name(f.state), "spent $": rounded(f.actual_usd),
             "naive $": rounded(f.naive_usd), "saved $": rounded(f.saved_usd), "saved": f"{f.saved_fraction:.0%}",
             "attempts": f.attempts, "assumed": figures_text.assumed_note(f) or "-"} for f in all_figures]
    if rows:
        total = savings.totals(all_figures)
        rows.append({"run": f"total ({total.runs} runs)", "state": "", "spent $": rounded(total.actual_usd),
                     "naive $": rounded(total.naive_usd), "saved $": rounded(total.saved_usd),
                     "saved": f"{total.saved_fraction:.0%}", "attempts": sum(f.attempts for f in all_figures),
                     "assumed": ""})
    return rows


_PUBLISHED: set[str] = set()  # flow runs of this process whose end is reported (the end hooks report the rest)


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def is_published(flow_run_id: Any) -> bool:
    """Whether this flow run's end has been reported already (by the flow itself)."""
    return str(flow_run_id) in _PUBLISHED


def end_kind(config: RunConfig, job: JobOutcome) -> str:
    """The end (thrifty.report.ends) of a launched job."""
    if job.end != "succeeded":
        return job.end
    if job.summary is not None:
        return job.summary.status
    return "rung" if config.train.stop_at_epoch is not None else "completed"


def gold_of(summary: Any) -> str | None:
    """Where a finished run's best weights are, and what they scored."""
    best = summary.best_metric if summary is not None else None
    if best is None or best.checkpoint_step is None or best.value is None:
        return None
    return (f"runs/{summary.run_id}/ckpt/step-{best.checkpoint_step:09d}/ ({best.name} {best.value:.5g} at step "
            f"{best.step})")


def _artifact(kind: str, content: Any, key: str, description: str, flow_run_id: Any = None) -> None:
    """A markdown or table artifact of this flow run; from a hook (no run context) linked to ``flow_run_id``."""
    if flow_run_id is None:
        (create_markdown_artifact if kind == "markdown" else create_table_artifact)(content, key=key,
                                                                                   description=description)
        return
    made = (MarkdownArtifact(markdown=content, key=key, description=description, flow_run_id=flow_run_id)
            if kind == "markdown" else
            TableArtifact(table=content, key=key, description=description, flow_run_id=flow_run_id))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "outside of a flow run": it names its flow run itself
        made.create()


def publish(config: RunConfig, kind: str, message: str = "", job: JobOutcome | None = None,
            prep: PrepResult | None = None, smoke: SmokeResult | None = None,
            estimate: Estimate | None = None, write: bool = True,
            flow_run_id: Any = None) -> tuple[str, SavingsReport | None]:
    """Report an end, however the run got there: ``savings.json`` (when the run has a ledger, and ``write``: an end
    before any launch leaves the figures of the run's last job), the summary artifact opening with the end's
    sentence, the attempts and the cross-run table. Returns the sentence and the figures."""
    run_id = config.run_name
    store = open_store(config.store)
    attempts = read_attempts(store, run_id)  # every job of this run: a resumed run's earlier spend counts
    spent = spend_usd(attempts)
    summary = job.summary if job is not None else None
    figures = None
    if attempts:
        metrics = read_metrics(store, run_id)
        figures = savings.breakdown(run_id, attempts, summary, bool(prep and prep.hit),
                                    prep.cold_seconds if prep else 0.0, metrics, kind,
                                    precision_factor(store, summary, metrics, attempts))
    if kind in ("completed", "stopped_early", "rung") or not ends.says_itself(message, run_id):
        step = job.checkpoint_step if job is not None else None
        detail = message if kind in ("bad_input", "failed", "cancelled", "crashed") else ""
        if kind in ("completed", "stopped_early", "rung") and figures is not None:
            detail = "; ".join(x for x in (f"saved {money(figures.saved_usd)} ({figures.saved_fraction:.0%}) against "
                                           f"{figures_text.NAIVE}", figures_text.early_stop_line(figures)) if x)
        if step is None and attempts:
            saved = checkpoints.committed(store, run_id)
            step = saved[-1].step if saved else None
        message = ends.sentence(kind, run_id, spent, config.budget.max_usd, detail, step, gold_of(summary),
                                launched=write and bool(attempts))
    if figures is not None:
        figures = figures.model_copy(update={"end": message})
        if write:
            savings.write(store, figures)
        curve = loss_and_spend_chart(metrics, attempts, config.budget.max_usd)
        markdown = (render_summary(run_id, prep, smoke, estimate, job, figures, attempts, message,
                                   deadline_rows(config, attempts))
                    + utilisation.section(store, run_id, summary, attempts, figures.actual_usd, config.compute.clouds)
                    + "## Loss and spend\n\n" + curve)
    else:
        markdown = f"{heading(run_id)}{message}\n"
    _artifact("markdown", markdown, artifact_key(run_id, "summary"), f"Thrifty run {run_id}", flow_run_id)
    if attempts:
        _artifact("table", attempt_rows(attempts), artifact_key(run_id, "attempts"),
                  f"Attempts of run {run_id}: every job's, resumes included", flow_run_id)
        every_run = savings.read_all(store)
        _artifact("table", savings_rows(every_run), SAVINGS_TABLE_KEY,
                  f"Savings of every Thrifty run in {store.uri}", flow_run_id)
        _artifact("markdown", team_view(every_run, time.time()), TEAM_KEY,
                  f"This month's spend and savings by tag and by lever in {store.uri}", flow_run_id)
    me = flow_run_id or _flow_run_id()
    to_mlflow(config, kind, message, figures, attempts, metrics if attempts else [], me)
    if me is not None:
        _PUBLISHED.add(str(me))
    return message, figures


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - a hook has no run context: its own logger
        return logging.getLogger("thrifty.report")


def to_mlflow(config: RunConfig, kind: str, end: str, figures: SavingsReport | None, attempts: list[Attempt],
              metrics: list[dict[str, Any]], flow_run_id: Any) -> str | None:
    """Log the run's end to MLflow when a tracking server is set; returns the MLflow run's link. Never raises: a
    server that refuses or does not answer is a warning naming its host (never credentials), the run's end stays."""
    try:
        uri = tracking_uri(config.report)
    except ConfigError as exc:  # checked before anything was rented: the environment changed since
        _logger().warning("run %s is not logged to MLflow: %s", config.run_name, exc)
        return None
    if uri is None:
        return None
    server = mlflow.Server.from_env(uri)
    try:
        from prefect.utilities.urls import url_for

        ident = str(flow_run_id) if flow_run_id is not None else None
        link = mlflow.log_end(server, config, kind, end, figures, attempts, metrics, ident,
                              url_for("flow-run", obj_id=ident) if ident else None)
    except Exception as exc:  # noqa: BLE001 - MLflow informs; it never fails a run
        _logger().warning("could not log run %s to MLflow at %s (%s); the run's end is unaffected", config.run_name,
                          server.host, exc if isinstance(exc, mlflow.MlflowError) else f"{type(exc).__name__}: {exc}"[:300])
        return None
    _logger().info("MLflow: run %s logged at %s", config.run_name, link)
    return link


@task(name="report", retries=0)
def report(config: RunConfig, prep: PrepResult, smoke: SmokeResult, estimate: Estimate,
           job: JobOutcome) -> SavingsReport:
    """Artifacts for the run and the cross-run savings table; returns the savings figures."""
    _, figures = publish(config, end_kind(config, job), job.message, job, prep, smoke, estimate)
    assert figures is not None  # a launched job has a ledger row
    return figures
