"""The search's end: the winner's weights marked gold, and the leaderboard and metric-against-spend artifacts."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks.report import artifact_key
from thrifty.numbers import amount, cut, metric as fmt_metric, pairs
from thrifty import archive
from thrifty.runs import checkpoints
from thrifty.report.chart import markdown_image, spend_at
from thrifty.money.ledger import read_attempts
from thrifty.runs import read_metrics
from thrifty.storage import Store, open_store
from thrifty.sweep import SweepConfig, SweepState, TrialState, leader
from thrifty.sweep.state import rung_step
from thrifty.sweep.report import ChartPoint, SweepResult, leaderboard, saving, svg


def gold_step(store: Store, config: SweepConfig, best: TrialState) -> int | None:
    """The step of the weights that scored ``best``'s reported metric: its finished run's best (or final) checkpoint,
    else the checkpoint its job wrote at the milestone it reached."""
    if best.status == "finished":
        return best.result_step
    return rung_step(read_metrics(store, best.run_name), best.reached)


def mark_gold(store: Store, config: SweepConfig, best: TrialState) -> str | None:
    """Mark the weights that scored the winner's metric gold in ``archive-policy.json`` (what `thrifty archive gold`
    writes); None when no committed checkpoint holds them."""
    step = gold_step(store, config, best)
    if step is None or step not in {c.step for c in checkpoints.committed(store, best.run_name)}:
        return None
    prefix = archive.mark_prefix(checkpoints.step_prefix(best.run_name, step))
    policy = archive.Policy.load(store)
    if prefix not in policy.gold:
        policy.gold.append(prefix)
        policy.save(store)
    return prefix


def chart_points(store: Store, config: SweepConfig, trials: list[TrialState]) -> list[ChartPoint]:
    """Every milestone result with the search's cumulative spend at the moment it came in."""
    ledgers = {t.run_name: read_attempts(store, t.run_name) for t in trials if t.launches or t.reached}
    points = []
    for t in trials:
        if t.run_name not in ledgers:
            continue
        for rec in read_metrics(store, t.run_name):
            event = rec.get("event")
            epochs = rec.get("epoch") if event == "rung" else t.reached if event == "end" else None
            value = t.ranking_value() if event == "end" else t.score(epochs) if epochs else None
            if value is not None:
                when = float(rec.get("time_unix", 0.0))
                points.append(ChartPoint(sum(spend_at(a, when) for a in ledgers.values()), value,
                                         f"{t.run_name} epoch {epochs}: {value:.4f}"))
    return points


def no_best(trials: list[TrialState], mode: str, metric: str) -> str:
    ahead = leader(trials, mode)
    if ahead is None:
        return "**Best**: none (no trial reached a milestone)"
    return (f"**Best**: none: no trial trained to its end. {ahead.run_name} ({pairs(ahead.values)}) leads at epoch "
            f"{ahead.reached} ({metric} {fmt_metric(ahead.ranking_value())}); start the search again with larger caps "
            "to train it on.")


def shown(row: dict) -> dict:
    """A leaderboard row as the table artifact shows it: dollars and metrics to 4 significant digits, the note cut to
    fit its column (the flow's result keeps the full row)."""
    return {k: cut(v) if k == "note" else amount(v) if k.endswith("$") and v is not None
            else fmt_metric(v) if isinstance(v, float) else v for k, v in row.items()}


@task(name="sweep-report", retries=0)
def sweep_report(config: SweepConfig, state: SweepState, gold: str | None) -> SweepResult:
    """The leaderboard (a table artifact) and the summary with the metric-against-spend chart (markdown)."""
    store = open_store(config.base.store)
    trials, metric, mode = state.trials, config.rank_metric, config.rank_mode
    rows = leaderboard(trials, mode, metric)
    money = saving(trials, config.full_epochs)
    best = next((t for t in trials if t.index == state.best), None)
    create_table_artifact([shown(r) for r in rows], key=artifact_key(config.name, "sweep"),
                          description=f"Sweep {config.name}: trials by rung reached and {metric}")
    lines = [f"# Sweep {config.name}", "",
             f"**Best**: {best.run_name} ({pairs(best.values)}): {metric} {fmt_metric(best.ranking_value())} (trained to its "
             f"end, epoch {best.reached}); gold weights `{gold}`" if best else no_best(trials, mode, metric), "",
             f"Spent ${amount(money.spent_usd)} of the ${config.max_usd:g} cap; training all {money.trials} trials it "
             f"drew (paused, refused and never run ones too) to {config.full_epochs} epochs would have cost "
             f"~${amount(money.full_usd)}: the search saved {money.saved_fraction:.0%}.", "",
             markdown_image(svg(chart_points(store, config, trials), mode, metric, config.max_usd),
                            f"{metric} against the search's spend"), "",
             "| trial | values | epochs | " + metric + " | cost $ | state | note |", "|---|---|---:|---:|---:|---|---|"]
    lines += [f"| {r['trial']} | {pairs(t.values)} | {r['epochs']} | "
              f"{fmt_metric(r[metric])} | {amount(r['cost $'])} | {r['state']} | {cut(r['note'])} |"
              for r, t in ((r, next(x for x in trials if x.run_name == r["trial"])) for r in rows)]
    lines += ["", "Decisions:", ""] + [f"- {d}" for d in state.decisions[-60:]]
    create_markdown_artifact("\n".join(lines) + "\n", key=artifact_key(config.name, "sweep-summary"),
                             description=f"Sweep {config.name}: the best config, spend, saving, chart")
    return SweepResult(name=config.name, metric=metric, mode=mode, best_run=best.run_name if best else None,
                       best_values=best.values if best else {}, best_value=best.ranking_value() if best else None,
                       best_epochs=best.reached if best else 0,
                       best_config=config.trial(best.index).model_dump(mode="json") if best else None, gold=gold,
                       spent_usd=money.spent_usd, max_usd=config.max_usd, full_usd=money.full_usd,
                       saved_fraction=money.saved_fraction, leaderboard=rows)
